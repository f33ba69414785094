// FramedConnection: the client side of a framed RPC connection (frame_stream.h; kvmaster's
// --framed-listen, docs/protocol.md "Framed RPC"), non-blocking, for a thread that polls its fd
// among others (the agent's master link) or waits on it alone (Call, for tools and benchmarks).
//
// Requests are queued by Send and written as the socket takes them; replies come out of OnReady
// in the order they arrive. With a key (FramedRpcKey of the cluster secret) the connection speaks
// version 2 of the wire (frame_cipher.h): it checks that the server holds the same secret, and
// seals and opens every frame; requests sent before the handshake is done wait for it. Any failure
// (the connect refused, the peer gone, a stream that is not the protocol, a reply over max_reply
// bytes) is returned once as a Status, after which the connection is dead: the owner drops it and
// connects anew.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvagent/common/frame_cipher.h"
#include "kvagent/common/frame_stream.h"
#include "kvagent/common/status.h"
#include "kvagent/common/unique_fd.h"

namespace kvagent {

class FramedConnection {
 public:
  using ReplyFn = std::function<void(std::span<const uint8_t> reply)>;

  // Starts connecting to tcp://HOST:PORT (INVALID_PARAMS for a malformed endpoint); with `key`,
  // the encrypted wire.
  static Result<FramedConnection> Connect(const std::string& endpoint, size_t max_reply,
                                          const std::optional<SymmetricKey>& key = std::nullopt);

  int fd() const { return fd_.get(); }
  // What to poll for: POLLIN, and POLLOUT while connecting or while bytes wait to be written.
  short events() const;
  // True once the peer's hello arrived (and, encrypted, the handshake is done): the connection
  // speaks the protocol.
  bool established() const { return established_; }

  // Queues one request frame.
  void Send(std::span<const uint8_t> request);
  // Bytes queued and not yet written (with those waiting for the handshake).
  size_t queued() const { return out_.queued() + unsealed_bytes_; }
  // Writes what the socket takes of the queued bytes now (nothing while still connecting). Not
  // OK: the connection is dead (OnReady says so again).
  Status Flush();
  // After poll() reported `revents`: completes the connect, writes, reads, and calls `on_reply`
  // for each complete reply (valid during the call). Not OK: the connection is dead (why).
  Status OnReady(short revents, const ReplyFn& on_reply);

  // Sends `request` and waits for one reply until `timeout` (tools and benchmarks; the
  // connection must have no other call in flight). TIMEOUT, or the connection's failure.
  Result<std::vector<uint8_t>> Call(std::span<const uint8_t> request,
                                    std::chrono::milliseconds timeout);

  FramedConnection(FramedConnection&&) noexcept = default;
  FramedConnection& operator=(FramedConnection&&) noexcept = default;

 private:
  FramedConnection(UniqueFd fd, std::string endpoint, size_t max_reply,
                   const std::optional<SymmetricKey>& key);
  Status Write();
  // Encrypted: once the server's hello is in, checks it and seals what waited for the keys.
  Status FinishHandshake();

  UniqueFd fd_;
  std::string endpoint_;
  FrameReader in_;
  OutgoingBytes out_;  // our hello, then the requests
  bool connecting_ = true;
  bool established_ = false;
  // Encrypted: the handshake until it is done, then the two directions' keys.
  std::unique_ptr<FramedClientHandshake> handshake_;
  std::optional<FrameSealer> sealer_;
  std::optional<FrameOpener> opener_;
  std::vector<std::vector<uint8_t>> unsealed_;  // requests sent before the handshake ended
  size_t unsealed_bytes_ = 0;
};

}  // namespace kvagent

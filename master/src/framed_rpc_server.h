// FramedRpcServer: kvmaster's framed RPC transport (docs/protocol.md, "Framed RPC"), served on
// the master loop's own thread. The same master.fbs requests and replies as on the ROUTER, as
// length-prefixed frames on a plain TCP connection (common/frame_stream.h): no I/O thread between
// the socket and the service, so a request costs the loop one read() and its reply one write()
// (shared by every request and reply that arrive or leave together), against the ZMQ ROUTER's
// hand-offs to and from its I/O thread.
//
// With a key (the cluster secret's FramedRpcKey) every connection speaks version 2 of the wire
// (common/frame_cipher.h): a handshake that proves both ends hold the secret, then sealed
// frames; a connection whose frame does not open (its client holds another secret, or none) is
// closed and counted. Without one, neither encrypted nor authenticated: kvmaster serves it then
// only on the endpoints the ROUTER may use without a secret (loopback, or --insecure-no-auth).
//
// Bounds: at most max_connections connections (more are accepted and closed at once); a request
// frame of at most kMaxMasterRequestBytes; replies waiting for a connection that does not read
// them at most max_queued_bytes (beyond: the connection is closed). A connection whose stream is
// not the protocol (a bad hello, an oversized frame) is closed and counted. Before a connection
// has proved itself (its hello read; with a key, its first frame opened: it holds the secret) it
// may hold no more than a frame of max_unproven_frame_bytes, and it must prove itself within
// handshake_timeout_ms (ExpireUnproven closes it after): a peer without the secret can neither
// pin the 64 MiB of a request per connection nor keep the connection slots from the agents.
#pragma once

#include <poll.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/frame_cipher.h"
#include "kvagent/common/frame_stream.h"
#include "kvagent/common/status.h"
#include "kvagent/common/unique_fd.h"

namespace kvagent::master {

struct FramedRpcServerOptions {
  std::string listen;  // tcp://HOST:PORT
  size_t max_connections = 4096;
  size_t max_request_bytes = 0;  // 0: kMaxMasterRequestBytes
  size_t max_queued_bytes = size_t{512} << 20;
  std::optional<SymmetricKey> key;  // encrypted and authenticated (version 2) when set
  // The first frame of a connection with a key (an agent's is a RegisterAgent: < 1 KiB).
  size_t max_unproven_frame_bytes = size_t{64} << 10;
  int64_t handshake_timeout_ms = 10000;
};

struct FramedRpcStats {
  uint64_t connections = 0;  // open now
  uint64_t accepted = 0;
  uint64_t refused = 0;             // over max_connections
  uint64_t bad_streams = 0;         // closed: not the protocol, or a frame over the limit
  uint64_t slow_readers = 0;        // closed: their replies exceeded max_queued_bytes
  uint64_t unauthenticated = 0;     // closed: a frame that did not open (another secret, or none)
  uint64_t handshake_timeouts = 0;  // closed: not proved within handshake_timeout_ms
};

class FramedRpcServer {
 public:
  // A connection's id, never reused while the server lives (0: none).
  using ConnectionId = uint64_t;
  using RequestFn = std::function<void(ConnectionId, std::span<const uint8_t> request)>;

  static Result<std::unique_ptr<FramedRpcServer>> Listen(const FramedRpcServerOptions& options);

  const std::string& endpoint() const { return endpoint_; }

  // Appends what poll() should watch: the listener and every connection (POLLOUT while replies
  // wait). Serve takes the same entries back after the poll.
  void AppendPollFds(std::vector<pollfd>* fds);

  // After poll(): accepts, reads, and calls `on_request` for every complete request (its bytes
  // valid during the call; Reply may be called from it); closes broken connections. `ready`: the
  // entries AppendPollFds added, in the same order. Reads at most `budget` requests, then
  // returns (the rest stay buffered: HasBuffered). Returns the requests handled.
  size_t Serve(std::span<const pollfd> ready, const RequestFn& on_request, size_t budget);

  // Requests already read but not yet handled (Serve returned at its budget).
  bool HasBuffered() const { return buffered_ > 0; }

  // Queues `reply` for `conn` (dropped when it has gone); Flush writes.
  void Reply(ConnectionId conn, std::span<const uint8_t> reply);
  // Writes what the sockets take of the queued replies.
  void Flush();

  // Closes the connections that did not prove themselves within handshake_timeout_ms of being
  // accepted (call it every so often: the master loop does at each tick). O(1) per connection.
  void ExpireUnproven();

  FramedRpcStats stats() const;

  // HOST:PORT of the client of `conn` ("" when it has gone).
  std::string PeerAddress(ConnectionId conn) const;

 private:
  struct Connection {
    UniqueFd fd;
    FrameReader in;
    OutgoingBytes out;            // our hello, then the replies
    bool frames_waiting = false;  // complete frames may be buffered (the budget ran out)
    // Encrypted: set once the client's hello is answered.
    std::optional<FrameSealer> sealer;
    std::optional<FrameOpener> opener;
    bool proven = false;  // its hello read (and, with a key, a frame of it opened)
  };

  explicit FramedRpcServer(const FramedRpcServerOptions& options) : options_(options) {}
  void Accept();
  // Reads what the socket has; hands out up to `budget` frames. False: the connection must go.
  bool ReadFrom(ConnectionId id, Connection& c, const RequestFn& on_request, size_t budget,
                size_t* handled);
  bool Drain(ConnectionId id, Connection& c, const RequestFn& on_request, size_t budget,
             size_t* handled);
  bool WriteTo(Connection& c);
  // Encrypted: answers the client's hello (in c.in) and keeps the session keys. False: the
  // connection must go.
  bool Answer(Connection& c);
  void Close(ConnectionId id);

  FramedRpcServerOptions options_;
  std::string endpoint_;
  UniqueFd listener_;
  std::unordered_map<ConnectionId, Connection> connections_;
  std::vector<ConnectionId> polled_;  // the connections AppendPollFds listed, in order
  std::vector<ConnectionId> closing_;
  ConnectionId next_id_ = 1;
  size_t buffered_ = 0;  // connections with frames_waiting
  // The connections not proved yet, in the order accepted, with their deadlines (steady ms).
  std::deque<std::pair<int64_t, ConnectionId>> unproven_;
  FramedRpcStats stats_;
};

}  // namespace kvagent::master

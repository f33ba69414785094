// TcpDataClient: the client side of the TCP data plane (protocol in tcp_wire.h). Runs on the
// engine's EventLoop thread. One pooled connection per peer endpoint; a batch's ops to that
// peer are pipelined on it (many requests in flight, replies in order), small requests are
// gathered into one sendmsg, payloads go from and to the caller's memory without a copy.
//
// Failure handling: a connection that fails (connect error, reset, protocol violation, peer
// closed) fails every op queued on it with TRANSFER_FAILED and is discarded; the next op to
// that peer opens a new one. A connection with work that moves no bytes for `peer_timeout`
// fails its ops with TIMEOUT. An op placed in another pool incarnation than the peer's hello
// named fails unsent; an idle connection is first replaced, as its peer may be the one that
// restarted. An op is finished only when no byte of it can move any more, so
// the caller may reuse its memory as soon as the callback runs.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "batch.h"
#include "event_loop.h"
#include "kvagent/common/cluster_secret.h"

namespace kvagent::transfer {

class TcpDataClient {
 public:
  // `key` (may be null: no cluster secret): the data-plane key this side proves membership with;
  // with one, every peer must prove it too.
  TcpDataClient(EventLoop* loop, std::chrono::milliseconds peer_timeout, EngineCounters* counters,
                const SymmetricKey* key = nullptr);
  // Call on the loop thread or after it has joined; FailAll first if ops may be outstanding.
  ~TcpDataClient();
  TcpDataClient(const TcpDataClient&) = delete;
  TcpDataClient& operator=(const TcpDataClient&) = delete;

  // Thread-safe: hands `ops` (all with tcp:// peers) to the loop thread.
  void Submit(std::vector<PendingOp> ops);

  // Loop thread: enforces peer_timeout; returns how long the loop may sleep (-1: no work).
  int Tick();

  // Loop thread: fails every outstanding op with TRANSFER_FAILED and `reason`, closes all.
  void FailAll(const std::string& reason);

 private:
  class Connection;
  void Start(std::vector<PendingOp> ops);
  // Discards `connection` (after failing its ops with `code`/`reason`).
  void Drop(Connection* connection, ErrorCode code, const std::string& reason);

  EventLoop* loop_;
  std::chrono::milliseconds peer_timeout_;
  EngineCounters* counters_;
  const SymmetricKey* key_;
  uint64_t next_request_id_ = 1;
  std::unordered_map<std::string, std::unique_ptr<Connection>> peers_;  // by endpoint
  std::vector<std::unique_ptr<Connection>> graveyard_;
};

}  // namespace kvagent::transfer

// TcpDataServer: serves peers' WRITE and READ requests against this node's pool (protocol in
// tcp_wire.h). Runs on the engine's EventLoop thread; one state machine per connection.
//
// Guarantees: a request's range is bounds-checked against the pool before a byte is touched; a
// bad range gets an error reply and the connection keeps serving; a peer that sends a header
// that is not a request is logged and disconnected; nothing a peer sends can crash the agent.
// Fairness: each wake-up handles at most a bounded amount of work per connection, so one busy
// peer cannot starve the others (the loop is level-triggered and comes back).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "batch.h"
#include "event_loop.h"
#include "kvagent/common/cluster_secret.h"
#include "kvagent/transfer/endpoint.h"
#include "kvagent/transfer/node_pool.h"
#include "kvagent/transfer/pool_fence.h"
#include "socket.h"

namespace kvagent::transfer {

class TcpDataServer final : public EventLoop::Handler {
 public:
  // Binds and listens, and registers the listener with `loop` (call before loop->Start or on
  // the loop thread). INTERNAL naming the address when the bind fails.
  // `fence` (may be null: no checks beyond the range) decides which ops the pool accepts; `key`
  // (may be null: no cluster secret) is the data-plane key every peer must prove it holds
  // before its first request is read.
  [[nodiscard]] static Result<std::unique_ptr<TcpDataServer>> Listen(
      EventLoop* loop, const NodePool* pool, const PoolFence* fence, const SymmetricKey* key,
      const ListenAddress& address, EngineCounters* counters);

  // Closes the listener and every connection. Call on the loop thread or after it has joined.
  ~TcpDataServer() override;

  // The bound address (port 0 resolved).
  const SocketAddress& bound() const { return bound_; }

  void OnEvents(uint32_t events) override;  // accepts pending connections

  // Loop thread: checks every WRITE whose payload is still arriving against the fence again;
  // the rest of a refused one is discarded and the write answered with the refusal.
  void Refence();

  // Loop thread: closes connections that did not authenticate within kHandshakeTimeout;
  // returns how long the loop may sleep before the next check (-1: none pending).
  int Tick();

  // Connections peers may hold open at once: 1024, and at most a quarter of the process's
  // descriptor limit, so a flood of connections cannot starve the rest of the agent (master
  // link, clients) of descriptors. More are accepted and closed at once.
  static size_t MaxConnections();
  // How long a connection has to prove membership.
  static constexpr std::chrono::seconds kHandshakeTimeout{5};

 private:
  class Connection;
  TcpDataServer(EventLoop* loop, const NodePool* pool, const PoolFence* fence,
                const SymmetricKey* key, UniqueFd listener, SocketAddress bound,
                EngineCounters* counters);
  // Out of descriptors: accepts with the spare one and closes at once, so the pending
  // connection does not keep the listener readable (no busy loop), and says so once a minute.
  void ShedConnection(int error);
  // Removes `connection` from the loop and destroys it after the current wake-up.
  void Drop(Connection* connection);
  // At the connection cap, with a secret: closes the oldest connection that has not
  // authenticated yet, so that outsiders holding every slot (each for its 5 s) cannot keep a
  // member's new connection out. False when every open connection has authenticated.
  bool DropOldestUnauthenticated();

  EventLoop* loop_;
  const NodePool* pool_;
  const PoolFence* fence_;
  const SymmetricKey* key_;
  UniqueFd listener_;
  UniqueFd spare_;  // a descriptor given up when accept runs out of them
  // Set while the listener is out of the loop (no descriptor to shed a connection with).
  std::optional<std::chrono::steady_clock::time_point> listen_again_at_;
  static constexpr std::chrono::milliseconds kListenPause{100};
  SocketAddress bound_;
  EngineCounters* counters_;
  const size_t max_connections_ = MaxConnections();
  std::unordered_map<Connection*, std::unique_ptr<Connection>> connections_;
  // Connections in the order they were accepted, with their accept time (an entry whose
  // connection is gone, or is another one at the same address, no longer matches it); entries
  // of connections that authenticated or closed are skipped and pruned as they are met.
  std::deque<std::pair<Connection*, std::chrono::steady_clock::time_point>> accepted_;
  std::vector<std::unique_ptr<Connection>> graveyard_;
};

}  // namespace kvagent::transfer

// The node agent: accepts SDK clients on <run-dir>/agent.sock, gives each a shared-memory
// segment, and serves every client's request ring from one ring-service thread.
//
// Threads: an acceptor thread owns the listening socket and every client connection (epoll):
// it runs the handshake, checks peer credentials, and on EOF tells the ring service to drop the
// client at once. The ring-service thread polls all request rings, spins while work arrives and
// for `spin` after the last work, then sleeps in futex_waitv on every ring's wake word plus a
// private control word. Clients are limited to max_clients <= 127 so that one futex_waitv call
// (128 words) covers them all: beyond that the agent refuses new clients with a message rather
// than sharding over several service threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvagent/agent/request_handler.h"
#include "kvagent/common/status.h"

namespace kvagent::agent {

inline constexpr int kMaxClientsLimit = 127;
// Largest ring a client may get (--max-ring-bytes): a request frame, and the master message
// built from it, stay below kvmaster's message limit (64 MiB).
inline constexpr uint64_t kMaxRingBytesLimit = 32ULL << 20;

struct AgentConfig {
  std::string run_dir = "/run/kvagent";   // created (0755) if missing; holds agent.sock
  uint64_t max_arena_bytes = 1ULL << 30;  // cap on a client's requested arena
  uint64_t ring_bytes = 1ULL << 20;       // default size of each ring (power of two)
  uint64_t max_ring_bytes = 16ULL << 20;  // cap on a client's requested ring size
  int max_clients = kMaxClientsLimit;     // 1..127
  // Clients of one uid at once (0: no cap of its own, max_clients for everyone): on a node
  // shared by users, one user's clients cannot take every slot.
  int max_clients_per_uid = 0;  // 0..max_clients
  // Who may attach (SO_PEERCRED): the agent's own uid, root, a uid in allow_uids or a gid in
  // allow_gids (the lists add to the first two).
  std::vector<uint32_t> allow_uids;
  std::vector<uint32_t> allow_gids;
  // Grant process memory (ProcessMemory::MayGrant) to clients of any uid even when this agent
  // may read and write every process: only where every allowed user is trusted.
  bool process_memory_any_uid = false;
  // A connection that has not completed its handshake (Hello .. Attached) by then is closed.
  std::chrono::milliseconds handshake_timeout{10000};
  // How long the ring service keeps spinning after the last request before it sleeps.
  std::chrono::microseconds spin{50};
  // systemd watchdog: the ring-service thread sends WATCHDOG=1 (and STATUS=<watchdog_status()>,
  // called on that thread) every watchdog_interval; 0: no pings (Watchdog, common/watchdog.h).
  std::chrono::microseconds watchdog_interval{0};
  std::function<std::string()> watchdog_status;
  // This run's incarnation, the one its node pool and RegisterAgent carry; clients find it in
  // Welcome and their segment header. 0: the agent draws one of its own.
  uint64_t incarnation = 0;

  // "<run_dir>/agent.sock".
  std::string SocketPath() const { return run_dir + "/agent.sock"; }
};

// Creates `dir` and its missing parents (0755). INVALID_PARAMS for an empty path, INTERNAL
// naming the component that could not be created.
Status MakeRunDir(const std::string& dir);

class Agent {
 public:
  // Creates the run dir, listens on the socket and starts both threads. `handler` executes every
  // valid request other than Ping.
  static Result<std::unique_ptr<Agent>> Start(AgentConfig config,
                                              std::unique_ptr<RequestHandler> handler);

  // Stops accepting, sets the shutdown word in every client's segment and wakes the clients,
  // closes every connection, removes the socket file and joins the threads. Idempotent.
  void Stop();
  ~Agent();

  uint64_t incarnation() const;  // AgentConfig::incarnation, or the one drawn
  size_t client_count() const;

  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

 private:
  struct State;
  explicit Agent(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kvagent::agent

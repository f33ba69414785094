// The acceptor thread: owns the listening socket <run-dir>/agent.sock and every client
// connection (one epoll loop).
//
// Handshake per connection: Hello (protocol version, client name, wanted arena and ring sizes)
// -> peer credentials checked against the allow-list, client count checked against max_clients
// -> the segment is created (a sealed memfd, its pages allocated) -> Welcome (sizes; the
// segment's fd rides along as SCM_RIGHTS) -> the client maps it -> Attached -> the client is
// handed to the ring service. The connection then stays open and silent: EOF, or any byte the
// client sends, means the client is gone, and the ring service drops it at once.
//
// Hostile or broken peers cannot starve the agent (docs/operations.md, "Security"):
//   - a connection that has not completed the handshake within handshake_timeout is closed
//     (its segment, if one was made, goes with it);
//   - at most kMaxIdlePerUid connections per uid, and kMaxIdle in all, may wait without having
//     sent a Hello; a new one beyond that closes the oldest idle one (of that uid first);
//   - when the process runs out of file descriptors (EMFILE/ENFILE) a reserved descriptor is
//     released to accept and close the pending connection, so the listener does not stay
//     readable (no busy loop); other accept failures pause accepting for 100 ms. Both are
//     logged at most once per 10 s;
//   - client names are sanitized before they reach a log line.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "handshake_messages.h"
#include "kvagent/agent/agent.h"
#include "kvagent/ipc/segment.h"
#include "kvagent/ipc/unix_socket.h"
#include "process_memory.h"
#include "ring_service.h"

namespace kvagent::agent {

// "pid P, uid U, gid G": a client in the agent's log lines.
std::string DescribePeer(const ipc::PeerCredentials& peer);

// Connections that have not sent their Hello yet: per uid, and in all.
inline constexpr size_t kMaxIdlePerUid = 64;
inline constexpr size_t kMaxIdle = 256;

class Acceptor {
 public:
  Acceptor(const AgentConfig& config, uint64_t incarnation, RingService* service);
  ~Acceptor();

  // Listens on the socket and starts the thread.
  [[nodiscard]] Status Start();
  // Closes the listening socket and removes its file, closes every connection and joins.
  // Idempotent.
  void Stop();
  // Closes the listening socket and removes its file, and returns once that is done; existing
  // connections stay. The first step of shutdown.
  void StopAccepting();
  // Thread-safe: close the connection of `client` (its ring was corrupt).
  void Disconnect(ClientId client);

 private:
  using Clock = std::chrono::steady_clock;
  enum class Phase { kAwaitHello, kAwaitAttached, kLive };
  struct Connection {
    ipc::UniqueFd fd;
    Phase phase = Phase::kAwaitHello;
    Clock::time_point accepted_at;
    ipc::MessageReader reader;
    ipc::PeerCredentials peer;
    ClientId client_id = 0;
    std::string client_name;                // sanitized
    std::shared_ptr<ipc::Segment> segment;  // until handed to the ring service
    std::shared_ptr<ProcessMemory> memory;  // granted process memory, or null
  };

  void Run();
  void AcceptAll();
  void OnAcceptFailure(int err);
  void MakeRoomForIdle(uid_t uid);
  void CloseStaleHandshakes(Clock::time_point now);
  int NextTimeoutMs(Clock::time_point now) const;
  void OnReadable(Connection& conn);
  // Each returns false when the connection must be closed (acceptor_handshake.cc).
  bool OnHello(Connection& conn, std::span<const uint8_t> message);
  bool OnAttached(Connection& conn, std::span<const uint8_t> message);
  void Refuse(Connection& conn, const Status& why);
  void Close(int fd, const std::string& why);
  bool Allowed(const ipc::PeerCredentials& peer) const;
  // Clients past their Hello: all, or those of one uid.
  size_t CountClients(std::optional<uid_t> uid = std::nullopt) const;
  void ProcessCommands();
  void CloseListener();  // acceptor thread only
  void PauseAccepting(Clock::time_point until);

  const AgentConfig config_;
  const uint64_t incarnation_;
  RingService* const service_;
  std::vector<uint32_t> allow_uids_;
  std::vector<uint32_t> allow_gids_;
  ipc::UniqueFd listen_fd_;
  ipc::UniqueFd epoll_fd_;
  ipc::UniqueFd wake_fd_;   // eventfd: commands from other threads
  ipc::UniqueFd spare_fd_;  // released to accept-and-close when out of descriptors
  std::thread thread_;
  bool started_ = false;

  std::mutex commands_mu_;
  std::vector<ClientId> to_disconnect_;
  std::condition_variable commands_cv_;
  bool stop_requested_ = false;
  bool stop_accepting_ = false;
  bool listener_closed_ = false;

  // Acceptor-thread state.
  std::unordered_map<int, Connection> connections_;
  std::unordered_map<ClientId, int> fd_of_client_;
  ClientId next_client_id_ = 1;
  bool accept_paused_ = false;
  Clock::time_point resume_accept_at_;
  Clock::time_point next_accept_warning_;
  uint64_t accept_failures_ = 0;  // since the last warning
  Clock::time_point next_eviction_warning_;
  uint64_t evictions_ = 0;  // since the last warning
};

}  // namespace kvagent::agent

// The acceptor thread: owns the listening socket <run-dir>/agent.sock and every client
// connection (one epoll loop).
//
// Handshake per connection: Hello (protocol version, client name, wanted arena and ring sizes)
// -> peer credentials checked against the allow-list, client count checked against max_clients
// -> the segment is created (owned by the peer's uid when the agent runs as root) -> Welcome
// (segment name and sizes) -> the client maps it -> Attached -> the agent unlinks the name and
// hands the client to the ring service. The connection then stays open and silent: EOF (or
// anything the client sends) means the client is gone, and the ring service drops it at once.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvagent/agent/agent.h"
#include "kvagent/ipc/segment.h"
#include "kvagent/ipc/unix_socket.h"
#include "process_memory.h"
#include "ring_service.h"

namespace kvagent::agent {

class Acceptor {
 public:
  Acceptor(const AgentConfig& config, uint64_t epoch, RingService* service);
  ~Acceptor();

  // Listens on the socket and starts the thread.
  [[nodiscard]] Status Start();
  // Closes the listening socket and removes its file, closes every connection (unlinking the
  // names of segments not yet attached) and joins. Idempotent.
  void Stop();
  // Closes the listening socket and removes its file, and returns once that is done; existing
  // connections stay. The first step of shutdown.
  void StopAccepting();
  // Thread-safe: close the connection of `client` (its ring was corrupt).
  void Disconnect(ClientId client);

 private:
  enum class Phase { kAwaitHello, kAwaitAttached, kLive };
  struct Connection {
    ipc::UniqueFd fd;
    Phase phase = Phase::kAwaitHello;
    ipc::MessageReader reader;
    ipc::PeerCredentials peer;
    ClientId client_id = 0;
    std::string client_name;
    std::string segment_name;
    std::shared_ptr<ipc::Segment> segment;  // until handed to the ring service
    std::shared_ptr<ProcessMemory> memory;  // granted process memory, or null
  };

  void Run();
  void AcceptAll();
  void OnReadable(Connection& conn);
  // Each returns false when the connection must be closed.
  bool OnHello(Connection& conn, std::span<const uint8_t> message);
  bool OnAttached(Connection& conn, std::span<const uint8_t> message);
  void Refuse(Connection& conn, const Status& why);
  void Close(int fd, const std::string& why);
  bool Allowed(const ipc::PeerCredentials& peer) const;
  size_t CountClients() const;
  void ProcessCommands();
  void CloseListener();  // acceptor thread only

  const AgentConfig config_;
  const uint64_t epoch_;
  RingService* const service_;
  std::vector<uint32_t> allow_uids_;
  std::vector<uint32_t> allow_gids_;
  ipc::UniqueFd listen_fd_;
  ipc::UniqueFd epoll_fd_;
  ipc::UniqueFd wake_fd_;  // eventfd: commands from other threads
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
};

}  // namespace kvagent::agent

// The ring-service thread: serves the request rings of every attached client.
//
// Loop: take commands from the inbox (add/drop a client, run a posted task, stop); serve each
// client (flush its completion backlog, then read up to a burst of request frames: copy out of
// shared memory, verify, validate, answer Ping, hand the rest to the RequestHandler); if the
// handler got anything in this pass, call its OnPassEnd (it sends its batches) and publish the
// completions that produced; run the handler's timer when due; spin while work arrives and for
// `spin` after the last work; then sleep in one futex_waitv on every client's wake word plus
// the private control word that posters bump, at most until the handler's next deadline.
//
// A client whose completion ring is full is not read from until its backlog drains: back-pressure
// reaches its request ring, and the service waits on that client's completion-ring space word
// instead of its request word, so each client costs exactly one futex_waitv entry.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <flatbuffers/flatbuffers.h>

#include "client_connection.h"
#include "kvagent/agent/request_handler.h"
#include "kvagent/common/watchdog.h"

namespace kvagent::agent {

class RingService final : public CompletionSink {
 public:
  // Called (on the service thread) when a client's ring is corrupt and it must be disconnected.
  using DisconnectFn = std::function<void(ClientId, const std::string& reason)>;

  // The service thread pings systemd's watchdog every `watchdog_interval` (0: never) with
  // STATUS=<watchdog_status()>: a service loop that hangs stops the pings.
  RingService(RequestHandler* handler, std::chrono::microseconds spin,
              std::chrono::microseconds watchdog_interval,
              std::function<std::string()> watchdog_status, DisconnectFn disconnect);
  ~RingService() override;

  void Start();
  // Signals shutdown to every client (header word + wake), drops them and joins. Idempotent.
  void Stop();

  // Thread-safe: hand over a client that finished the handshake / one that is gone.
  void AddClient(std::unique_ptr<ClientConnection> client);
  void DropClient(ClientId client);
  size_t client_count() const { return client_count_.load(std::memory_order_relaxed); }

  // CompletionSink.
  void Complete(ClientId client, uint64_t request_id, const CompletionData& data) override;
  void PublishCompletions() override;
  void Post(std::function<void()> task) override;
  size_t ClientCount() const override { return client_count(); }

 private:
  struct Command {
    enum Kind { kAdd, kDrop, kTask, kStop } kind;
    std::unique_ptr<ClientConnection> connection;
    ClientId client = 0;
    std::function<void()> task;
  };

  void Run();
  void Enqueue(Command command);
  bool DrainInbox();  // false once Stop was received
  // Serves one client and publishes what it consumed and produced. True if it did any work.
  bool Serve(ClientConnection& client);
  bool ServeRequests(ClientConnection& client);
  void HandleFrame(ClientConnection& client, uint64_t request_id, std::span<const uint8_t> frame);
  void Send(ClientConnection& client, uint64_t request_id, std::span<const uint8_t> completion);
  // Publishes every client's queued completions (after the handler produced some).
  void FlushAll();
  // Runs the handler's timer when due. True if it ran.
  bool RunTimer(std::chrono::steady_clock::time_point now);
  void Sleep();
  void Remove(ClientId client, bool disconnect, const std::string& reason);
  void RemoveBroken();

  RequestHandler* const handler_;
  const std::chrono::microseconds spin_;
  const DisconnectFn disconnect_;
  Watchdog watchdog_;  // polled on the service thread only
  std::thread thread_;
  bool started_ = false;

  std::mutex inbox_mu_;
  std::vector<Command> inbox_;
  std::atomic<bool> inbox_pending_{false};
  // Private futex word posters bump when the service advertised sleep (see frame_ring.h).
  std::atomic<uint32_t> control_seq_{0};
  std::atomic<uint32_t> sleeping_{0};

  // Service-thread state.
  std::vector<std::unique_ptr<ClientConnection>> clients_;
  std::unordered_map<ClientId, ClientConnection*> by_id_;
  // Clients given a completion since the last publish (PublishCompletions, FlushAll).
  std::vector<ClientId> unpublished_;
  std::atomic<size_t> client_count_{0};
  flatbuffers::FlatBufferBuilder fbb_{1024};
  std::vector<uint8_t> scratch_;
  bool waitv_unsupported_logged_ = false;
  // Set when the handler received a request or ran a posted task in the current pass.
  bool handler_busy_ = false;
};

}  // namespace kvagent::agent

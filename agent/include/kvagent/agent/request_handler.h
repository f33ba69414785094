// The seam between the agent's ring service and whatever executes requests.
//
// The ring service (one thread for every client) reads each request frame, verifies it, checks
// it against the shared validation boundary (common/validate.h), answers Ping itself, and hands
// every other valid request to a RequestHandler: the request pipeline (batcher, master link,
// transfers; agent/src/request_pipeline.h).
//
// Threading: every RequestHandler method runs on the ring-service thread and must not block.
// Work that finishes elsewhere comes back with CompletionSink::Post(), whose task runs on the
// ring-service thread, where it may call Complete().
//
// Natural batching: the service reads every ring in one pass (a burst per client), handing each
// request to Handle(); at the end of a pass in which the handler received a request or ran a
// posted task it calls OnPassEnd(), where the handler sends what it collected, one batch per op
// kind. No timer is involved: a lone request goes out at the end of its pass, a burst from many
// clients becomes one batch. Periodic work (an embedded master's Tick) uses NextDeadline() /
// OnTimer(): the service sleeps at most until the deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvagent/common/status.h"
#include "kvagent/schemas/agent_generated.h"

namespace kvagent::ipc {
class Segment;
}

namespace kvagent::agent {

using ClientId = uint64_t;
class ProcessMemory;

// A valid request, copied out of the client's ring into memory the handler owns.
struct ClientRequest {
  ClientId client_id = 0;
  uint64_t request_id = 0;
  std::vector<uint8_t> frame;  // the verified FlatBuffer (a private copy)
  // Keeps the client's mapping alive while the request is held, even after the client is gone,
  // so a transfer in flight never touches unmapped memory.
  std::shared_ptr<ipc::Segment> segment;
  // Set when the request's values are in the client's own memory (Request.memory): the
  // client's process, granted at the handshake (agent/src/process_memory.h).
  std::shared_ptr<const ProcessMemory> memory;
  std::vector<uint32_t> memory_first;  // with `memory`: the index of each key's first range

  const proto::Request& request() const;
  size_t key_count() const;
  // The client's data arena. Every BufferRef of the request lies inside it (checked).
  std::span<uint8_t> arena() const;
};

// List: one stored object.
struct ListedKey {
  std::string key;
  uint64_t size = 0;
  std::string session_id;  // "" when untagged
};

// Sessions: what the cluster stores for one session ID.
struct SessionUsage {
  std::string session_id;
  uint64_t blocks = 0;
  uint64_t bytes = 0;
};

// Stat: one counter; `text` for the few values that are words.
struct Counter {
  std::string name;
  uint64_t value = 0;
  std::string text;
};

// What the agent tells the client about one request. Per-key vectors are parallel to the
// request's keys (or empty when not applicable: `messages` may be empty when every key is OK).
struct CompletionData {
  Status status;  // request level: OK when every key was attempted
  std::vector<ErrorCode> codes;
  std::vector<std::string> messages;
  std::vector<uint64_t> lengths;       // Get
  std::vector<bool> exists;            // Exist
  std::vector<uint8_t> replicas;       // Put/Upsert: replicas written per key
  uint64_t removed_count = 0;          // RemoveAll
  std::vector<ListedKey> listed;       // List
  uint64_t next_cursor = 0;            // List, Sessions
  std::vector<Counter> counters;       // Stat
  std::vector<SessionUsage> sessions;  // Sessions

  // Every one of `key_count` keys fails with `status` (request-level status too).
  static CompletionData FailAll(const Status& status, size_t key_count);
};

// Where handlers send results. Implemented by the ring service.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // Posts the completion of `request` to its client's completion ring (service thread only).
  // Silently dropped when the client is gone.
  virtual void Complete(ClientId client, uint64_t request_id, const CompletionData& data) = 0;
  // Makes the completions posted since the last call visible to their clients now instead of
  // at the end of the pass (service thread only): a finished batch's callers need not wait for
  // the rest of the pass.
  virtual void PublishCompletions() {}
  // Runs `task` on the service thread soon (thread-safe; wakes the service if it sleeps).
  // Tasks posted after the service stopped never run (they are destroyed with the service).
  virtual void Post(std::function<void()> task) = 0;
  // Clients attached right now (any thread).
  virtual size_t ClientCount() const = 0;
};

class RequestHandler {
 public:
  using Clock = std::chrono::steady_clock;

  virtual ~RequestHandler() = default;
  // Called once, first, on the service thread: `sink` is where results go until
  // OnServiceStop() (it outlives the handler's use of it).
  virtual void OnStart(CompletionSink& /*sink*/) {}
  // Takes ownership of a valid request other than Ping. Must complete it exactly once through
  // `sink`, now or later.
  virtual void Handle(ClientRequest request, CompletionSink& sink) = 0;
  // End of a pass over every ring in which this handler received at least one request or ran
  // a posted task: send what was collected (the natural-batching point).
  virtual void OnPassEnd() {}
  // The client disconnected: abandon its in-flight work (revoke puts, drop leases). Completions
  // for it are dropped from now on.
  virtual void OnClientGone(ClientId client) = 0;
  // When OnTimer() is next due; Clock::time_point::max() for never. Read after every pass and
  // before the service sleeps, so keep it cheap.
  virtual Clock::time_point NextDeadline() const { return Clock::time_point::max(); }
  // Called on the first pass at or after NextDeadline().
  virtual void OnTimer(Clock::time_point /*now*/) {}
  // True while work handed to another thread of this process (the master link, the data plane)
  // is still to come back: the service then yields the CPU while it spins, so that thread runs
  // at once even when both share a CPU.
  virtual bool AwaitingOtherThreads() const { return false; }
  // On every pass, and while the service spins: takes in the work that came back which this
  // thread can read itself (a master's replies on a socket) instead of waiting for the thread
  // that would post it; true when it did some (the pass then ends as after a posted task).
  // Cheap when nothing is out.
  virtual bool TakeReplies() { return false; }
  // Before the service sleeps: stop reading for yourself (the other thread reads and posts).
  virtual void StopTakingReplies() {}
  // The service thread is about to exit (every client is already gone): stop whatever posts
  // tasks. Nothing runs on the service thread afterwards.
  virtual void OnServiceStop() {}
};

}  // namespace kvagent::agent

// The seam between the agent's ring service and whatever executes requests.
//
// The ring service (one thread for every client) reads each request frame, verifies it, checks
// it against the shared validation boundary (common/validate.h), answers Ping itself, and hands
// every other valid request to a RequestHandler. In this issue the only handler answers
// MASTER_UNAVAILABLE (no_master_handler.h); the request pipeline (batcher, master link,
// transfers) replaces it without touching the ring service.
//
// Threading: Handle() and OnClientGone() run on the ring-service thread and must not block.
// Work that finishes elsewhere comes back with CompletionSink::Post(), whose task runs on the
// ring-service thread, where it may call Complete().
#pragma once

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

// A valid request, copied out of the client's ring into memory the handler owns.
struct ClientRequest {
  ClientId client_id = 0;
  uint64_t request_id = 0;
  std::vector<uint8_t> frame;  // the verified FlatBuffer (a private copy)
  // Keeps the client's mapping alive while the request is held, even after the client is gone,
  // so a transfer in flight never touches unmapped memory.
  std::shared_ptr<ipc::Segment> segment;

  const proto::Request& request() const;
  size_t key_count() const;
  // The client's data arena. Every BufferRef of the request lies inside it (checked).
  std::span<uint8_t> arena() const;
};

// What the agent tells the client about one request. Per-key vectors are parallel to the
// request's keys (or empty when not applicable: `messages` may be empty when every key is OK).
struct CompletionData {
  Status status;  // request level: OK when every key was attempted
  std::vector<ErrorCode> codes;
  std::vector<std::string> messages;
  std::vector<uint64_t> lengths;  // Get
  std::vector<bool> exists;       // Exist
  uint64_t removed_count = 0;     // RemoveAll

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
  // Runs `task` on the service thread soon (thread-safe; wakes the service if it sleeps).
  virtual void Post(std::function<void()> task) = 0;
};

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  // Takes ownership of a valid request other than Ping. Must complete it exactly once through
  // `sink`, now or later (CompletionSink outlives the handler's use of it).
  virtual void Handle(ClientRequest request, CompletionSink& sink) = 0;
  // The client disconnected: abandon its in-flight work (revoke puts, drop leases). Completions
  // for it are dropped from now on.
  virtual void OnClientGone(ClientId client) = 0;
};

}  // namespace kvagent::agent

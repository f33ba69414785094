// What every batch of the request pipeline shares: the master port, the node pool, the data
// plane, the way back to the service thread, the counters, and the client arenas registered
// with the data plane. Owned by RequestPipeline; used on the service thread only (except
// ServiceGate::Post, which any thread may call).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data_plane.h"
#include "kvagent/agent/master_port.h"
#include "kvagent/agent/request_handler.h"
#include "kvagent/common/metrics.h"
#include "kvagent/transfer/node_pool.h"
#include "phase_latency.h"

namespace kvagent::agent {

class CopyHelpers;

class WriteReservations;

// Posts tasks to the service thread while it runs and drops them once it stopped, so threads
// that finish work late (the data plane's callbacks, the master link) never touch a destroyed
// service. Shared by everything that posts.
class ServiceGate {
 public:
  void Open(CompletionSink* sink);
  void Close();  // after it returns, Post does nothing
  void Post(std::function<void()> task);

 private:
  std::mutex mu_;
  CompletionSink* sink_ = nullptr;
};

// Counters behind `kvctl stat` and /metrics. Written on the service thread only; any thread may
// read them (the metrics HTTP thread does). Indexed by proto::Op.
struct PipelineCounters {
  using Count = metrics::SingleWriterCounter;
  static constexpr size_t kOps = 10;
  std::array<Count, kOps> requests{};  // requests handed in
  std::array<Count, kOps> batches{};   // master calls carrying them
  std::array<Count, kOps> keys{};      // keys in those calls
  Count bytes_to_pool;                 // put bytes copied into this node's pool
  Count bytes_to_peers;                // put bytes written to peers' pools
  Count bytes_from_pool;               // get bytes copied out of this node's pool
  Count bytes_from_peers;              // get bytes read from peers' pools
  Count transfer_failures;             // keys that failed in the data plane
  Count replica_fallbacks;             // get parts read again from another replica
  Count revoked_keys;                  // writes revoked (failed transfer or client gone)
  Count lease_expired;                 // gets that outlived their read lease
  Count master_failures;               // master calls that failed (unreachable, timeout)
  Count abandoned_requests;            // requests of clients that left before completion
  Count expired_keys;                  // keys answered TIMEOUT: the caller's deadline passed
  Count checksum_mismatches;           // replicas read whose bytes failed their checksum
  Count peer_rereads;         // peers' bytes that failed their checksum once, so were read again
  Count corrupted_keys;       // gets answered DATA_CORRUPTED (every replica failed)
  Count degraded_puts;        // puts stored with fewer replicas than asked
  Count fenced_local_writes;  // local copies the pool fence refused
  Count reserved_puts;        // keys put with one master round trip (reserved writes)
};

// A request held by a batch, with the answer under construction. Move-only: a copy could give
// its call word back a second time, after the caller reused the word for its next call.
struct HeldRequest {
  HeldRequest() = default;
  HeldRequest(HeldRequest&&) = default;
  HeldRequest& operator=(HeldRequest&&) = default;
  HeldRequest(const HeldRequest&) = delete;
  HeldRequest& operator=(const HeldRequest&) = delete;

  ClientRequest request;
  CompletionData result;
  bool gone = false;  // the client left: no copies into its arena, writes revoked, no answer

  // Sets key `index` to `code` with `message` (messages are allocated on the first error).
  void SetKey(size_t index, ErrorCode code, const std::string& message);
  // Every key (and the request) fails with `status`.
  void FailAll(const Status& status);
  // Reads the caller's deadline (Request.deadline_ns) once, when the request is taken at `now`:
  // none without one, or with one from another clock (its submit time more than 10 minutes from
  // `now`). The checks below then read no clock of their own (they run once per key).
  void TakeDeadline(std::chrono::steady_clock::time_point now);
  // That deadline has passed at `now`. False without a deadline.
  bool Expired(std::chrono::steady_clock::time_point now) const { return deadline_at <= now; }
  // That deadline on the steady clock (CLOCK_MONOTONIC), or nullopt (none, or another clock).
  std::optional<std::chrono::steady_clock::time_point> Deadline() const;
  // Asked before the first read or write of the caller's values or targets (arena or process
  // memory): whether they may be touched at `now`. False when the deadline passed, or when the
  // caller stopped waiting: its SDK closed the call's word (Request.call_word) first. True
  // claims the word (0 -> 1), so from then on the caller waits for the answer instead of
  // returning TIMEOUT and reusing its buffers; it stays claimed until ReleaseClientMemory.
  bool MayTouchClientMemory(std::chrono::steady_clock::time_point now);
  // Gives a claimed word back (1 -> 0): just before the answer goes out (PipelineContext::
  // Complete), never after, since the caller may reuse the word for its next call then.
  void ReleaseClientMemory();

  std::chrono::steady_clock::time_point deadline_at =
      std::chrono::steady_clock::time_point::max();  // max: none
  bool claimed = false;                              // the call word is ours (MayTouchClientMemory)
};

// The TIMEOUT of work skipped because the caller stopped waiting; `skipped` says what was not
// done, e.g. "the value was not copied into the buffer".
Status DeadlinePassed(std::string_view skipped);

// One key of a batch by its original position: SEMANTICS rule 9 (results, session IDs and
// block metadata always map back through this, never through a subset's index).
struct KeyRef {
  uint32_t request;  // index into the batch's requests
  uint32_t index;    // the key's index in that request
};

// Client arenas registered with the data plane (TransferEngine::RegisterMemory, once per
// client, at its first remote transfer). An arena is unregistered once its client is gone and
// no transfer uses it any more.
class ArenaRegistry {
 public:
  explicit ArenaRegistry(DataPlane* engine) : engine_(engine) {}
  // Registers the client's arena if needed and counts one more transfer batch using it.
  [[nodiscard]] Status Acquire(const ClientRequest& request);
  void Release(ClientId client);
  void ClientGone(ClientId client);

 private:
  struct Entry {
    void* base = nullptr;
    uint32_t users = 0;
    bool gone = false;
  };
  void Unregister(ClientId client, Entry& entry);
  DataPlane* engine_;
  std::unordered_map<ClientId, Entry> entries_;
};

struct PipelineContext {
  MasterPort* master = nullptr;
  transfer::NodePool* pool = nullptr;
  DataPlane* engine = nullptr;
  // Which writes may still land in this node's pool; local copies ask it too (may be null in
  // tests of the pipeline alone: no fencing of local copies).
  const transfer::PoolFence* fence = nullptr;
  // Checksums taken on put and verified on get (--checksums; off only to measure their cost).
  bool checksums = true;
  // Every local copy between a client and the pool (copy_helpers.h: large ones split across
  // threads when the pipeline has helpers). Set by RequestPipeline, never null there.
  CopyHelpers* copier = nullptr;
  // Writes reserved ahead for puts (remote master only; null: every put starts its writes).
  WriteReservations* reservations = nullptr;
  CompletionSink* sink = nullptr;
  std::shared_ptr<ServiceGate> gate;
  PipelineCounters counters;
  PhaseLatency latency;  // per-phase histograms of puts and gets (/metrics)
  std::unique_ptr<ArenaRegistry> arenas;
  // Appends counters of parts the pipeline does not own (the event relay) to a Stat reply.
  // Runs on the service thread; may be empty.
  std::function<void(std::vector<Counter>*)> extra_counters;
  uint64_t next_master_request = 1;

  uint64_t NextMasterRequestId() { return next_master_request++; }
  // Answers the request unless its client is gone.
  void Complete(HeldRequest& held);
};

}  // namespace kvagent::agent

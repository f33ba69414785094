// Latency of puts and gets per phase, for /metrics: kvagent_put_phase_seconds{phase} and
// kvagent_get_phase_seconds{phase}. Recorded on the service thread (single writer), read by the
// metrics thread.
//
//   ring_wait     per request: from the SDK's submit (Request.deadline_ns - timeout_ms, the same
//                 CLOCK_MONOTONIC) to the ring service handing it to the pipeline; requests
//                 without a deadline are not counted
//   master_start  per write batch: the WriteStart (BatchPutStart/BatchUpsertStart) round trip
//   master        per get batch: the BatchGet round trip
//   data          per batch: copies into/out of this node's pool and transfers to/from peers
//   master_end    per write batch: the End/Revoke round trip
#pragma once

#include <array>
#include <chrono>

#include "kvagent/agent/request_handler.h"
#include "kvagent/common/metrics.h"

namespace kvagent::agent {

enum class PutPhase : uint8_t { kRingWait, kMasterStart, kData, kMasterEnd };
enum class GetPhase : uint8_t { kRingWait, kMaster, kData };

struct PhaseLatency {
  std::array<metrics::LatencyHistogram, 4> put;
  std::array<metrics::LatencyHistogram, 3> get;

  metrics::LatencyHistogram& of(PutPhase p) { return put[static_cast<size_t>(p)]; }
  metrics::LatencyHistogram& of(GetPhase p) { return get[static_cast<size_t>(p)]; }

  // The ring wait of a Put, Upsert or Get handed over at `now` (other ops: nothing).
  void RecordRingWait(const ClientRequest& request, std::chrono::steady_clock::time_point now);

  void Append(metrics::Exposition* out) const;
};

// Times the consecutive phases of one batch: Start() as the first phase begins, then Lap(h) as
// each ends (records the time since the previous Start or Lap). Both return the time they read,
// for the caller's own use: a clock read costs ~30 ns on a VM, and a single-key call makes
// several.
class PhaseTimer {
 public:
  std::chrono::steady_clock::time_point Start() {
    last_ = std::chrono::steady_clock::now();
    return last_;
  }
  std::chrono::steady_clock::time_point Lap(metrics::LatencyHistogram& h) {
    const auto now = std::chrono::steady_clock::now();
    h.Record(now - last_);
    last_ = now;
    return now;
  }

 private:
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace kvagent::agent

#include "phase_latency.h"

namespace kvagent::agent {
namespace {

constexpr const char* kPutPhases[] = {"ring_wait", "master_start", "data", "master_end"};
constexpr const char* kGetPhases[] = {"ring_wait", "master", "data"};
// A submit time further than this from our clock comes from another clock (see Expired).
constexpr int64_t kSameClockNs = 600'000'000'000;

}  // namespace

void PhaseLatency::RecordRingWait(const ClientRequest& request,
                                  std::chrono::steady_clock::time_point now) {
  const proto::Request& r = request.request();
  metrics::LatencyHistogram* h = nullptr;
  if (r.op() == proto::Op::Put || r.op() == proto::Op::Upsert) h = &of(PutPhase::kRingWait);
  if (r.op() == proto::Op::Get) h = &of(GetPhase::kRingWait);
  if (h == nullptr || r.deadline_ns() == 0) return;
  const int64_t submitted_ns =
      static_cast<int64_t>(r.deadline_ns()) - int64_t{r.timeout_ms()} * 1'000'000;
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  if (submitted_ns > now_ns + kSameClockNs || submitted_ns < now_ns - kSameClockNs) return;
  h->Record(std::chrono::nanoseconds(now_ns - submitted_ns));
}

void PhaseLatency::Append(metrics::Exposition* out) const {
  for (size_t i = 0; i < put.size(); ++i) {
    out->Histogram("kvagent_put_phase_seconds",
                   "put and upsert latency per phase (ring_wait per request, the others per "
                   "batch)",
                   put[i].Read(), {{"phase", kPutPhases[i]}});
  }
  for (size_t i = 0; i < get.size(); ++i) {
    out->Histogram("kvagent_get_phase_seconds",
                   "get latency per phase (ring_wait per request, the others per batch)",
                   get[i].Read(), {{"phase", kGetPhases[i]}});
  }
}

}  // namespace kvagent::agent

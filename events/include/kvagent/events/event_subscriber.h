// EventSubscriber: the consumer side of docs/events.md, for the agent's relay, `kvctl events tail`
// and the tests.
//
// Connects a SUB (subscribed to everything) to a publisher's PUB endpoint and, when a replay
// endpoint is given, a DEALER to its ROUTER. Next() hands out, in seq order and without
// duplicates, every batch the publisher sent, each once:
//  - live batches `[topic, seq u64 BE, payload]` (anything else is counted and skipped);
//  - a gap (seq > last + 1) is repaired through replay (`[b"", start_seq]` -> batches in the
//    4-frame `[b"", topic, seq, payload]` or 3-frame `[b"", seq, payload]` layout until the end
//    marker), with a bounded wait; what replay cannot supply is reported as a kGap delivery
//    (from..to), never silently skipped;
//  - a publisher restart (the live seq goes back to a value at or below one already seen) is
//    reported as kReset, after which the new run is followed from its seq 0 (replaying
//    what was missed of it, when possible). Seq alone cannot reveal a restart whose new
//    run is already past the old seq when we next hear from it (a long disconnect):
//    that looks like a gap, repaired from the new run's replay;
//  - `from_seq` replays history from that seq before the live stream (kvctl --from-seq N);
//  - when the live stream is quiet, an occasional replay probe catches a lost last batch.
//
// Threading: not thread-safe. Exactly one thread, the one that calls Start and Next, owns both
// sockets (docs/architecture.md: one thread per ZMQ socket); destroy it on that thread too.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/status.h"
#include "kvagent/events/kv_event.h"

namespace kvagent::events {

struct EventSubscriberOptions {
  std::string endpoint;         // the publisher's PUB endpoint to connect to (required)
  std::string replay_endpoint;  // its ROUTER; empty: gaps are reported, never repaired
  // Replay history from this seq before going live (needs replay_endpoint). Unset: start with
  // whatever live batch arrives first.
  std::optional<uint64_t> from_seq;
  // How long a replay may stay silent before it is given up (the gap is then reported).
  std::chrono::milliseconds replay_timeout{2000};
  // When the live socket has been silent this long, ask the replay socket for anything after
  // the last delivered seq: a batch lost just before a quiet period (or while the SUB was
  // still joining) is then repaired without waiting for the next live batch. Zero: off.
  std::chrono::milliseconds idle_probe_interval{1000};
  bool decode = false;  // also decode each payload (EventDelivery::batch / decode_status)
  int rcvhwm = 100000;  // SUB receive high-water mark (messages); overflow shows as a gap
  // With keys, the SUB and the replay DEALER are CURVE clients of them for tcp:// endpoints
  // (a publisher with the cluster secret, curve_auth.h); ipc:// endpoints stay plain.
  std::optional<CurvePlaneKeys> curve;
};

struct EventDelivery {
  enum class Kind {
    kBatch,  // one batch: seq, topic, payload (and batch when decoding)
    kGap,    // seqs [seq, gap_to] were lost: neither live nor replay could supply them
    kReset,  // the publisher restarted: seq is the first seq seen from the new run
  };
  Kind kind = Kind::kBatch;
  uint64_t seq = 0;
  uint64_t gap_to = 0;        // kGap: last missing seq (inclusive)
  uint64_t previous_seq = 0;  // kReset: the last seq delivered from the old run
  bool replayed = false;      // kBatch: came from replay rather than the live socket
  std::string topic;
  std::string payload;
  std::optional<EventBatch> batch;  // kBatch with options.decode and a payload that decoded
  Status decode_status;             // kBatch with options.decode: why `batch` is empty
};

struct EventSubscriberStats {
  uint64_t delivered_batches = 0;
  uint64_t replayed_batches = 0;    // delivered batches that came through replay
  uint64_t duplicates_dropped = 0;  // batches both live and replay delivered (kept once)
  uint64_t gaps_repaired = 0;       // replays (gap repairs, idle probes) that supplied lost batches
  uint64_t gaps_reported = 0;       // kGap deliveries
  uint64_t missing_batches = 0;     // seqs covered by kGap deliveries
  uint64_t resets = 0;
  uint64_t resets_seen_in_replay = 0;  // of them: a replay found another batch where ours was
  uint64_t replay_requests = 0;        // gap repairs, from_seq and idle probes
  uint64_t malformed_messages = 0;     // frames that break the layout (skipped)
};

class EventSubscriber {
 public:
  // Creates and connects the sockets on the calling thread, which then owns the subscriber.
  // Fails when an endpoint is missing or unparsable, or from_seq is set without a replay
  // endpoint. The publisher need not be up yet.
  static Result<std::unique_ptr<EventSubscriber>> Start(EventSubscriberOptions options);

  ~EventSubscriber();
  EventSubscriber(const EventSubscriber&) = delete;
  EventSubscriber& operator=(const EventSubscriber&) = delete;

  // Waits up to `timeout` for the next delivery. Returns TIMEOUT when nothing is ready by then
  // (a replay in progress carries on at the next call). Never returns a batch twice or out of
  // order within one publisher run.
  Result<EventDelivery> Next(std::chrono::milliseconds timeout);

  // The next seq the subscriber expects, once it has one (after the first delivery or from_seq).
  std::optional<uint64_t> expected_seq() const;

  EventSubscriberStats stats() const;

 private:
  class Sockets;
  explicit EventSubscriber(std::unique_ptr<Sockets> sockets);
  std::unique_ptr<Sockets> sockets_;
};

}  // namespace kvagent::events

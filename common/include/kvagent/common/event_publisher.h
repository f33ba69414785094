// EventPublisher: the ZMQ side of EVENTS.md for one publisher incarnation.
//
// Owns a PUB socket (live batches `[topic, seq u64 BE, payload]`) and an optional ROUTER replay
// socket (`[b"", start_seq]` -> retained batches `[b"", topic, seq, payload]` then the end marker
// `[b"", b"", ff*8, b""]`), both used only by the publisher's own thread. Callers hand events in
// through a bounded queue: Publish never blocks and never touches a socket; when the queue is
// full the events are dropped, counted, and the loss shows as a seq gap. seq starts at 0 and
// goes up by exactly one per batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvagent/common/kv_event.h"
#include "kvagent/common/status.h"

namespace kvagent::events {

struct EventPublisherOptions {
  std::string endpoint;         // PUB bind endpoint, e.g. tcp://0.0.0.0:5557 or ipc:///run/...
  std::string replay_endpoint;  // ROUTER bind endpoint; empty: no replay socket
  std::string topic;            // frame 0 of every batch; default empty
  std::optional<int64_t> dp_rank = 0;
  size_t replay_batches = 10000;  // batches retained for replay
  // ...and at most this many payload bytes of them (the newest batch is always kept): 10 000
  // full-size batches would otherwise hold gigabytes.
  size_t replay_max_bytes = size_t{256} << 20;
  size_t queue_capacity = 1 << 20;   // events (or encoded batches) waiting for the thread
  size_t max_batch_events = 512;     // events per published batch
  size_t max_batch_bytes = 1 << 20;  // payload bytes per published batch (well under 32 MiB)
  int sndhwm = 100000;
};

struct EventPublisherStats {
  uint64_t next_seq = 0;  // seq of the next batch to go out
  uint64_t published_batches = 0;
  uint64_t published_events = 0;
  uint64_t dropped_events = 0;   // queue overflow
  uint64_t dropped_batches = 0;  // seq values consumed by overflow (gaps)
  uint64_t replay_requests = 0;
  uint64_t bad_replay_requests = 0;
};

class EventPublisher {
 public:
  // Binds the sockets and starts the publisher thread. Fails with a clear message when an
  // endpoint cannot be bound (in use, bad address, missing directory).
  static Result<std::unique_ptr<EventPublisher>> Start(EventPublisherOptions options);

  ~EventPublisher();  // stops the thread after publishing what is queued; closes the sockets
  EventPublisher(const EventPublisher&) = delete;
  EventPublisher& operator=(const EventPublisher&) = delete;

  // Thread-safe and non-blocking. The publisher thread groups queued events into batches.
  void Publish(std::vector<KvEvent> events);
  void Publish(KvEvent event);

  // Thread-safe and non-blocking. Publishes an already encoded payload as one batch with the
  // next seq (the agent's relay republishes the master's batches this way).
  void PublishEncoded(std::string payload);

  // Blocks until everything queued before the call has been sent (or dropped). For tests and
  // orderly shutdown.
  void Flush();

  // The endpoints actually bound (a tcp port 0 / '*' resolved to the real port).
  std::string endpoint() const;
  std::string replay_endpoint() const;

  EventPublisherStats stats() const;

 private:
  class Thread;
  explicit EventPublisher(std::unique_ptr<Thread> thread);
  std::unique_ptr<Thread> thread_;
};

}  // namespace kvagent::events

// EventPublisher: the ZMQ side of the KV-event stream (docs/events.md) for one publisher
// run.
//
// Owns a PUB socket (live batches `[topic, seq u64 BE, payload]`) and an optional ROUTER replay
// socket (`[b"", start_seq]` -> retained batches `[b"", topic, seq, payload]` then the end marker
// `[b"", b"", ff*8, b""]`), both used only by the publisher's own thread. Callers hand events in
// through a bounded queue: Publish never blocks and never touches a socket; when the queue is
// full the events are dropped, counted, and the loss shows as a seq gap. seq starts at 0 and
// goes up by exactly one per batch.
//
// Batching: the thread takes everything queued and sends it as batches of up to
// max_batch_events / max_batch_bytes. The first event after a quiet period goes out at once;
// after a round that sent something the thread waits coalesce_window before it looks again, so
// a steady stream of operations costs one wake-up per window (not one per operation, which on
// a core shared with the request path would preempt it) and an event waits at most about one
// window. A publisher restarted without its state must publish
// AllBlocksCleared first (docs/events.md, "When each event is emitted"); that is the caller's job.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/status.h"
#include "kvagent/events/kv_event.h"

namespace kvagent::events {

struct EventPublisherOptions {
  std::string endpoint;  // PUB bind endpoint, e.g. tcp://0.0.0.0:5557 or ipc:///run/...
  // More endpoints the same PUB socket binds (e.g. tcp next to ipc): every subscriber, on
  // whichever endpoint, sees the same batches with the same seq.
  std::vector<std::string> extra_endpoints;
  std::string replay_endpoint;  // ROUTER bind endpoint; empty: no replay socket
  // Who may connect to the ipc:// endpoints: unset, only the owner (socket files mode 0600);
  // set, also this group (mode 0660, group-owned by it). Connecting needs write permission.
  std::optional<uint32_t> ipc_group;
  // With keys, every tcp:// endpoint (PUB and replay) is a CURVE server of those keys (the
  // events plane of the cluster secret, curve_auth.h): only members subscribe. ipc:// and
  // inproc:// endpoints stay plain (their file permissions decide), on a second PUB socket that
  // carries the same batches with the same seq.
  std::optional<CurvePlaneKeys> curve;
  std::string topic;                   // frame 0 of every batch; default empty
  std::optional<int64_t> dp_rank = 0;  // third element of every payload built here
  size_t replay_batches = 10000;       // batches retained for replay
  // ...and at most this many payload bytes of them (the newest batch is always kept): 10 000
  // full-size batches would otherwise hold gigabytes.
  size_t replay_max_bytes = size_t{256} << 20;
  // Events (or encoded payloads) waiting for the thread; what arrives beyond is dropped. The
  // thread may additionally hold one taken chunk of up to this size while it sends it.
  size_t queue_capacity = 1 << 20;
  size_t max_batch_events = 512;  // events per published batch
  // Payload bytes per published batch (well under Dynamo's 32 MiB); a single event larger than
  // this still goes out, alone. (512 of kvmaster's BlockStored events of ~160 bytes: 83 KB.)
  size_t max_batch_bytes = size_t{128} << 10;
  // What a subscriber that does not keep up (stopped, stalled, slow) may hold of this process's
  // memory: the batches queued for it, at most this many bytes. The PUB's high-water mark per
  // subscriber is this over max_batch_bytes (at least 16 batches); beyond it ZMQ drops that
  // subscriber's batches, which it sees as a gap and can replay. With 100 000 batches queued
  // per subscriber, one stuck router could take gigabytes of kvmaster's memory.
  size_t subscriber_queue_bytes = size_t{256} << 20;
  int sndhwm = 0;  // the PUB high-water mark (messages) instead, when > 0 (tests)
  // After sending, the thread gathers for this long before it sends again (rounded up to whole
  // milliseconds; 0: it looks again at once).
  std::chrono::microseconds coalesce_window{1000};
};

// The PUB's high-water mark per subscriber (messages) `options` make.
int SubscriberQueueBatches(const EventPublisherOptions& options);

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
  // Starts the publisher thread, which creates and binds the sockets (LINGER 0). Returns the
  // running publisher, owned by the caller, or INVALID_PARAMS with a message that says what to
  // do when an endpoint cannot be bound (in use, bad address, missing ipc directory).
  static Result<std::unique_ptr<EventPublisher>> Start(EventPublisherOptions options);

  // Stops the thread after it has sent what was queued, then closes the sockets (with LINGER 0
  // ZMQ may still discard what it had not yet written to a slow subscriber). Callers must not
  // call Publish concurrently with destruction.
  ~EventPublisher();
  EventPublisher(const EventPublisher&) = delete;
  EventPublisher& operator=(const EventPublisher&) = delete;

  // Thread-safe and non-blocking; takes ownership of the events. Events of one call stay in
  // order and ahead of later calls. When the queue is full the events that do not fit are
  // dropped (stats().dropped_events) and one seq is skipped where they would have been.
  // Precondition: text is valid UTF-8 (the write boundary validated it).
  void Publish(std::vector<KvEvent> events);
  void Publish(KvEvent event);
  // The same for events the caller keeps: they are encoded on the caller's thread and only
  // their bytes are queued (the same batches and bytes as Publish). A producer that reuses its
  // vector then allocates and frees its events' memory on its own thread only: kvmaster's loop,
  // whose events the publisher thread freed (three blocks per stored key, on the one malloc
  // arena), commits about a tenth more keys a second this way on two vCPUs.
  void EncodeAndPublish(std::span<const KvEvent> events);

  // Thread-safe and non-blocking. Publishes an already encoded payload, unchanged, as one batch
  // with the next seq (the agent's relay republishes the master's batches this way). It is not
  // decoded here: the caller vouches that it follows docs/events.md (DecodeEventBatch checks that).
  void PublishEncoded(std::string payload);

  // Blocks until everything queued before the call has been handed to ZMQ (or dropped). For
  // tests and orderly shutdown; a Flush after each Publish also makes each call its own batch.
  void Flush();

  // The endpoints actually bound (a tcp port 0 / '*' resolved to the real port).
  std::string endpoint() const;
  std::string replay_endpoint() const;
  std::vector<std::string> extra_endpoints() const;  // in the order of the options

  // Counters, readable from any thread at any time (each exact; not one consistent snapshot).
  EventPublisherStats stats() const;

 private:
  class Thread;
  explicit EventPublisher(std::unique_ptr<Thread> thread);
  std::unique_ptr<Thread> thread_;
};

}  // namespace kvagent::events

// EventRelay: the agent's copy of the master's KV-event stream (docs/events.md, "The agent's
// relay"; docs/architecture.md, "Events").
//
// Subscribes to the master's PUB (gaps repaired through the master's replay ROUTER) and
// republishes every batch, unchanged, on the agent's own PUB
// (ipc://<run-dir>/events.sock, optionally tcp too) with the agent's own contiguous seq from 0,
// and serves replay of its own stream on ipc://<run-dir>/events-replay.sock.
//
// Whenever the relay cannot vouch that its stream describes the store — at start, after a
// master restart (kReset), after a master gap that replay could not repair (kGap), after a
// switch to another master (an etcd failover), and when RequestResync() asks — it
// re-announces the store's content (from `list_content`, i.e. the master's ListKeys), then the
// master batches that arrived meanwhile. The first re-announce is AllBlocksCleared plus one
// BlockStored per stored object. Every later one publishes only the differences between the
// content and what the relay's own stream announced before (its downstream index): BlockStored
// for what is new or changed, and one BlockRemoved per object that is gone — so a failover that
// lost acknowledged puts reaches a router as a BlockRemoved per lost put, without clearing its
// index. Why an index fed by the relay then equals the master's key set at a quiet point:
//  - the relay first learns its position in the master's stream (a delivered batch; for a
//    quiet master, the master's retained history), so every batch the master publishes after
//    the scan starts is delivered to the relay (or reported as a gap, which starts over);
//  - the batches held back and published after the content are a contiguous run of the
//    master's stream that starts no later than the scan (batches still waiting when the scan
//    starts are dropped: the scan reflects them; holding them back would be harmless too).
//    A key no held-back event touches was the same throughout the scan, which lists it
//    exactly; for any other key the last held-back event about it (or an AllBlocksCleared
//    after it) decides, and that is the truth at the end.
//  - by differences, downstream holds after the content exactly what the index holds: what
//    it held before, corrected for every listed object as the pages arrive, minus (at the
//    end, before the held-back batches) what no page listed.
// A gap or reset during the scan, a failed or restarted page, or a resync request starts the
// re-announce over (by differences, what was published so far stays valid; a first
// re-announce that starts over publishes one more AllBlocksCleared).
//
// Threading: one relay thread owns the EventSubscriber (both master sockets) and calls
// `list_content`; the EventPublisher has its own thread. Every public method is thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/status.h"
#include "kvagent/events/kv_event.h"

namespace kvagent::relay {

// One page of the store's content.
struct ContentPage {
  // Per readable object, the BlockStored the master would publish for it (hashes or
  // object_key, parent, token_ids, block_size, lora_name, session_id, medium).
  std::vector<events::BlockStored> objects;
  uint64_t next_cursor = 0;  // 0: this was the last page
  bool restarted = false;    // the source started its scan over: pages so far are void
};

// Returns the page at `cursor` (0: the first). Called on the relay thread, one page at a time;
// an error is retried after EventRelayOptions::retry_interval (the re-announce starts over).
using ContentSource = std::function<Result<ContentPage>(uint64_t cursor)>;

// The BlockStored the master publishes for an object written without block metadata: hashes
// from the key (BlockHashFromKey, else []), object_key = key, session_id when non-empty,
// medium EXTERNAL. For a ListKeys page whose entries carry only key and session.
events::BlockStored AnnouncementFromKey(std::string_view key, std::string_view session_id);

// The master's event endpoints (PUB, replay ROUTER) once known; nullopt while not.
using MasterEventEndpoints = std::function<std::optional<std::pair<std::string, std::string>>()>;

struct EventRelayOptions {
  // The master's PUB, e.g. tcp://master:5557. Empty: asked from `master_endpoints` when set,
  // which the relay thread calls until it answers (the master tells its endpoints when the agent
  // registers; the relay stays `joining` meanwhile), or given later by SwitchMaster
  // (await_master).
  std::string master_events;
  MasterEventEndpoints master_endpoints;
  std::string master_events_replay;          // its replay ROUTER; empty: gaps are never repaired
  std::string endpoint;                      // our PUB, ipc://<run-dir>/events.sock (required)
  std::string replay_endpoint;               // our replay ROUTER; empty: none
  std::vector<std::string> extra_endpoints;  // more PUB endpoints (--events-tcp), same seq
  std::optional<uint32_t> ipc_group;         // who may connect to our ipc sockets (publisher)
  // With a cluster secret: the master's events-plane keys (our SUB and replay DEALER are CURVE
  // clients), and the same keys for our tcp:// endpoints (CURVE servers).
  std::optional<CurvePlaneKeys> curve;
  ContentSource list_content;     // the store's content (required)
  std::string topic;              // frame 0 of our batches
  size_t replay_batches = 10000;  // our retention for replay (docs/events.md)
  size_t replay_max_bytes = size_t{256} << 20;
  // How long to wait for a first live batch before asking the master's replay for its retained
  // history instead (a quiet master publishes nothing live; that replay can be large).
  std::chrono::milliseconds join_timeout{1000};
  std::chrono::milliseconds retry_interval{1000};  // after a failed content page
  std::chrono::milliseconds replay_timeout{2000};  // EventSubscriberOptions::replay_timeout
  std::chrono::milliseconds idle_probe_interval{1000};
  // Master batches held back during a re-announce, at most (payload bytes). Beyond it the
  // relay stops reading the master until the content is out; ZMQ and the master's replay
  // ring cover the rest, or a gap starts the re-announce over.
  size_t max_held_bytes = size_t{256} << 20;
  // The master is found later (discovery through etcd): start with no master endpoint and
  // follow the first one SwitchMaster names.
  bool await_master = false;
};

enum class RelayPhase {
  kJoining,  // finding its position in the master's stream
  kSyncing,  // re-announcing the content
  kLive,     // republishing master batches as they come
};

struct EventRelayStats {
  RelayPhase phase = RelayPhase::kJoining;
  // One past the last master seq the relay has taken (republished, held back, dropped before
  // a scan, or lost in a gap); nullopt before the first. Equal to the master's next seq and
  // phase kLive: every master batch so far has reached our publisher (see Flush).
  std::optional<uint64_t> master_next_seq;
  uint64_t next_seq = 0;              // our next seq
  uint64_t relayed_batches = 0;       // master batches republished
  uint64_t repaired_gaps = 0;         // master gaps (and idle-probe finds) filled by replay
  uint64_t replayed_batches = 0;      // master batches that came through replay
  uint64_t unrepaired_gaps = 0;       // master gaps replay could not fill (each: re-announce)
  uint64_t missing_batches = 0;       // master seqs lost in them
  uint64_t resets = 0;                // master restarts seen (each: re-announce)
  uint64_t reannounces = 0;           // completed re-announces (content + held batches)
  uint64_t clearing_reannounces = 0;  // re-announces begun with AllBlocksCleared (the first)
  uint64_t reannounce_restarts = 0;   // re-announces started over (gap, reset, failed page, ...)
  uint64_t objects_reannounced = 0;   // BlockStored events of completed re-announces
  uint64_t objects_removed = 0;       // BlockRemoved events of re-announces by differences
  uint64_t indexed_objects = 0;       // objects our consumers were told are stored
  uint64_t invalid_objects = 0;       // content entries skipped: they break docs/events.md
  uint64_t content_failures = 0;      // list_content errors
  uint64_t dropped_events = 0;        // our publisher's queue overflowed (gaps downstream)
  uint64_t malformed_messages = 0;    // master frames that broke the layout
  uint64_t unreadable_batches = 0;    // master batches strict consumers cannot read: left out
  uint64_t master_switches = 0;       // moves to another master's endpoints (SwitchMaster)
};

class EventRelay {
 public:
  // Binds our sockets, connects to the master's and starts the relay thread, which joins the
  // master's stream and then re-announces. Returns the running relay (owned by the caller),
  // or INVALID_PARAMS when a required option is missing or an endpoint cannot be bound or
  // parsed (the message names it and says what to do).
  static Result<std::unique_ptr<EventRelay>> Start(EventRelayOptions options);

  // Stops the relay thread (after a list_content call in progress returns), sends what was
  // queued, closes every socket and removes our ipc socket files.
  ~EventRelay();
  EventRelay(const EventRelay&) = delete;
  EventRelay& operator=(const EventRelay&) = delete;

  // Asks for a re-announce, e.g. when the agent's master link learns that the master restarted
  // (a restart seq alone cannot always reveal: EventSubscriber). Returns at once.
  void RequestResync();

  // Follows another master from now on (a new leader, found through etcd): the relay drops its
  // subscription, subscribes to `events` / `replay` (replay may be empty), joins that stream and
  // re-announces the store. Nothing is published from the previous master after the switch.
  // The same endpoints again change nothing. Returns at once.
  void SwitchMaster(std::string events, std::string replay);

  // Blocks until every batch counted in stats() before the call has been handed to ZMQ.
  void Flush();

  EventRelayStats stats() const;

  // Our bound endpoints (tcp port 0 resolved).
  std::string endpoint() const;
  std::string replay_endpoint() const;
  std::vector<std::string> extra_endpoints() const;

 private:
  class Thread;
  explicit EventRelay(std::unique_ptr<Thread> thread);
  std::unique_ptr<Thread> thread_;
};

// "joining", "syncing", "live": for kvctl stat and logs.
std::string_view RelayPhaseName(RelayPhase phase);

}  // namespace kvagent::relay

// EventRelay: one thread follows the master (EventSubscriber) and feeds our EventPublisher.
//
// The thread runs three phases (RelayPhase): join (learn our position in the master's
// stream), sync (AllBlocksCleared + content + held-back batches; see event_relay.h for why
// this converges) and live (PublishEncoded per delivered batch). A kGap or kReset while live,
// or a resync request, goes back to sync; anything that spoils a sync starts it over.
//
// Invariants:
//  - sub_ is created, used and destroyed on the relay thread only (one thread per socket).
//  - held_ is empty outside a sync; during a sync it holds, in seq order, every master batch
//    delivered since the current scan started.
//  - counters_ belongs to the relay thread; stats() reads the copy in shared_, refreshed by
//    the thread after every step, so a counter in stats() never runs ahead of the work.
#include "kvagent/relay/event_relay.h"
#include "kvagent/common/thread_policy.h"
#include "kvagent/common/thread_start.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <iterator>
#include <mutex>
#include <thread>
#include <variant>

#include <glog/logging.h>

#include "announcement.h"
#include "downstream_index.h"
#include "kvagent/events/event_publisher.h"
#include "kvagent/events/event_subscriber.h"

namespace kvagent::relay {
namespace {

using namespace std::chrono_literals;
using events::EventDelivery;
using Clock = std::chrono::steady_clock;

// Longest wait in one Next() call, so a stop request is seen within this.
constexpr auto kPoll = 100ms;
// Waiting deliveries dropped before a scan starts are bounded by this time, so a busy master
// cannot hold the scan off forever (dropping them only saves work; nothing depends on it).
constexpr auto kDropWindow = 200ms;
// Held-back batches handed to our publisher between two Flushes (its queue holds 1 << 20).
constexpr size_t kHeldPerFlush = 4096;
// Events per batch of the removals that end a re-announce by differences (a batch holds at
// most 512: docs/events.md).
constexpr size_t kEventsPerBatch = 512;
// Re-announces for master batches left out as unreadable: at most one per this.
constexpr auto kUnreadableReannounceEvery = 10s;

}  // namespace

std::string_view RelayPhaseName(RelayPhase phase) {
  switch (phase) {
    case RelayPhase::kJoining:
      return "joining";
    case RelayPhase::kSyncing:
      return "syncing";
    case RelayPhase::kLive:
      return "live";
  }
  return "unknown";
}

class EventRelay::Thread {
 public:
  Thread(EventRelayOptions options, std::unique_ptr<events::EventPublisher> publisher)
      : options_(std::move(options)), publisher_(std::move(publisher)) {}

  ~Thread() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
    publisher_.reset();  // sends what is queued, closes our sockets, removes their ipc files
  }

  // Starts the relay thread; returns once it has connected to the master (or failed to).
  Status Start() {
    return StartThreadAndWait(&thread_,
                              [this](std::promise<Status>* connected) { Run(connected); });
  }

  void RequestResync() { resync_.store(true, std::memory_order_relaxed); }

  void SwitchMaster(std::string events, std::string replay) {
    {
      std::lock_guard<std::mutex> lock(switch_mu_);
      if (events == target_events_ && replay == target_replay_) return;
      target_events_ = std::move(events);
      target_replay_ = std::move(replay);
    }
    switch_.store(true, std::memory_order_release);
    resync_.store(true, std::memory_order_relaxed);
  }
  void Flush() { publisher_->Flush(); }
  const events::EventPublisher& publisher() const { return *publisher_; }

  EventRelayStats stats() const {
    EventRelayStats s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = shared_;
    }
    const events::EventPublisherStats p = publisher_->stats();
    s.next_seq = p.next_seq;
    s.dropped_events = p.dropped_events;
    return s;
  }

 private:
  bool stopping() const { return stop_.load(std::memory_order_relaxed); }
  bool switching() const { return switch_.load(std::memory_order_acquire); }
  // The current step gives way: stopping, a new master to follow, or a resync asked for.
  bool interrupted() const {
    return stopping() || switching() || resync_.load(std::memory_order_relaxed);
  }

  Result<std::unique_ptr<events::EventSubscriber>> Subscribe(std::optional<uint64_t> from_seq) {
    events::EventSubscriberOptions o;
    o.endpoint = options_.master_events;
    o.replay_endpoint = options_.master_events_replay;
    o.from_seq = from_seq;
    o.replay_timeout = options_.replay_timeout;
    o.idle_probe_interval = options_.idle_probe_interval;
    o.curve = options_.curve;
    return events::EventSubscriber::Start(std::move(o));
  }

  void Run(std::promise<Status>* connected) {
    MarkThisThreadBackground();  // relayed events may wait a scheduler tick (thread_policy.h)
    {
      std::lock_guard<std::mutex> lock(switch_mu_);
      target_events_ = options_.master_events;
      target_replay_ = options_.master_events_replay;
    }
    if (options_.master_events.empty()) {
      // The first master's endpoints come later: from SwitchMaster (await_master: etcd) or from
      // the master's registration reply (master_endpoints).
      connected->set_value(Status::Ok());
    } else {
      auto sub = Subscribe(std::nullopt);
      connected->set_value(sub.ok() ? Status::Ok() : sub.status());  // not touched again
      if (!sub.ok()) return;
      sub_ = std::move(*sub);
    }
    bool said = false;
    while (!stopping()) {
      if (switching()) TakeSwitch();
      if (!sub_) {
        if (!options_.await_master && options_.master_endpoints && TryMasterEndpoints(&said)) {
          continue;
        }
        std::this_thread::sleep_for(kPoll / 4);  // no master to follow yet
        continue;
      }
      if (!Join()) continue;  // stopping or switching
      while (!stopping() && !switching()) {
        if (Sync()) Live();
      }
    }
    RetireSubscriber();
  }

  // Moves to the master SwitchMaster named: nothing more is read from the previous one.
  void TakeSwitch() {
    {
      std::lock_guard<std::mutex> lock(switch_mu_);
      options_.master_events = target_events_;
      options_.master_events_replay = target_replay_;
      switch_.store(false, std::memory_order_release);
    }
    RetireSubscriber();
    ++counters_.master_switches;
    LOG(INFO) << "event relay: following the master's events at " << options_.master_events
              << " (replay " << options_.master_events_replay << ")";
    auto sub = Subscribe(std::nullopt);
    if (!sub.ok()) {
      LOG(ERROR) << "event relay: cannot follow " << options_.master_events << ": "
                 << sub.status().ToString();
      return;
    }
    sub_ = std::move(*sub);
  }

  // Asks options_.master_endpoints once; true when it knows them and they connect.
  bool TryMasterEndpoints(bool* said) {
    SetPhase(RelayPhase::kJoining);
    if (auto e = options_.master_endpoints()) {
      options_.master_events = e->first;
      options_.master_events_replay = e->second;
      auto sub = Subscribe(std::nullopt);
      if (sub.ok()) {
        LOG(INFO) << "event relay: following kvmaster's events at " << e->first
                  << (e->second.empty() ? "" : ", replay at " + e->second)
                  << " (as its registration reply said)";
        sub_ = std::move(*sub);
        return true;
      }
      LOG_EVERY_N(ERROR, 100) << "event relay: kvmaster's event endpoint " << e->first
                              << " does not connect: " << sub.status().ToString()
                              << "; set --master-events and --master-events-replay";
      options_.master_events.clear();
    } else if (!*said) {
      LOG(INFO) << "event relay: waiting for kvmaster's event endpoints (it tells them when "
                   "this agent registers)";
      *said = true;
    }
    return false;
  }

  // ---- join ----------------------------------------------------------------------------------

  // Waits for a first delivery: from then on every master batch reaches us or is reported.
  // Returns false when stopped (or sent to another master) first.
  bool Join() {
    SetPhase(RelayPhase::kJoining);
    const Clock::time_point give_up_live = Clock::now() + options_.join_timeout;
    bool asked_history = false;
    while (!stopping() && !switching()) {
      Result<EventDelivery> d = sub_->Next(kPoll);
      RefreshStats();
      if (d.ok()) {
        // Older than the scan to come, which covers everything before it: dropped. Only its
        // position counts. A gap here loses nothing downstream (typically a restarted agent
        // asking a master whose retained history no longer reaches back to seq 0), so it is
        // neither logged as lost nor counted as unrepaired.
        Place(*d);
        LOG_IF(INFO, d->kind == EventDelivery::Kind::kGap)
            << "event relay: the master's retained history starts at seq " << d->gap_to + 1
            << "; the re-announce covers what came before";
        return true;
      }
      if (asked_history || options_.master_events_replay.empty() || Clock::now() < give_up_live) {
        continue;
      }
      // Nothing live: a quiet (or unreachable) master. Its retained history tells where its
      // stream stands; the subscriber keeps asking until the master answers.
      LOG(INFO) << "event relay: no live batch from " << options_.master_events << " within "
                << options_.join_timeout.count() << " ms; asking " << options_.master_events_replay
                << " for its retained history";
      auto history = Subscribe(uint64_t{0});
      if (!history.ok()) {  // cannot happen: the same endpoints connected before
        LOG(ERROR) << "event relay: " << history.status().ToString();
        continue;
      }
      RetireSubscriber();
      sub_ = std::move(*history);
      asked_history = true;
    }
    return false;
  }

  // ---- sync (re-announce) --------------------------------------------------------------------

  // One re-announce. Returns true when it completed; false when it must start over (or stop).
  bool Sync() {
    SetPhase(RelayPhase::kSyncing);
    resync_.store(false, std::memory_order_relaxed);
    DropWaiting();
    // Its content covers every master batch left out as unreadable so far.
    if (unreadable_pending_) {
      unreadable_pending_ = false;
      last_unreadable_reannounce_ = Clock::now();
    }
    // By differences when the index says what consumers hold; else from a clean slate.
    const bool by_differences = index_.valid();
    if (!by_differences) {
      publisher_->Publish(events::AllBlocksCleared{});
      index_.Clear();
      ++counters_.clearing_reannounces;
    }
    index_.BeginScan();
    held_.clear();
    held_bytes_ = 0;
    uint64_t objects = 0;
    uint64_t cursor = 0;
    while (true) {
      if (stopping()) return false;
      Result<ContentPage> page = options_.list_content(cursor);
      if (!page.ok()) {
        ++counters_.content_failures;
        LOG_EVERY_N(WARNING, 10) << "event relay: cannot list the store's content (cursor "
                                 << cursor << "): " << page.status().ToString() << "; retrying in "
                                 << options_.retry_interval.count() << " ms";
        return StartOver(/*wait=*/true);
      }
      if (page->restarted) {
        LOG(INFO) << "event relay: the content scan restarted; re-announcing from the start";
        return StartOver(/*wait=*/false);
      }
      objects += Announce(std::move(page->objects));
      // Backpressure: the content must not overflow our publisher's queue (a drop would be
      // a gap nobody can repair).
      publisher_->Flush();
      if (!HoldBack() || resync_.load(std::memory_order_relaxed)) {
        return StartOver(/*wait=*/false);
      }
      if (page->next_cursor == 0) break;
      cursor = page->next_cursor;
    }
    // What no page listed is gone from the store (on a clean slate: nothing).
    std::vector<events::KvEvent> gone = index_.EndScan();
    const uint64_t removed = gone.size();
    for (size_t at = 0; at < gone.size(); at += kEventsPerBatch) {
      const size_t end = std::min(gone.size(), at + kEventsPerBatch);
      publisher_->Publish(std::vector<events::KvEvent>(
          std::make_move_iterator(gone.begin() + at), std::make_move_iterator(gone.begin() + end)));
      publisher_->Flush();
    }
    index_.Vouch();
    const size_t held = held_.size();
    size_t published = 0;
    for (size_t i = 0; i < held; ++i) {
      // A master's first batch (seq 0: AllBlocksCleared, then the objects it restored) came
      // before any ListKeys it answered: the scan covers it, and by differences its clear
      // would only wipe what consumers hold to re-store the same objects.
      if (by_differences && held_[i].seq == 0 && StartsWithClear(held_[i].payload)) continue;
      if (!index_.ApplyPayload(held_[i].payload)) {
        LeaveOutUnreadable(held_[i].seq);
        continue;
      }
      publisher_->PublishEncoded(std::move(held_[i].payload));
      // Many small held batches must not overflow our publisher's queue either.
      if (++published % kHeldPerFlush == 0) publisher_->Flush();
    }
    held_.clear();
    held_bytes_ = 0;
    counters_.relayed_batches += published;
    ++counters_.reannounces;
    counters_.objects_reannounced += objects;
    counters_.objects_removed += removed;
    if (by_differences) {
      LOG(INFO) << "event relay: re-announced the store by differences: " << objects
                << " object(s) stored or changed, " << removed << " removed (+" << held
                << " master batches held back); now live";
    } else {
      LOG(INFO) << "event relay: re-announced " << objects << " objects (+" << held
                << " master batches held back); now live";
    }
    RefreshStats();
    return true;
  }

  static bool StartsWithClear(std::string_view payload) {
    bool first = true, clear = false;
    ForEachEvent(payload, [&](const EventDigest& e) {
      if (first) clear = e.type == EventDigest::Type::kCleared;
      first = false;
    });
    return clear;
  }

  // Publishes what consumers lack of the valid objects of one page (the index decides);
  // returns how many BlockStored that was.
  uint64_t Announce(std::vector<events::BlockStored> objects) {
    std::vector<events::KvEvent> out;
    out.reserve(objects.size());
    for (events::BlockStored& e : objects) {
      Status valid = CheckAnnouncement(e);
      if (!valid.ok()) {
        ++counters_.invalid_objects;
        LOG_EVERY_N(WARNING, 100) << "event relay: not re-announcing object \""
                                  << e.object_key.value_or("") << "\": " << valid.ToString();
        continue;
      }
      index_.Listed(std::move(e), &out);
    }
    uint64_t stored = 0;
    for (const events::KvEvent& e : out) stored += std::holds_alternative<events::BlockStored>(e);
    if (!out.empty()) publisher_->Publish(std::move(out));
    return stored;
  }

  // Moves the deliveries ready now into held_ (up to max_held_bytes). Returns false when a gap
  // or reset among them spoils the scan.
  bool HoldBack() {
    while (held_bytes_ < options_.max_held_bytes) {
      Result<EventDelivery> d = sub_->Next(1ms);
      if (!d.ok()) break;  // nothing more ready
      if (!Count(*d)) return false;
      if (Covered(*d)) continue;
      held_bytes_ += d->payload.size();
      held_.push_back(HeldBatch{d->seq, std::move(d->payload)});
    }
    RefreshStats();
    return true;
  }

  // Drops the deliveries waiting before a scan starts: the scan will reflect them.
  void DropWaiting() {
    const Clock::time_point until = Clock::now() + kDropWindow;
    while (Clock::now() < until) {
      Result<EventDelivery> d = sub_->Next(1ms);
      if (!d.ok()) break;
      Count(*d);
    }
  }

  bool StartOver(bool wait) {
    ++counters_.reannounce_restarts;
    held_.clear();
    held_bytes_ = 0;
    if (wait) {
      // Keep reading the master meanwhile (dropping: the next scan reflects it), so our
      // position holds and ZMQ does not queue up.
      const Clock::time_point until = Clock::now() + options_.retry_interval;
      while (!interrupted() && Clock::now() < until) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
        Result<EventDelivery> d = sub_->Next(std::min<std::chrono::milliseconds>(kPoll, left));
        if (d.ok()) Count(*d);
      }
    }
    RefreshStats();
    return false;
  }

  // ---- live ----------------------------------------------------------------------------------

  void Live() {
    SetPhase(RelayPhase::kLive);
    while (!stopping() && !resync_.load(std::memory_order_relaxed)) {
      if (UnreadableReannounceDue()) return;
      Result<EventDelivery> d = sub_->Next(kPoll);
      if (d.ok()) {
        if (!Count(*d)) return;  // re-announce
        if (Covered(*d)) continue;
        if (!index_.ApplyPayload(d->payload)) {
          LeaveOutUnreadable(d->seq);
          continue;
        }
        publisher_->PublishEncoded(std::move(d->payload));
        ++counters_.relayed_batches;
      }
      RefreshStats();
    }
  }

  // A master batch strict consumers cannot read (a kvmaster of another version, or a broken
  // one): republished, it would be dropped by every consumer (or stop one), and what it changed
  // would be missing from their indexes with nothing to tell. It is left out; a re-announce
  // brings its changes from the store's content, at most one per kUnreadableReannounceEvery
  // (a master that sends nothing else is not scanned at every batch).
  void LeaveOutUnreadable(uint64_t seq) {
    ++counters_.unreadable_batches;
    unreadable_pending_ = true;
    LOG_EVERY_N(WARNING, 100) << "event relay: the master's batch seq " << seq
                              << " is not one strict consumers can read (docs/events.md); left "
                                 "out, its changes follow in a re-announce of the store's "
                                 "content (is kvmaster the same version as this agent?)";
  }
  bool UnreadableReannounceDue() const {
    return unreadable_pending_ &&
           (!last_unreadable_reannounce_ ||
            Clock::now() - *last_unreadable_reannounce_ >= kUnreadableReannounceEvery);
  }

  // A batch of a restarted master from before (or at) the seq that revealed the restart: the
  // subscriber repairs the new run from seq 0, so such batches may arrive after the
  // re-announce that followed, whose scan already reflects them. Published then, an old event
  // would overwrite newer state (a BlockRemoved of a key stored again since, or the new master's
  // opening AllBlocksCleared wiping what consumers rightly hold): they are dropped.
  bool Covered(const EventDelivery& d) const {
    return d.kind == EventDelivery::Kind::kBatch && covered_through_ && d.seq <= *covered_through_;
  }

  // Where the master's stream stands after `d`.
  void Place(const EventDelivery& d) {
    switch (d.kind) {
      case EventDelivery::Kind::kBatch:
        counters_.master_next_seq = d.seq + 1;
        return;
      case EventDelivery::Kind::kGap:
        counters_.master_next_seq = d.gap_to + 1;
        return;
      case EventDelivery::Kind::kReset:
        counters_.master_next_seq = 0;  // the new run is followed from its start
        return;
    }
  }

  // Counts a gap or reset (logging why a re-announce follows). Returns true for a batch.
  bool Count(const EventDelivery& d) {
    Place(d);
    switch (d.kind) {
      case EventDelivery::Kind::kBatch:
        return true;
      case EventDelivery::Kind::kGap:
        ++counters_.unrepaired_gaps;
        counters_.missing_batches += d.gap_to - d.seq + 1;
        LOG(WARNING) << "event relay: master batches " << d.seq << ".." << d.gap_to
                     << " are lost (not in the master's replay ring); re-announcing the store";
        return false;
      case EventDelivery::Kind::kReset:
        ++counters_.resets;
        covered_through_ = d.seq;
        LOG(WARNING) << "event relay: the master's event stream restarted (seq " << d.previous_seq
                     << " -> " << d.seq << "); re-announcing the store";
        return false;
    }
    return false;
  }

  // ---- stats ---------------------------------------------------------------------------------

  void SetPhase(RelayPhase phase) {
    counters_.phase = phase;
    RefreshStats();
  }

  // Folds the stats of a subscriber about to be replaced into retired_.
  void RetireSubscriber() {
    covered_through_.reset();  // a new subscriber numbers from what it is given
    if (!sub_) return;
    const events::EventSubscriberStats s = sub_->stats();
    retired_.gaps_repaired += s.gaps_repaired;
    retired_.replayed_batches += s.replayed_batches;
    retired_.malformed_messages += s.malformed_messages;
    sub_.reset();
  }

  void RefreshStats() {
    EventRelayStats s = counters_;
    s.indexed_objects = index_.size();
    if (sub_) {
      const events::EventSubscriberStats sub = sub_->stats();
      s.repaired_gaps = retired_.gaps_repaired + sub.gaps_repaired;
      s.replayed_batches = retired_.replayed_batches + sub.replayed_batches;
      s.malformed_messages = retired_.malformed_messages + sub.malformed_messages;
    }
    std::lock_guard<std::mutex> lock(mu_);
    shared_ = s;
  }

  EventRelayOptions options_;
  std::unique_ptr<events::EventPublisher> publisher_;  // thread-safe; outlives thread_
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> resync_{false};
  std::atomic<bool> switch_{false};
  std::mutex switch_mu_;
  std::string target_events_;  // guarded by switch_mu_: the master to follow
  std::string target_replay_;

  // Relay thread only.
  std::unique_ptr<events::EventSubscriber> sub_;
  DownstreamIndex index_;                    // what our consumers were told is stored
  std::optional<uint64_t> covered_through_;  // see Covered()
  struct HeldBatch {
    uint64_t seq = 0;  // the master's
    std::string payload;
  };
  std::vector<HeldBatch> held_;  // master batches held back during a sync
  size_t held_bytes_ = 0;
  // Master batches were left out as unreadable since the last re-announce began.
  bool unreadable_pending_ = false;
  std::optional<Clock::time_point> last_unreadable_reannounce_;  // when one last began
  EventRelayStats counters_;
  events::EventSubscriberStats retired_;  // of subscribers replaced by Join

  mutable std::mutex mu_;
  EventRelayStats shared_;  // guarded by mu_
};

Result<std::unique_ptr<EventRelay>> EventRelay::Start(EventRelayOptions options) {
  if (options.master_events.empty() && !options.await_master && !options.master_endpoints) {
    return InvalidParams("event relay: no master event endpoint; set --master-events");
  }
  if (!options.list_content) {
    return InvalidParams("event relay: no content source; the agent must supply list_content");
  }
  events::EventPublisherOptions p;
  p.endpoint = options.endpoint;
  p.replay_endpoint = options.replay_endpoint;
  p.extra_endpoints = options.extra_endpoints;
  p.ipc_group = options.ipc_group;
  p.curve = options.curve;
  p.topic = options.topic;
  p.replay_batches = options.replay_batches;
  p.replay_max_bytes = options.replay_max_bytes;
  auto publisher = events::EventPublisher::Start(std::move(p));
  if (!publisher.ok()) return publisher.status();
  auto thread = std::make_unique<Thread>(std::move(options), std::move(*publisher));
  KVAGENT_RETURN_IF_ERROR(thread->Start());
  return std::unique_ptr<EventRelay>(new EventRelay(std::move(thread)));
}

EventRelay::EventRelay(std::unique_ptr<Thread> thread) : thread_(std::move(thread)) {}
EventRelay::~EventRelay() = default;

void EventRelay::RequestResync() { thread_->RequestResync(); }
void EventRelay::SwitchMaster(std::string events, std::string replay) {
  thread_->SwitchMaster(std::move(events), std::move(replay));
}
void EventRelay::Flush() { thread_->Flush(); }
EventRelayStats EventRelay::stats() const { return thread_->stats(); }
std::string EventRelay::endpoint() const { return thread_->publisher().endpoint(); }
std::string EventRelay::replay_endpoint() const { return thread_->publisher().replay_endpoint(); }
std::vector<std::string> EventRelay::extra_endpoints() const {
  return thread_->publisher().extra_endpoints();
}

}  // namespace kvagent::relay

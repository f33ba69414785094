// Test-side pieces for the relay tests: a real master (MasterService + EventPublisher, the
// same pair kvmaster runs) that the test drives from its own thread, a link between that
// master's PUB and the relay that can lose batches on purpose, and a downstream index fed by a
// strict subscriber on the relay's socket. Every socket here is used by the thread that
// created it.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "event_test_support.h"
#include "kvagent/events/event_subscriber.h"
#include "kvagent/relay/event_relay.h"
#include "master_test_util.h"

namespace kvagent::relay::testing {

using namespace std::chrono_literals;
using events::testing::TempDir;
using MasterKeys = std::map<std::string, std::string>;  // key -> session ("" untagged)

// Polls `done` until it holds; false after ~20 s (the caller fails the test). A bound on a
// wait, never an assertion about how long something took.
inline bool WaitFor(const std::function<bool()>& done) {
  for (int i = 0; i < 4000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

// A master: the metadata service and its event publisher (ipc in `dir`), guarded by one
// mutex so the test thread and the relay thread (through Content()) can both use it. After
// each operation the events it produced are handed to the publisher, as kvmaster does.
class Master {
 public:
  explicit Master(const TempDir& dir, size_t replay_batches = 10000)
      : dir_(dir), replay_batches_(replay_batches) {
    Restart();
  }

  // A new master (a new master epoch) without state: new service, new publisher (seq from 0)
  // bound on the same endpoints. Its first batch is AllBlocksCleared.
  void Restart() {
    std::lock_guard<std::mutex> lock(mu_);
    publisher_.reset();
    cluster_ = std::make_unique<master::testing::Cluster>(master::MasterOptions{}, 2, 64 << 20);
    events::EventPublisherOptions o = events::testing::IpcPublisherOptions(dir_);
    o.endpoint = dir_.Ipc("master-events.sock");
    o.replay_endpoint = dir_.Ipc("master-replay.sock");
    o.replay_batches = replay_batches_;
    publisher_ = events::testing::StartPublisher(o);
    PublishLocked();
  }

  void Put(const std::vector<std::string>& keys, const std::vector<std::string>& sessions = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    cluster_->Put(cluster_->agents[0], keys, 64, sessions);
    PublishLocked();
  }
  void Remove(const std::vector<std::string>& keys) {
    std::lock_guard<std::mutex> lock(mu_);
    cluster_->Remove(keys, /*force=*/true);
    PublishLocked();
  }
  void RemoveAll() {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_TRUE(cluster_->svc->RemoveAll(/*force=*/true).ok());
    PublishLocked();
  }
  // Puts `keys`, publishing their events as a batch strict consumers cannot read (a kvmaster of
  // another version, or a broken one): with `trailing`, the well-formed batch and one byte after
  // it (readers take every event, then fail); else a top-level array of 4 elements (readers
  // fail before the first event).
  void PutUnreadable(const std::vector<std::string>& keys, bool trailing) {
    std::lock_guard<std::mutex> lock(mu_);
    cluster_->Put(cluster_->agents[0], keys, 64);
    std::string payload = events::EncodeEventBatch(events::EventBatch{1.0, cluster_->Events(), 0});
    if (!trailing) payload[0] = '\x94';  // was 0x93, a fixarray of 3: the nil below is its 4th
    payload.push_back('\xc0');
    publisher_->PublishEncoded(std::move(payload));
    publisher_->Flush();
  }
  // A batch without events: moves the stream on without changing any index.
  void PublishEmptyBatch() {
    std::lock_guard<std::mutex> lock(mu_);
    publisher_->PublishEncoded(events::EncodeEventBatch(events::EventBatch{1.0, {}, 0}));
    publisher_->Flush();
  }

  MasterKeys Keys() const {
    std::lock_guard<std::mutex> lock(mu_);
    return master::testing::ListAll(*cluster_->svc);
  }
  uint64_t next_seq() const {
    std::lock_guard<std::mutex> lock(mu_);
    return publisher_->stats().next_seq;
  }
  std::string events_endpoint() const { return dir_.Ipc("master-events.sock"); }
  std::string replay_endpoint() const { return dir_.Ipc("master-replay.sock"); }

  // The relay's content source: ListKeys pages of `limit`, each key as the BlockStored the
  // master publishes for it. `between_pages`, when set, runs on the relay thread after each
  // page is taken (outside the lock): lets a test change the master in the middle of a scan.
  ContentSource Content(uint32_t limit = 1000, std::function<void(uint64_t)> between_pages = {}) {
    return [this, limit, between_pages](uint64_t cursor) -> Result<ContentPage> {
      ContentPage page;
      {
        std::lock_guard<std::mutex> lock(mu_);
        master::ListPage listed;
        KVAGENT_RETURN_IF_ERROR(cluster_->svc->ListKeys(cursor, limit, &listed));
        for (const master::ListedKey& k : listed.keys) {
          page.objects.push_back(AnnouncementFromKey(k.key, k.session_id));
        }
        page.next_cursor = listed.next_cursor;
        page.restarted = listed.restarted;
      }
      if (between_pages) between_pages(cursor);
      return page;
    };
  }

 private:
  void PublishLocked() {
    publisher_->Publish(cluster_->Events());
    publisher_->Flush();
  }

  const TempDir& dir_;
  const size_t replay_batches_;
  mutable std::mutex mu_;
  std::unique_ptr<master::testing::Cluster> cluster_;
  std::unique_ptr<events::EventPublisher> publisher_;
};

// The relay's view of the master's PUB: a thread that forwards every live message from the
// master's PUB to its own PUB (ipc in `dir`), except the ones it was told to lose.
class Link {
 public:
  Link(const TempDir& dir, const std::string& master_events) : endpoint_(dir.Ipc("link.sock")) {
    std::promise<void> bound;
    thread_ = std::thread([this, master_events, &bound] { Run(master_events, &bound); });
    bound.get_future().wait();
  }
  ~Link() {
    stop_.store(true);
    thread_.join();
  }

  // Loses the next `n` live messages.
  void Lose(int n) { to_lose_.fetch_add(n); }
  int lost() const { return lost_.load(); }
  int forwarded() const { return forwarded_.load(); }
  const std::string& endpoint() const { return endpoint_; }

 private:
  void Run(const std::string& master_events, std::promise<void>* bound) {
    zmq::context_t context(1);
    zmq::socket_t sub(context, zmq::socket_type::sub);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(master_events);
    zmq::socket_t pub(context, zmq::socket_type::pub);
    pub.set(zmq::sockopt::linger, 0);
    pub.bind(endpoint_);
    bound->set_value();
    while (!stop_.load()) {
      auto frames = events::testing::ReceiveFrames(sub, 20ms);
      if (!frames) continue;
      int n = to_lose_.load();
      if (n > 0 && to_lose_.compare_exchange_strong(n, n - 1)) {
        ++lost_;
        continue;
      }
      events::testing::SendFrames(pub, *frames);
      ++forwarded_;
    }
  }

  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::atomic<int> to_lose_{0};
  std::atomic<int> lost_{0};
  std::atomic<int> forwarded_{0};
  std::thread thread_;
};

// What a KV-aware router sees on the relay's socket: a strict subscriber from our seq 0 and
// an index by object_key built from its events only.
class Downstream {
 public:
  Downstream(const std::string& endpoint, const std::string& replay_endpoint) {
    events::EventSubscriberOptions o;
    o.endpoint = endpoint;
    o.replay_endpoint = replay_endpoint;
    o.from_seq = 0;
    o.decode = true;
    auto sub = events::EventSubscriber::Start(o);
    EXPECT_TRUE(sub.ok()) << sub.status().ToString();
    if (sub.ok()) sub_ = std::move(*sub);
  }

  // Reads until the batch with seq `last` has been applied. Every delivery must be a batch
  // that decodes strictly, seq contiguous from 0.
  void CatchUp(uint64_t last) {
    ASSERT_TRUE(sub_);
    while (batches_ == 0 || next_seq_ <= last) {
      auto d = sub_->Next(20s);
      ASSERT_TRUE(d.ok()) << "waiting for our seq " << last << ": " << d.status().ToString();
      ASSERT_EQ(d->kind, events::EventDelivery::Kind::kBatch)
          << "downstream saw a gap or reset at seq " << d->seq;
      ASSERT_EQ(d->seq, next_seq_);
      ASSERT_TRUE(d->batch) << d->decode_status.ToString();
      for (const events::KvEvent& e : d->batch->events) {
        if (std::holds_alternative<events::AllBlocksCleared>(e)) ++cleared_;
        stored_ += std::holds_alternative<events::BlockStored>(e);
        if (const auto* r = std::get_if<events::BlockRemoved>(&e); r && r->object_key) {
          removed_.insert(*r->object_key);
        }
      }
      index_.Apply(d->batch->events);
      payloads_.push_back(d->payload);
      ++batches_;
      ++next_seq_;
    }
  }

  const MasterKeys& keys() const { return index_.keys(); }
  int cleared() const { return cleared_; }
  uint64_t stored() const { return stored_; }
  // The object keys some BlockRemoved named.
  const std::set<std::string>& removed() const { return removed_; }
  const std::vector<std::string>& payloads() const { return payloads_; }

 private:
  std::unique_ptr<events::EventSubscriber> sub_;
  master::testing::StreamIndex index_;
  uint64_t next_seq_ = 0;
  uint64_t batches_ = 0;
  int cleared_ = 0;
  uint64_t stored_ = 0;
  std::set<std::string> removed_;
  std::vector<std::string> payloads_;
};

// Relay options following `master_events` (the master's PUB or a Link) with the master's own
// replay, serving ipc sockets in `dir`.
inline EventRelayOptions RelayOptions(const TempDir& dir, const std::string& master_events,
                                      const std::string& master_replay, ContentSource content) {
  EventRelayOptions o;
  o.master_events = master_events;
  o.master_events_replay = master_replay;
  o.endpoint = dir.Ipc("events.sock");
  o.replay_endpoint = dir.Ipc("events-replay.sock");
  o.list_content = std::move(content);
  o.join_timeout = 200ms;
  o.retry_interval = 50ms;
  o.idle_probe_interval = 200ms;
  return o;
}

inline std::unique_ptr<EventRelay> StartRelay(EventRelayOptions options) {
  auto relay = EventRelay::Start(std::move(options));
  EXPECT_TRUE(relay.ok()) << relay.status().ToString();
  return relay.ok() ? std::move(*relay) : nullptr;
}

// A quiet point: the relay is live and has taken every batch the master published, and the
// downstream has read everything the relay published. Fails the test when that never comes.
inline void Settle(const Master& master, EventRelay& relay, Downstream& downstream) {
  const bool caught_up = WaitFor([&] {
    const EventRelayStats s = relay.stats();
    return s.phase == RelayPhase::kLive && s.master_next_seq == master.next_seq();
  });
  const EventRelayStats s = relay.stats();
  ASSERT_TRUE(caught_up) << "relay phase " << RelayPhaseName(s.phase) << ", master next seq "
                         << master.next_seq() << ", relay took up to "
                         << s.master_next_seq.value_or(0);
  relay.Flush();
  downstream.CatchUp(relay.stats().next_seq - 1);
}

// A relay following `master` (through `master_events` when not empty, e.g. a Link; the
// master's own replay either way), serving ipc sockets in `dir`, and a Downstream on them.
class Rig {
 public:
  Rig(const TempDir& dir, const Master& master, ContentSource content,
      const std::string& master_events = "",
      const std::function<void(EventRelayOptions&)>& adjust = {})
      : master_(master) {
    EventRelayOptions o =
        RelayOptions(dir, master_events.empty() ? master.events_endpoint() : master_events,
                     master.replay_endpoint(), std::move(content));
    if (adjust) adjust(o);
    relay = StartRelay(std::move(o));
    if (relay)
      downstream = std::make_unique<Downstream>(relay->endpoint(), relay->replay_endpoint());
  }
  bool started() const { return relay && downstream; }
  // Settle() and the downstream index equals the master's key set (sessions included).
  void Converge() {
    Settle(master_, *relay, *downstream);
    EXPECT_EQ(downstream->keys(), master_.Keys());
  }
  EventRelayStats stats() const { return relay->stats(); }

  std::unique_ptr<EventRelay> relay;
  std::unique_ptr<Downstream> downstream;

 private:
  const Master& master_;
};

}  // namespace kvagent::relay::testing

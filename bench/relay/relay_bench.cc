// relay_bench: what the agent's event relay costs, next to baselines measured in the same run.
// Prints `BENCH <name> <value> <unit>` lines.
//
//  forward     batches/s from a master-side EventPublisher to a SUB on the relay's ipc socket
//              (master PUB -> relay SUB -> relay PUB -> SUB), vs the same publisher with the
//              SUB attached directly (one hop fewer: the ceiling). 64 typical events a batch,
//              pre-encoded, so both runs measure transport only.
//  reannounce  objects/s of re-announces of a MasterService holding 200 000 keys (ListKeys
//              pages -> the downstream index -> our publisher -> a draining SUB), vs ListKeys
//              paging alone (the scan a re-announce cannot avoid): the first (clearing: every
//              object published and indexed) and a later one by differences (every object
//              compared with the index; none changed, nothing published).
//
// The machine is small and shared: absolute numbers move with whatever else runs (compiles);
// the ratios to the baselines are the meaningful part.
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "kvagent/events/event_publisher.h"
#include "kvagent/master/master_service.h"
#include "kvagent/relay/event_relay.h"

namespace {

using namespace kvagent;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

void Bench(const char* name, double value, const char* unit) {
  std::printf("BENCH %s %.1f %s\n", name, value, unit);
  std::fflush(stdout);
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// A private directory for ipc sockets, removed at exit.
struct Dir {
  Dir() {
    std::string t = (std::filesystem::temp_directory_path() / "relay-bench-XXXXXX").string();
    if (mkdtemp(t.data())) path = t;
  }
  ~Dir() { std::filesystem::remove_all(path); }
  std::string Ipc(const char* name) const { return "ipc://" + path + "/" + name; }
  std::string path;
};

// A SUB that counts the messages it receives, on its own thread.
class Sink {
 public:
  explicit Sink(const std::string& endpoint) : thread_([this, endpoint] { Run(endpoint); }) {}
  ~Sink() {
    stop_ = true;
    thread_.join();
  }
  uint64_t count() const { return count_.load(); }
  bool WaitFor(uint64_t count, std::chrono::seconds limit = 60s) const {
    const auto until = Clock::now() + limit;
    while (this->count() < count) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(100us);
    }
    return true;
  }

 private:
  void Run(const std::string& endpoint) {
    zmq::context_t context(1);
    zmq::socket_t sub(context, zmq::socket_type::sub);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::rcvhwm, 1000000);
    sub.set(zmq::sockopt::subscribe, "");
    sub.set(zmq::sockopt::rcvtimeo, 20);
    sub.connect(endpoint);
    zmq::message_t frame;
    while (!stop_) {
      if (!sub.recv(frame)) continue;
      if (!frame.more()) count_.fetch_add(1);  // the last frame of a message
    }
  }
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> count_{0};
  std::thread thread_;
};

std::string TypicalPayload() {
  events::EventBatch batch{1.0, {}, 0};
  for (uint64_t i = 0; i < 64; ++i) {
    events::BlockStored e;
    e.block_hashes = {events::BlockHash::Unsigned(0x9e3779b97f4a7c15ULL * (i + 1))};
    for (uint32_t t = 0; t < 16; ++t) e.token_ids.push_back(static_cast<uint32_t>(i * 16 + t));
    e.block_size = 16;
    e.session_id = "session-" + std::to_string(i % 10);
    e.object_key = "kv-block-" + std::to_string(i);  // kvmaster always sends it
    batch.events.push_back(e);
  }
  return events::EncodeEventBatch(batch);
}

// Publishes `n` copies of `payload`, paced to stay below the high-water marks; returns the
// time until the sink has received as many.
double Pump(events::EventPublisher& master, const Sink& sink, const std::string& payload,
            uint64_t n) {
  const uint64_t base = sink.count();
  const auto start = Clock::now();
  for (uint64_t i = 0; i < n; ++i) {
    master.PublishEncoded(payload);
    if (i % 1000 == 999) {
      // At most ~20 000 batches in flight end to end (the HWMs are 100 000).
      while (sink.count() + 20000 < base + i) std::this_thread::sleep_for(50us);
    }
  }
  if (!sink.WaitFor(base + n)) std::printf("# the sink did not receive every batch\n");
  return Seconds(start);
}

// Publishes empty batches until `sink` receives one (its SUB has joined).
void Join(events::EventPublisher& master, const Sink& sink) {
  const std::string empty = events::EncodeEventBatch(events::EventBatch{1.0, {}, 0});
  for (int i = 0; i < 20000 && sink.count() == 0; ++i) {
    master.PublishEncoded(empty);
    std::this_thread::sleep_for(1ms);
  }
}

void BenchForward() {
  Dir dir;
  events::EventPublisherOptions mo;
  mo.endpoint = dir.Ipc("master.sock");
  mo.replay_endpoint = dir.Ipc("master-replay.sock");
  auto master = events::EventPublisher::Start(mo);
  if (!master.ok()) {
    std::printf("# %s\n", master.status().ToString().c_str());
    return;
  }
  const std::string payload = TypicalPayload();
  const uint64_t n = 20000;
  {
    Sink direct((*master)->endpoint());
    Join(**master, direct);
    Pump(**master, direct, payload, n / 4);  // warm-up
    const double s = Pump(**master, direct, payload, n);
    Bench("relay.forward.baseline_direct", n / s, "batches/s");
  }
  relay::EventRelayOptions ro;
  ro.master_events = mo.endpoint;
  ro.master_events_replay = mo.replay_endpoint;
  ro.endpoint = dir.Ipc("events.sock");
  ro.replay_endpoint = dir.Ipc("events-replay.sock");
  ro.list_content = [](uint64_t) -> Result<relay::ContentPage> { return relay::ContentPage{}; };
  auto relay = relay::EventRelay::Start(ro);
  if (!relay.ok()) {
    std::printf("# %s\n", relay.status().ToString().c_str());
    return;
  }
  Sink downstream((*relay)->endpoint());
  Join(**master, downstream);
  while ((*relay)->stats().phase != relay::RelayPhase::kLive) std::this_thread::sleep_for(1ms);
  Pump(**master, downstream, payload, n / 4);  // warm-up
  const double s = Pump(**master, downstream, payload, n);
  Bench("relay.forward.through_relay", n / s, "batches/s");
  Bench("relay.forward.batch_bytes", double(payload.size()), "bytes");
  const relay::EventRelayStats st = (*relay)->stats();
  std::printf("# relay: relayed %llu batches, %llu repaired gaps, %llu unrepaired\n",
              static_cast<unsigned long long>(st.relayed_batches),
              static_cast<unsigned long long>(st.repaired_gaps),
              static_cast<unsigned long long>(st.unrepaired_gaps));
}

void BenchReannounce() {
  master::ManualClock clock;
  auto svc = master::MasterService::Open({}, &clock);
  if (!svc.ok()) return;
  master::MasterService& m = **svc;
  auto agent = m.RegisterAgent("bench", 1);
  std::vector<std::string_view> eps = {"tcp://127.0.0.1:1"};
  if (!agent.ok() || !m.MountPool(*agent, 0, uint64_t{1} << 36, eps).ok()) return;
  const size_t keys = 200000;
  std::vector<std::string> names;
  for (size_t i = 0; i < keys; ++i) names.push_back("key-" + std::to_string(i));
  for (size_t i = 0; i < keys; i += 1000) {
    std::vector<std::string_view> k(names.begin() + i, names.begin() + i + 1000);
    std::vector<uint64_t> sizes(k.size(), 64);
    std::vector<std::string_view> sessions(k.size(), "session-1");
    master::WriteStartRequest r;
    r.agent = *agent;
    r.keys = k;
    r.sizes = sizes;
    r.session_ids = sessions;
    master::PlacementBatch p;
    master::KeyResults e;
    if (!m.BatchPutStart(r, &p).ok() || !m.BatchPutEnd(*agent, k, &e).ok()) return;
  }
  (void)m.TakeEvents();
  std::mutex mu;  // the relay thread pages while this thread waits
  auto list = [&](uint64_t cursor) -> Result<relay::ContentPage> {
    std::lock_guard<std::mutex> lock(mu);
    master::ListPage page;
    KVAGENT_RETURN_IF_ERROR(m.ListKeys(cursor, 1000, &page));
    relay::ContentPage out;
    for (const master::ListedKey& k : page.keys) {
      out.objects.push_back(relay::AnnouncementFromKey(k.key, k.session_id));
    }
    out.next_cursor = page.next_cursor;
    return out;
  };
  // Baseline: the scan alone.
  auto start = Clock::now();
  size_t listed = 0;
  uint64_t cursor = 0;
  do {
    auto page = list(cursor);
    if (!page.ok()) return;
    listed += page->objects.size();
    cursor = page->next_cursor;
  } while (cursor != 0);
  Bench("relay.reannounce.baseline_listkeys", listed / Seconds(start), "objects/s");

  Dir dir;
  events::EventPublisherOptions mo;
  mo.endpoint = dir.Ipc("master.sock");
  mo.replay_endpoint = dir.Ipc("master-replay.sock");
  auto master_pub = events::EventPublisher::Start(mo);
  if (!master_pub.ok()) return;
  (*master_pub)->Publish(events::AllBlocksCleared{});  // the master's seq 0: lets the relay join
  (*master_pub)->Flush();
  relay::EventRelayOptions ro;
  ro.master_events = mo.endpoint;
  ro.master_events_replay = mo.replay_endpoint;
  ro.endpoint = dir.Ipc("events.sock");
  ro.replay_endpoint = dir.Ipc("events-replay.sock");
  ro.list_content = list;
  ro.join_timeout = 10ms;
  // Timed: the relay's first re-announce (it starts right after joining), until it is out.
  start = Clock::now();
  auto relay = relay::EventRelay::Start(ro);
  if (!relay.ok()) return;
  Sink downstream((*relay)->endpoint());
  while ((*relay)->stats().reannounces < 1) std::this_thread::sleep_for(100us);
  (*relay)->Flush();
  const double first = Seconds(start);
  Bench("relay.reannounce.clearing.objects", double((*relay)->stats().objects_reannounced) / first,
        "objects/s");
  // Timed: a re-announce requested now, by differences: every object scanned and compared.
  start = Clock::now();
  (*relay)->RequestResync();
  while ((*relay)->stats().reannounces < 2) std::this_thread::sleep_for(100us);
  (*relay)->Flush();
  Bench("relay.reannounce.by_differences.objects", double(listed) / Seconds(start), "objects/s");
  if ((*relay)->stats().objects_removed != 0) std::printf("# a re-announce removed objects\n");
}

}  // namespace

int main() {
  BenchForward();
  BenchReannounce();
  return 0;
}

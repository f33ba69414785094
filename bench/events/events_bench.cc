// events_bench: what a KV event costs to encode and to publish, next to baselines measured in
// the same run. Prints `BENCH <name> <value> <unit>` lines.
//
//  encode   EventBatchBuilder with reused buffers (the publisher's path), vs the same events
//           encoded into a fresh string per batch, vs a bare memcpy of the encoded bytes.
//  decode   DecodeEventBatch, for reference (subscribers, the relay).
//  publish  events/s through EventPublisher::Publish (one producer thread, one event per call,
//           and 64-event vectors) with a SUB attached and draining, in steady state (after a
//           warm-up run of the same size), vs a raw PUB sending the same pre-encoded payloads
//           (the ZMQ ceiling on this machine). The producer copies each event from a prepared
//           vector, as a caller building events would allocate them.
//
// The machine is small and shared: absolute numbers move with whatever else runs; the ratios
// to the baselines are the meaningful part.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "kvagent/events/event_publisher.h"
#include "kvagent/events/kv_event.h"

namespace {

using namespace kvagent::events;
using Clock = std::chrono::steady_clock;

constexpr size_t kBatch = 512;  // EventPublisherOptions::max_batch_events default

void Bench(const char* name, double value, const char* unit) {
  std::printf("BENCH %s %.1f %s\n", name, value, unit);
  std::fflush(stdout);
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// A typical stored block: one 64-bit hash, 16 tokens, a parent, a session tag.
KvEvent TypicalEvent(uint64_t i) {
  BlockStored e;
  e.block_hashes = {BlockHash::Unsigned(0x9e3779b97f4a7c15ULL * (i + 1))};
  e.parent_block_hash = BlockHash::Unsigned(0x9e3779b97f4a7c15ULL * i);
  for (uint32_t t = 0; t < 16; ++t) e.token_ids.push_back(static_cast<uint32_t>(i * 16 + t));
  e.block_size = 16;
  e.session_id = "session-" + std::to_string(i % 1000);
  return e;
}

void BenchEncode(const std::vector<KvEvent>& events) {
  const size_t rounds = 20;
  size_t bytes = 0;
  std::string payload;
  EventBatchBuilder builder;
  auto start = Clock::now();
  for (size_t r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < events.size(); ++i) {
      builder.Add(events[i]);
      if (builder.event_count() == kBatch || i + 1 == events.size()) {
        builder.Finish(1.0, 0, &payload);
        bytes += payload.size();
      }
    }
  }
  const double n = double(rounds * events.size());
  Bench("events.encode.reused_buffers", Seconds(start) * 1e9 / n, "ns/event");
  Bench("events.encode.bytes", double(bytes) / n, "bytes/event");

  size_t fresh_bytes = 0;
  start = Clock::now();
  for (size_t r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < events.size(); i += kBatch) {
      EventBatch batch{1.0, {}, 0};
      batch.events.assign(events.begin() + i, events.begin() + std::min(events.size(), i + kBatch));
      fresh_bytes += EncodeEventBatch(batch).size();
    }
  }
  Bench("events.encode.baseline_fresh_batch_and_string", Seconds(start) * 1e9 / n, "ns/event");

  std::string copy(payload.size(), '\0');
  const size_t copies = bytes / payload.size();
  start = Clock::now();
  for (size_t c = 0; c < copies; ++c) {
    std::memcpy(copy.data(), payload.data(), payload.size());
    copy[c % copy.size()] ^= 1;  // keeps the copies from being optimized away
  }
  Bench("events.encode.baseline_memcpy_same_bytes", Seconds(start) * 1e9 / n, "ns/event");
  if (fresh_bytes != bytes) std::fprintf(stderr, "encoders disagree on size\n");

  auto decoded = DecodeEventBatch(payload);
  const size_t decode_rounds = 200;
  start = Clock::now();
  for (size_t r = 0; r < decode_rounds; ++r) decoded = DecodeEventBatch(payload);
  Bench("events.decode", Seconds(start) * 1e9 / double(decode_rounds * decoded->events.size()),
        "ns/event");
}

// Drains a SUB in its own thread (which owns the socket) and counts events per batch header.
class DrainingSubscriber {
 public:
  explicit DrainingSubscriber(const std::string& endpoint) {
    thread_ = std::thread([this, endpoint] { Run(endpoint); });
    while (!connected_.load()) std::this_thread::yield();
  }
  ~DrainingSubscriber() {
    stop_.store(true);
    thread_.join();
  }
  uint64_t batches() const { return batches_.load(); }
  // Batches received with seq >= CountFrom's argument.
  uint64_t counted() const { return counted_.load(); }
  void CountFrom(uint64_t seq) { count_from_.store(seq); }

 private:
  void Run(const std::string& endpoint) {
    zmq::context_t context(1);
    zmq::socket_t sub(context, zmq::socket_type::sub);
    sub.set(zmq::sockopt::rcvhwm, 100000);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(endpoint);
    connected_.store(true);
    zmq::message_t frame;
    int part = 0;  // index of `frame` in its message: [topic, seq, payload]
    uint64_t seq = 0;
    while (!stop_.load()) {
      zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) <= 0) continue;
      while (sub.recv(frame, zmq::recv_flags::dontwait)) {
        if (part == 1) {
          seq = DecodeSeq(std::string_view(static_cast<const char*>(frame.data()), frame.size()))
                    .value_or(0);
        }
        if (frame.more()) {
          ++part;
          continue;
        }
        part = 0;
        batches_.fetch_add(1);
        if (seq >= count_from_.load()) counted_.fetch_add(1);
      }
    }
  }

  std::thread thread_;
  std::atomic<bool> connected_{false};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> batches_{0};
  std::atomic<uint64_t> counted_{0};
  std::atomic<uint64_t> count_from_{~uint64_t{0}};
};

// Publishes until the SUB has seen a batch, so that the measured run is not lost to a
// subscription still on its way.
bool WaitForSubscription(EventPublisher& publisher, DrainingSubscriber& sub) {
  for (int i = 0; i < 500; ++i) {
    publisher.Publish(AllBlocksCleared{});
    publisher.Flush();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (sub.batches() > 0) return true;
  }
  return false;
}

void BenchPublish(const std::vector<KvEvent>& events, size_t per_call, const char* name) {
  EventPublisherOptions options;
  options.endpoint = "tcp://127.0.0.1:0";
  options.replay_endpoint = "tcp://127.0.0.1:0";
  // Steady state: the replay ring full and recycling its buffers (a fresh ring first touches
  // every page it keeps). A smaller ring than the default keeps this benchmark's footprint
  // modest; per batch the work is the same.
  options.replay_max_bytes = size_t{64} << 20;
  auto started = EventPublisher::Start(options);
  if (!started.ok()) {
    std::fprintf(stderr, "%s\n", started.status().ToString().c_str());
    return;
  }
  auto publisher = std::move(*started);
  DrainingSubscriber sub(publisher->endpoint());
  if (!WaitForSubscription(*publisher, sub)) {
    std::fprintf(stderr, "subscriber never connected\n");
    return;
  }
  auto publish_all = [&] {
    for (size_t i = 0; i < events.size(); i += per_call) {
      if (per_call == 1) {
        publisher->Publish(events[i]);
      } else {
        publisher->Publish(std::vector<KvEvent>(
            events.begin() + i, events.begin() + std::min(events.size(), i + per_call)));
      }
    }
    publisher->Flush();
  };
  publish_all();  // warm-up: fills the replay ring
  const EventPublisherStats before = publisher->stats();
  sub.CountFrom(before.next_seq);
  const auto start = Clock::now();
  publish_all();
  const double seconds = Seconds(start);
  const EventPublisherStats s = publisher->stats();
  Bench(name, double(events.size()) / seconds, "events/s");
  const uint64_t sent = s.published_batches - before.published_batches;
  auto received = [&] { return sub.counted(); };
  while (received() < sent && Seconds(start) < seconds + 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::printf("# %s: %llu batches, %llu events dropped, the SUB received %llu of them\n", name,
              static_cast<unsigned long long>(sent),
              static_cast<unsigned long long>(s.dropped_events),
              static_cast<unsigned long long>(received()));
}

// The same payloads through a bare PUB from this thread: what ZMQ alone costs here.
void BenchRawPub(const std::vector<KvEvent>& events) {
  std::vector<std::string> payloads;
  EventBatchBuilder builder;
  for (size_t i = 0; i < events.size(); ++i) {
    builder.Add(events[i]);
    if (builder.event_count() == kBatch || i + 1 == events.size()) {
      payloads.emplace_back();
      builder.Finish(1.0, 0, &payloads.back());
    }
  }
  zmq::context_t context(1);
  zmq::socket_t pub(context, zmq::socket_type::pub);
  pub.set(zmq::sockopt::sndhwm, 100000);
  pub.set(zmq::sockopt::linger, 0);
  pub.bind("tcp://127.0.0.1:*");
  DrainingSubscriber sub(pub.get(zmq::sockopt::last_endpoint));
  for (int i = 0; i < 500 && sub.batches() == 0; ++i) {
    pub.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(EncodeSeq(0)), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(payloads[0]));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto start = Clock::now();
  uint64_t seq = 0;
  for (const std::string& p : payloads) {
    pub.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(EncodeSeq(seq++)), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(p));
  }
  Bench("events.publish.baseline_raw_pub_preencoded", double(events.size()) / Seconds(start),
        "events/s");
}

}  // namespace

int main() {
  std::printf("# events_bench: 2-vCPU shared machine; numbers move with other load\n");
  std::vector<KvEvent> events;
  const size_t n = 500000;
  events.reserve(n);
  for (uint64_t i = 0; i < n; ++i) events.push_back(TypicalEvent(i));
  std::vector<KvEvent> sample(events.begin(), events.begin() + 100000);
  BenchEncode(sample);
  BenchPublish(events, 1, "events.publish.one_event_per_call");
  BenchPublish(events, 64, "events.publish.64_events_per_call");
  BenchRawPub(events);
  return 0;
}

// EventPublisher against docs/events.md ("Sockets and frames", "Replay"), observed with plain
// cppzmq sockets.
#include "kvagent/events/event_publisher.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "event_test_support.h"

namespace kvagent::events {
namespace {

using namespace std::chrono_literals;
using testing::Frames;

using testing::StartPublisher;

// tcp port 0 and '*' both mean "any free port".
EventPublisherOptions TcpOptions() {
  EventPublisherOptions o = testing::TcpPublisherOptions();
  o.replay_endpoint = "tcp://127.0.0.1:*";
  return o;
}

// Checks `replies` is [b"", topic, seq, payload] for seqs first..last, then the end marker.
void ExpectReplay(const std::vector<Frames>& replies, uint64_t first, uint64_t last,
                  const std::string& topic = "") {
  ASSERT_EQ(replies.size(), last - first + 2) << "batches plus the end marker";
  for (uint64_t seq = first; seq <= last; ++seq) {
    const Frames& f = replies[seq - first];
    ASSERT_EQ(f.size(), 4u) << "seq " << seq;
    EXPECT_EQ(f[0], "");
    EXPECT_EQ(f[1], topic);
    EXPECT_EQ(DecodeSeq(f[2]), seq);
    auto batch = DecodeEventBatch(f[3]);
    EXPECT_TRUE(batch.ok()) << batch.status().ToString();
  }
  EXPECT_TRUE(testing::IsEndMarker(replies.back()));
}

TEST(EventPublisher, EndpointsReportTheBoundTcpPorts) {
  auto publisher = StartPublisher(TcpOptions());
  ASSERT_TRUE(publisher);
  EXPECT_EQ(publisher->endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << publisher->endpoint();
  EXPECT_NE(publisher->endpoint(), "tcp://127.0.0.1:0");
  EXPECT_NE(publisher->replay_endpoint(), "tcp://127.0.0.1:*");
  EXPECT_NE(publisher->endpoint(), publisher->replay_endpoint());
}

TEST(EventPublisher, LiveBatchesAreThreeFramesWithContiguousSeqFromZero) {
  EventPublisherOptions o = TcpOptions();
  o.topic = "kv@node-1";
  auto publisher = StartPublisher(o);
  ASSERT_TRUE(publisher);
  testing::RawSubscriber sub(publisher->endpoint());
  const std::optional<uint64_t> first = testing::WarmUp(*publisher, sub);
  ASSERT_TRUE(first);
  const uint64_t warm = publisher->stats().next_seq;
  testing::PublishSingles(*publisher, 0, 40);
  const uint64_t total = publisher->stats().next_seq;
  EXPECT_EQ(total, warm + 40);
  for (uint64_t seq = *first + 1; seq < total; ++seq) {
    auto frames = sub.Receive(10s);
    ASSERT_TRUE(frames) << "seq " << seq << " never arrived";
    ASSERT_EQ(frames->size(), 3u);
    EXPECT_EQ((*frames)[0], "kv@node-1");
    ASSERT_EQ((*frames)[1].size(), 8u);
    EXPECT_EQ(DecodeSeq((*frames)[1]), seq);
    EXPECT_TRUE(DecodeEventBatch((*frames)[2]).ok());
  }
  // The history the SUB joined too late for is in the replay ring, starting at 0.
  ExpectReplay(testing::RequestReplayFrom(publisher->replay_endpoint(), 0), 0, total - 1,
               "kv@node-1");
  EXPECT_EQ(publisher->stats().published_batches, total);
  EXPECT_EQ(publisher->stats().replay_requests, 1u);
}

TEST(EventPublisher, ReplayFromASeqOlderThanRetainedReturnsWhatIsKept) {
  EventPublisherOptions o = TcpOptions();
  o.replay_batches = 5;
  auto publisher = StartPublisher(o);
  ASSERT_TRUE(publisher);
  testing::PublishSingles(*publisher, 0, 12);
  ExpectReplay(testing::RequestReplayFrom(publisher->replay_endpoint(), 0), 7, 11);
  ExpectReplay(testing::RequestReplayFrom(publisher->replay_endpoint(), 9), 9, 11);
}

TEST(EventPublisher, RetentionIsAlsoBoundedByBytes) {
  EventPublisherOptions o = TcpOptions();
  o.replay_max_bytes = 5000;
  auto publisher = StartPublisher(o);
  ASSERT_TRUE(publisher);
  testing::PublishSingles(*publisher, 0, 10, /*tokens=*/512);
  // Every one of these batches has the same size (one-byte hashes and tokens, float64 ts).
  const size_t batch_bytes =
      EncodeEventBatch(EventBatch{0, {testing::StoredEvent(0, 512)}, 0}).size();
  const uint64_t kept = 5000 / batch_bytes;
  ASSERT_GE(kept, 2u);
  ASSERT_LT(kept, 10u);
  ExpectReplay(testing::RequestReplayFrom(publisher->replay_endpoint(), 0), 10 - kept, 9);
}

TEST(EventPublisher, ReplayFromBeyondTheNewestSeqReturnsOnlyTheEndMarker) {
  auto publisher = StartPublisher(TcpOptions());
  ASSERT_TRUE(publisher);
  publisher->Publish(testing::StoredEvent(1));
  publisher->Flush();
  auto replies = testing::RequestReplayFrom(publisher->replay_endpoint(), 1);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(testing::IsEndMarker(replies[0]));
}

TEST(EventPublisher, MalformedReplayRequestsAreIgnoredAndServingGoesOn) {
  auto publisher = StartPublisher(TcpOptions());
  ASSERT_TRUE(publisher);
  publisher->Publish(testing::StoredEvent(1));
  publisher->Flush();
  const std::string ep = publisher->replay_endpoint();
  // No delimiter, a 3-byte seq, an extra frame, a non-empty delimiter: no answer to any.
  for (const Frames& bad : {Frames{EncodeSeq(0)}, Frames{"", "abc"}, Frames{"", EncodeSeq(0), "x"},
                            Frames{"junk", EncodeSeq(0)}}) {
    EXPECT_TRUE(testing::RequestReplay(ep, bad, 300ms).empty());
  }
  ExpectReplay(testing::RequestReplayFrom(ep, 0), 0, 0);
  EXPECT_EQ(publisher->stats().bad_replay_requests, 4u);
  EXPECT_EQ(publisher->stats().replay_requests, 1u);
}

// Events handed over as they are (Publish) or encoded by the caller (EncodeAndPublish): every
// test of batching and overflow below runs both ways.
class EventPublisherHandOff : public ::testing::TestWithParam<bool> {
 protected:
  static void Hand(EventPublisher& publisher, std::vector<KvEvent> events) {
    if (GetParam()) {
      publisher.EncodeAndPublish(events);
    } else {
      publisher.Publish(std::move(events));
    }
  }
};
INSTANTIATE_TEST_SUITE_P(Both, EventPublisherHandOff, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Encoded" : "Events"; });

TEST_P(EventPublisherHandOff, QueueOverflowDropsAndSkipsOneSeq) {
  EventPublisherOptions o = TcpOptions();
  o.queue_capacity = 4;
  auto publisher = StartPublisher(o);
  ASSERT_TRUE(publisher);
  std::vector<KvEvent> burst;
  for (uint64_t i = 0; i < 10; ++i) burst.push_back(testing::StoredEvent(i));
  Hand(*publisher, std::move(burst));  // 4 fit, 6 are dropped
  publisher->Flush();                  // the queue is empty again
  publisher->Publish(testing::StoredEvent(99));
  publisher->Flush();
  const EventPublisherStats s = publisher->stats();
  EXPECT_EQ(s.dropped_events, 6u);
  EXPECT_EQ(s.dropped_batches, 1u);
  EXPECT_EQ(s.next_seq, 3u);
  EXPECT_EQ(s.published_events, 5u);
  auto replies = testing::RequestReplayFrom(publisher->replay_endpoint(), 0);
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(DecodeSeq(replies[0][2]), 0u);
  EXPECT_EQ(DecodeEventBatch(replies[0][3])->events.size(), 4u);
  EXPECT_EQ(DecodeSeq(replies[1][2]), 2u) << "seq 1 stands for the dropped events";
  EXPECT_TRUE(testing::IsEndMarker(replies[2]));
}

TEST_P(EventPublisherHandOff, BatchesHoldAtMostMaxBatchEventsAndKeepOrder) {
  EventPublisherOptions o = TcpOptions();
  o.max_batch_events = 3;
  auto publisher = StartPublisher(o);
  ASSERT_TRUE(publisher);
  std::vector<KvEvent> events;
  for (uint64_t i = 0; i < 10; ++i) events.push_back(testing::StoredEvent(i));
  Hand(*publisher, std::move(events));
  publisher->Flush();
  auto replies = testing::RequestReplayFrom(publisher->replay_endpoint(), 0);
  ASSERT_EQ(replies.size(), 5u);  // 3 + 3 + 3 + 1, then the end marker
  uint64_t next_hash = 0;
  for (size_t b = 0; b < 4; ++b) {
    auto batch = DecodeEventBatch(replies[b][3]);
    ASSERT_TRUE(batch.ok());
    EXPECT_EQ(batch->events.size(), b < 3 ? 3u : 1u);
    EXPECT_EQ(batch->dp_rank, 0);
    for (const KvEvent& e : batch->events) {
      EXPECT_EQ(std::get<BlockStored>(e).block_hashes[0].bits, next_hash++);
    }
  }
}

TEST_P(EventPublisherHandOff, BatchesStayUnderMaxBatchBytesUnlessOneEventIsLarger) {
  EventPublisherOptions o = TcpOptions();
  o.max_batch_bytes = 1200;
  auto publisher = StartPublisher(o);
  ASSERT_TRUE(publisher);
  std::vector<KvEvent> events;
  for (uint64_t i = 0; i < 20; ++i) events.push_back(testing::StoredEvent(i, 100));  // ~250 B
  events.push_back(testing::StoredEvent(20, 2000));                                  // > limit
  Hand(*publisher, std::move(events));
  publisher->Flush();
  auto replies = testing::RequestReplayFrom(publisher->replay_endpoint(), 0);
  ASSERT_GE(replies.size(), 6u);
  size_t events_seen = 0;
  for (size_t i = 0; i + 1 < replies.size(); ++i) {
    const auto batch = DecodeEventBatch(replies[i][3]);
    ASSERT_TRUE(batch.ok());
    events_seen += batch->events.size();
    if (batch->events.size() > 1) {
      EXPECT_LE(replies[i][3].size(), 1200u);
    }
  }
  EXPECT_EQ(events_seen, 21u);
  EXPECT_GT(replies[replies.size() - 2][3].size(), 1200u) << "the big event goes alone";
}

// The caller's encoding gives exactly the events Publish gives, in the same batches, and the
// caller's events are left as they were; reused buffers (many calls) change nothing.
TEST(EventPublisher, EncodeAndPublishMakesTheSameBatchesAsPublish) {
  EventPublisherOptions o = TcpOptions();
  o.max_batch_events = 7;
  auto by_events = StartPublisher(o);
  auto by_bytes = StartPublisher(o);
  ASSERT_TRUE(by_events && by_bytes);
  for (uint64_t call = 0; call < 40; ++call) {
    std::vector<KvEvent> events;
    for (uint64_t i = 0; i < call % 11 + 1; ++i) {
      events.push_back(testing::StoredEvent(call * 100 + i, 10 + (call * i) % 300));
    }
    if (call % 5 == 4) {
      BlockRemoved removed;
      removed.block_hashes = {BlockHash::Unsigned(call)};
      removed.object_key = "key-" + std::to_string(call);
      events.push_back(std::move(removed));
    }
    const std::vector<KvEvent> kept = events;
    by_bytes->EncodeAndPublish(events);
    EXPECT_EQ(events, kept);
    by_events->Publish(std::move(events));
    by_events->Flush();  // each call its own batches, on both sides
    by_bytes->Flush();
  }
  auto a = testing::RequestReplayFrom(by_events->replay_endpoint(), 0);
  auto b = testing::RequestReplayFrom(by_bytes->replay_endpoint(), 0);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 40u);
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    EXPECT_EQ(a[i][2], b[i][2]) << "seq of batch " << i;
    auto from_events = DecodeEventBatch(a[i][3]);
    auto from_bytes = DecodeEventBatch(b[i][3]);
    ASSERT_TRUE(from_events.ok() && from_bytes.ok()) << i;
    EXPECT_EQ(from_events->events, from_bytes->events) << "batch " << i;
    EXPECT_EQ(from_events->dp_rank, from_bytes->dp_rank);
  }
  EXPECT_EQ(by_events->stats().published_events, by_bytes->stats().published_events);
}

TEST(EventPublisher, PublishEncodedGoesOutUnchangedAsItsOwnBatch) {
  auto publisher = StartPublisher(TcpOptions());
  ASSERT_TRUE(publisher);
  const std::string relayed =
      EncodeEventBatch(EventBatch{1732900000.0, {AllBlocksCleared{}}, std::nullopt});
  publisher->Publish(testing::StoredEvent(1));
  publisher->PublishEncoded(relayed);
  publisher->Publish(testing::StoredEvent(2));
  publisher->Flush();
  auto replies = testing::RequestReplayFrom(publisher->replay_endpoint(), 0);
  ASSERT_EQ(replies.size(), 4u);
  EXPECT_EQ(replies[1][3], relayed);
  EXPECT_EQ(DecodeSeq(replies[2][2]), 2u);
}

TEST(EventPublisher, ConcurrentPublishersLoseNothingAndSeqStaysContiguous) {
  auto publisher = StartPublisher(TcpOptions());
  ASSERT_TRUE(publisher);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&publisher, t] {
      for (uint64_t i = 0; i < 5000; ++i) publisher->Publish(testing::StoredEvent(t * 10000 + i));
    });
  }
  for (auto& th : threads) th.join();
  publisher->Flush();
  const EventPublisherStats s = publisher->stats();
  EXPECT_EQ(s.published_events, 20000u);
  EXPECT_EQ(s.dropped_events, 0u);
  auto replies = testing::RequestReplayFrom(publisher->replay_endpoint(), 0);
  ASSERT_EQ(replies.size(), s.next_seq + 1);
  size_t events = 0;
  for (uint64_t seq = 0; seq < s.next_seq; ++seq) {
    EXPECT_EQ(DecodeSeq(replies[seq][2]), seq);
    events += DecodeEventBatch(replies[seq][3])->events.size();
  }
  EXPECT_EQ(events, 20000u);
}

TEST(EventPublisher, IpcEndpointInAMissingDirectorySaysToCreateIt) {
  EventPublisherOptions o;
  o.endpoint = "ipc:///nonexistent-kvagent-dir/events.sock";
  auto publisher = EventPublisher::Start(o);
  ASSERT_FALSE(publisher.ok());
  EXPECT_NE(publisher.status().message().find("create it"), std::string::npos)
      << publisher.status().ToString();
  EXPECT_NE(publisher.status().message().find("/nonexistent-kvagent-dir"), std::string::npos);
}

TEST(EventPublisher, TcpPortInUseIsAClearError) {
  auto first = StartPublisher(TcpOptions());
  ASSERT_TRUE(first);
  EventPublisherOptions o;
  o.endpoint = first->endpoint();
  auto second = EventPublisher::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("another process holds"), std::string::npos)
      << second.status().ToString();
}

TEST(EventPublisher, IpcEndpointsWork) {
  testing::TempDir dir;
  const EventPublisherOptions o = testing::IpcPublisherOptions(dir);
  auto publisher = StartPublisher(o);
  ASSERT_TRUE(publisher);
  EXPECT_EQ(publisher->endpoint(), o.endpoint);
  publisher->Publish(AllBlocksCleared{});
  publisher->Flush();
  ExpectReplay(testing::RequestReplayFrom(publisher->replay_endpoint(), 0), 0, 0);
}

TEST(EventPublisher, ExtraEndpointsCarryTheSameBatchesWithTheSameSeq) {
  testing::TempDir dir;
  EventPublisherOptions o = testing::IpcPublisherOptions(dir);
  o.extra_endpoints = {"tcp://127.0.0.1:0"};
  auto publisher = StartPublisher(o);
  ASSERT_TRUE(publisher);
  ASSERT_EQ(publisher->extra_endpoints().size(), 1u);
  EXPECT_EQ(publisher->extra_endpoints()[0].rfind("tcp://127.0.0.1:", 0), 0u);
  EXPECT_NE(publisher->extra_endpoints()[0], "tcp://127.0.0.1:0");
  testing::RawSubscriber ipc(publisher->endpoint());
  testing::RawSubscriber tcp(publisher->extra_endpoints()[0]);
  ASSERT_TRUE(testing::WarmUp(*publisher, ipc));
  ASSERT_TRUE(testing::WarmUp(*publisher, tcp));
  testing::PublishSingles(*publisher, 0, 5);
  const uint64_t last = publisher->stats().next_seq - 1;
  // Each SUB joined at its own time; from the later join on, both see identical messages.
  std::map<uint64_t, Frames> seen_ipc;
  std::map<uint64_t, Frames> seen_tcp;
  for (auto* seen : {&seen_ipc, &seen_tcp}) {
    testing::RawSubscriber& sub = seen == &seen_ipc ? ipc : tcp;
    while (seen->empty() || seen->rbegin()->first < last) {
      auto frames = sub.Receive(10s);
      ASSERT_TRUE(frames && frames->size() == 3);
      (*seen)[*DecodeSeq((*frames)[1])] = *frames;
    }
  }
  for (uint64_t seq = last - 4; seq <= last; ++seq) {
    ASSERT_TRUE(seen_ipc.count(seq) && seen_tcp.count(seq)) << seq;
    EXPECT_EQ(seen_ipc[seq], seen_tcp[seq]);
  }
}

TEST(EventPublisher, AnExtraEndpointThatCannotBeBoundFailsTheStart) {
  testing::TempDir dir;
  EventPublisherOptions o = testing::IpcPublisherOptions(dir);
  o.extra_endpoints = {"ipc:///nonexistent-kvagent-dir/events.sock"};
  auto publisher = EventPublisher::Start(o);
  ASSERT_FALSE(publisher.ok());
  EXPECT_NE(publisher.status().message().find("/nonexistent-kvagent-dir"), std::string::npos)
      << publisher.status().ToString();
}

// Payload buffers go out without a copy and are reused once ZMQ has let go of them: bursts of
// one-event batches of varying sizes, with a replay ring of 4 batches (buffers recycled from
// its evictions) and without replay (from the last few sent). Every batch a subscriber gets
// must be the one published with its seq, never bytes a reused buffer got later.
void ExpectEveryBatchIntact(EventPublisherOptions o) {
  o.max_batch_events = 1;
  auto publisher = StartPublisher(o);
  ASSERT_TRUE(publisher);
  testing::RawSubscriber sub(publisher->endpoint());
  const std::optional<uint64_t> warm = testing::WarmUp(*publisher, sub);
  ASSERT_TRUE(warm);
  while (sub.Receive(200ms)) {
  }
  const uint64_t first_seq = publisher->stats().next_seq;
  constexpr uint64_t kBurst = 200;  // under the SUB's receive high-water mark
  uint64_t n = 0;
  for (int burst = 0; burst < 10; ++burst) {
    for (uint64_t i = 0; i < kBurst; ++i) {
      publisher->Publish(testing::StoredEvent(n + i, 1 + (n + i) % 97));
    }
    publisher->Flush();
    for (uint64_t i = 0; i < kBurst; ++i, ++n) {
      auto frames = sub.Receive(10s);
      ASSERT_TRUE(frames) << "event " << n << " never arrived";
      ASSERT_EQ(frames->size(), 3u);
      ASSERT_EQ(DecodeSeq((*frames)[1]), first_seq + n);
      auto batch = DecodeEventBatch((*frames)[2]);
      ASSERT_TRUE(batch.ok()) << "seq " << first_seq + n << ": " << batch.status().ToString();
      ASSERT_EQ(batch->events.size(), 1u);
      const auto& stored = std::get<BlockStored>(batch->events[0]);
      ASSERT_EQ(stored.block_hashes[0].bits, n) << "seq " << first_seq + n;
      ASSERT_EQ(stored.token_ids.size(), 1 + n % 97) << "seq " << first_seq + n;
    }
  }
}

TEST(EventPublisher, ReusedPayloadBuffersNeverChangeABatchOnItsWay) {
  EventPublisherOptions with_replay = TcpOptions();
  with_replay.replay_batches = 4;
  ExpectEveryBatchIntact(with_replay);
  EventPublisherOptions without_replay = testing::TcpPublisherOptions();  // no replay socket
  ExpectEveryBatchIntact(without_replay);
}

// Resident bytes of this process (/proc/self/statm).
size_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// A subscriber that stops reading (a stuck router) holds at most subscriber_queue_bytes of the
// publisher's memory; what does not fit is dropped, a gap the subscriber sees when it reads again.
// With the PUB's old high-water mark (100 000 batches) the same 240 MB stayed queued for it.
TEST(EventPublisher, ASubscriberThatStopsReadingHoldsBoundedMemory) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers keep freed memory resident (quarantine, shadow)";
#endif
  EventPublisherOptions o = TcpOptions();
  o.replay_max_bytes = size_t{4} << 20;
  o.subscriber_queue_bytes = size_t{8} << 20;  // 64 batches of at most 128 KiB
  ASSERT_EQ(SubscriberQueueBatches(o), 64);
  auto publisher = StartPublisher(o);
  ASSERT_TRUE(publisher);
  // The stuck subscriber: it queues one message on its side and has a small socket buffer, so
  // what waits for it waits in the publisher.
  zmq::context_t context(1);
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::rcvhwm, 1);
  sub.set(zmq::sockopt::rcvbuf, 4096);
  sub.set(zmq::sockopt::subscribe, "");
  sub.connect(publisher->endpoint());
  std::optional<uint64_t> first;
  for (int attempt = 0; attempt < 200 && !first; ++attempt) {
    testing::PublishSingles(*publisher, 0, 1);
    if (auto frames = testing::ReceiveFrames(sub, 50ms)) first = DecodeSeq((*frames)[1]);
  }
  ASSERT_TRUE(first) << "the SUB never received a batch";
  const size_t before = ResidentBytes();
  // 8 000 events of ~30 KB (four to a batch): 240 MB in 2 000 batches, made 32 at a time.
  const std::string key(30'000, 'k');
  for (uint64_t n = 0; n < 8'000; n += 32) {
    std::vector<KvEvent> events;
    for (uint64_t i = n; i < n + 32; ++i) {
      BlockStored e;
      e.block_hashes = {BlockHash::Unsigned(i)};
      e.object_key = key;
      events.emplace_back(std::move(e));
    }
    publisher->Publish(std::move(events));
    publisher->Flush();
  }
  const uint64_t total = publisher->stats().next_seq;
  ASSERT_GE(total, 2'000u);
  const size_t grown = ResidentBytes() - std::min(before, ResidentBytes());
  EXPECT_LT(grown, size_t{96} << 20)
      << "queued for a subscriber that reads nothing: 8 MiB of batches, 4 MiB retained";
  // It reads again: what waited for it comes in order, then, after what was dropped, the next
  // batch: a gap.
  uint64_t received = 0, last = *first;
  while (auto frames = testing::ReceiveFrames(sub, 500ms)) {
    const uint64_t seq = DecodeSeq((*frames)[1]).value_or(0);
    EXPECT_EQ(seq, last + 1) << "what was queued arrives whole and in order";
    last = seq;
    ++received;
  }
  EXPECT_LT(received, total - *first - 1) << "batches beyond the bound were dropped";
  testing::PublishSingles(*publisher, 0, 1);
  auto next = testing::ReceiveFrames(sub, 10s);
  ASSERT_TRUE(next);
  EXPECT_EQ(DecodeSeq((*next)[1]), total);
  EXPECT_GT(total, last + 1) << "the subscriber sees the loss as a gap";
}

// The threads of this process in the scheduling class SCHED_BATCH (thread_policy.h).
std::vector<pid_t> BackgroundThreads() {
  std::vector<pid_t> out;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    const pid_t tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    if (sched_getscheduler(tid) == SCHED_BATCH) out.push_back(tid);
  }
  return out;
}

// A publisher's wake-ups must not preempt the thread that stored the events (the agent's ring
// service, kvmaster's loop): its thread and its ZMQ I/O thread are background work, the
// caller's thread is left as it was.
TEST(EventPublisher, ItsThreadsWakeWithoutPreemptingTheCallers) {
  const std::vector<pid_t> before = BackgroundThreads();
  {
    auto publisher = StartPublisher(TcpOptions());
    ASSERT_TRUE(publisher);
    testing::PublishSingles(*publisher, 0, 4);
    publisher->Flush();
    EXPECT_GE(BackgroundThreads().size(), before.size() + 2)
        << "the publisher's thread and its ZMQ I/O thread";
    EXPECT_NE(sched_getscheduler(0), SCHED_BATCH) << "the caller's class is not touched";
  }
  EXPECT_EQ(BackgroundThreads().size(), before.size()) << "both end with the publisher";
}

}  // namespace
}  // namespace kvagent::events

// EventSubscriber against a real EventPublisher (and, for the foreign layouts, raw sockets):
// order, gap repair through replay, unrepairable gaps, resets, from_seq, malformed frames.
#include "kvagent/events/event_subscriber.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "event_test_support.h"

namespace kvagent::events {
namespace {

using namespace std::chrono_literals;
using Kind = EventDelivery::Kind;
using testing::Frames;

using testing::PublishSingles;
using testing::StartPublisher;

std::unique_ptr<EventSubscriber> StartSubscriber(EventSubscriberOptions options) {
  auto subscriber = EventSubscriber::Start(std::move(options));
  EXPECT_TRUE(subscriber.ok()) << subscriber.status().ToString();
  return subscriber.ok() ? std::move(*subscriber) : nullptr;
}

EventSubscriberOptions SubscriberOf(std::string endpoint, std::string replay_endpoint = "") {
  EventSubscriberOptions o;
  o.endpoint = std::move(endpoint);
  o.replay_endpoint = std::move(replay_endpoint);
  o.decode = true;
  return o;
}

EventSubscriberOptions SubscriberFor(const EventPublisher& publisher) {
  return SubscriberOf(publisher.endpoint(), publisher.replay_endpoint());
}

// Everything the subscriber delivers until `last_seq` has been delivered as a batch (or a
// 10 s silence, which fails the test).
std::vector<EventDelivery> CollectUntil(EventSubscriber& sub, uint64_t last_seq) {
  std::vector<EventDelivery> out;
  while (true) {
    auto d = sub.Next(10s);
    if (!d.ok()) {
      ADD_FAILURE() << "waiting for seq " << last_seq << ": " << d.status().ToString();
      return out;
    }
    out.push_back(std::move(*d));
    const EventDelivery& last = out.back();
    if (last.kind == Kind::kBatch && last.seq >= last_seq) return out;
  }
}

// Publishes one batch at a time until the subscriber delivers one; returns its seq.
std::optional<uint64_t> WarmUp(EventPublisher& publisher, EventSubscriber& sub) {
  for (uint64_t attempt = 0; attempt < 200; ++attempt) {
    PublishSingles(publisher, 1000 + attempt, 1);
    auto d = sub.Next(50ms);
    if (d.ok() && d->kind == Kind::kBatch) return d->seq;
  }
  ADD_FAILURE() << "the subscriber never received a batch";
  return std::nullopt;
}

void ExpectContiguousBatches(const std::vector<EventDelivery>& ds, uint64_t first) {
  uint64_t next = first;
  for (const EventDelivery& d : ds) {
    ASSERT_EQ(d.kind, Kind::kBatch) << "unexpected gap/reset before seq " << next;
    EXPECT_EQ(d.seq, next);
    EXPECT_TRUE(d.batch.has_value()) << d.decode_status.ToString();
    ++next;
  }
}

TEST(EventSubscriber, FromSeqReplaysHistoryThenFollowsLive) {
  auto publisher = StartPublisher(testing::TcpPublisherOptions());
  ASSERT_TRUE(publisher);
  PublishSingles(*publisher, 0, 10);
  EventSubscriberOptions o = SubscriberFor(*publisher);
  o.from_seq = 4;
  auto sub = StartSubscriber(o);
  ASSERT_TRUE(sub);
  auto history = CollectUntil(*sub, 9);
  ExpectContiguousBatches(history, 4);
  for (const auto& d : history) EXPECT_TRUE(d.replayed);
  EXPECT_EQ(std::get<BlockStored>(history[0].batch->events[0]).block_hashes[0].bits, 4u);
  // Live from here on. Batches the SUB missed while joining are repaired by replay: on the next
  // live batch, or by the idle probe when nothing follows them.
  PublishSingles(*publisher, 10, 20);
  ExpectContiguousBatches(CollectUntil(*sub, 29), 10);
  EXPECT_EQ(sub->expected_seq(), 30u);
  EXPECT_EQ(sub->stats().gaps_reported, 0u);
}

TEST(EventSubscriber, LiveGapIsRepairedThroughReplay) {
  // Tiny high-water marks on both ends and big batches: while the subscriber does not read,
  // ZMQ drops live batches for it, leaving real gaps in what it receives.
  EventPublisherOptions po = testing::TcpPublisherOptions();
  po.sndhwm = 1;
  auto publisher = StartPublisher(po);
  ASSERT_TRUE(publisher);
  EventSubscriberOptions o = SubscriberFor(*publisher);
  o.rcvhwm = 1;
  auto sub = StartSubscriber(o);
  ASSERT_TRUE(sub);
  const std::optional<uint64_t> first = WarmUp(*publisher, *sub);
  ASSERT_TRUE(first);
  PublishSingles(*publisher, 0, 1500, /*tokens=*/512);  // ~1.5 KB each, ~2.3 MB in all
  const uint64_t last = publisher->stats().next_seq - 1;
  auto ds = CollectUntil(*sub, last);
  ExpectContiguousBatches(ds, *first + 1);
  const EventSubscriberStats s = sub->stats();
  EXPECT_GT(s.replayed_batches, 0u) << "no live batch was lost: the test made no gap";
  EXPECT_GT(s.replay_requests, 0u);
  EXPECT_GT(s.gaps_repaired, 0u);
  EXPECT_EQ(s.gaps_reported, 0u);
  EXPECT_EQ(s.delivered_batches, last - *first + 1);
}

TEST(EventSubscriber, HistoryNoLongerRetainedIsReportedAsAGap) {
  EventPublisherOptions po = testing::TcpPublisherOptions();
  po.replay_batches = 2;
  auto publisher = StartPublisher(po);
  ASSERT_TRUE(publisher);
  PublishSingles(*publisher, 0, 10);
  EventSubscriberOptions o = SubscriberFor(*publisher);
  o.from_seq = 0;
  auto sub = StartSubscriber(o);
  ASSERT_TRUE(sub);
  auto ds = CollectUntil(*sub, 9);
  ASSERT_EQ(ds.size(), 3u);
  EXPECT_EQ(ds[0].kind, Kind::kGap);
  EXPECT_EQ(ds[0].seq, 0u);
  EXPECT_EQ(ds[0].gap_to, 7u);
  ExpectContiguousBatches({ds[1], ds[2]}, 8);
  EXPECT_EQ(sub->stats().missing_batches, 8u);
}

TEST(EventSubscriber, OverflowSeqSkipIsReportedAsAGapReplayCannotFill) {
  EventPublisherOptions po = testing::TcpPublisherOptions();
  po.queue_capacity = 4;
  auto publisher = StartPublisher(po);
  ASSERT_TRUE(publisher);
  auto sub = StartSubscriber(SubscriberFor(*publisher));
  ASSERT_TRUE(sub);
  const std::optional<uint64_t> first = WarmUp(*publisher, *sub);
  ASSERT_TRUE(first);
  const uint64_t before = publisher->stats().next_seq;
  std::vector<KvEvent> burst;
  for (uint64_t i = 0; i < 10; ++i) burst.push_back(testing::StoredEvent(i));
  publisher->Publish(std::move(burst));  // 4 go out as seq `before`, 6 are dropped: skip
  publisher->Flush();                    // the queue is empty again
  publisher->Publish(testing::StoredEvent(99));
  publisher->Flush();
  auto ds = CollectUntil(*sub, before + 2);
  ASSERT_GE(ds.size(), 3u);
  const EventDelivery& gap = ds[ds.size() - 2];
  EXPECT_EQ(gap.kind, Kind::kGap);
  EXPECT_EQ(gap.seq, before + 1);
  EXPECT_EQ(gap.gap_to, before + 1);
  EXPECT_EQ(ds.back().batch->events.size(), 1u);
  EXPECT_EQ(ds[ds.size() - 3].seq, before);
  EXPECT_EQ(ds[ds.size() - 3].batch->events.size(), 4u);
}

TEST(EventSubscriber, GapWithoutReplayEndpointIsReportedImmediately) {
  EventPublisherOptions po = testing::TcpPublisherOptions();
  po.replay_endpoint.clear();
  po.queue_capacity = 1;
  auto publisher = StartPublisher(po);
  ASSERT_TRUE(publisher);
  auto sub = StartSubscriber(SubscriberOf(publisher->endpoint()));
  ASSERT_TRUE(sub);
  ASSERT_TRUE(WarmUp(*publisher, *sub));
  const uint64_t before = publisher->stats().next_seq;
  publisher->Publish({testing::StoredEvent(1), testing::StoredEvent(2)});  // 1 fits, 1 dropped
  publisher->Flush();
  publisher->Publish(testing::StoredEvent(3));
  publisher->Flush();
  auto ds = CollectUntil(*sub, before + 2);
  ASSERT_GE(ds.size(), 2u);
  EXPECT_EQ(ds[ds.size() - 2].kind, Kind::kGap);
  EXPECT_EQ(ds[ds.size() - 2].seq, before + 1);
  EXPECT_EQ(sub->stats().replay_requests, 0u);
}

// A subscriber that got `batches` batches of a publisher (after the warm-up), then a new run of
// the publisher on the same endpoints (its seq starts at 0 again) that publishes
// AllBlocksCleared.
struct Restarted {
  std::unique_ptr<EventPublisher> publisher;
  std::unique_ptr<EventSubscriber> sub;
  uint64_t last_old = 0;  // the old run's last seq, delivered
};
void FollowThenRestart(const EventPublisherOptions& options, uint64_t batches, Restarted* r) {
  r->publisher = StartPublisher(options);
  ASSERT_TRUE(r->publisher);
  r->sub = StartSubscriber(SubscriberFor(*r->publisher));
  ASSERT_TRUE(r->sub);
  ASSERT_TRUE(WarmUp(*r->publisher, *r->sub));
  PublishSingles(*r->publisher, 0, batches);
  r->last_old = r->publisher->stats().next_seq - 1;
  CollectUntil(*r->sub, r->last_old);
  r->publisher.reset();
  r->publisher = StartPublisher(options);
  ASSERT_TRUE(r->publisher);
  r->publisher->Publish(AllBlocksCleared{});  // what a restarted publisher sends first
}

// Reads until the subscriber reports a reset (at most 9 s), publishing one batch whenever it
// has nothing to deliver (until the SUB has reconnected, batches of a new run go nowhere).
// Everything else it delivers meanwhile goes to `before`.
std::optional<EventDelivery> AwaitReset(Restarted& r, std::vector<EventDelivery>* before) {
  for (int attempt = 0; attempt < 90; ++attempt) {
    auto d = r.sub->Next(100ms);
    if (d.ok() && d->kind == Kind::kReset) return std::move(*d);
    if (d.ok()) before->push_back(std::move(*d));
    if (!d.ok()) PublishSingles(*r.publisher, 5000 + attempt, 1);
  }
  return std::nullopt;
}

TEST(EventSubscriber, PublisherRestartIsReportedAsResetAndFollowedFromSeqZero) {
  testing::TempDir dir;
  Restarted r;
  ASSERT_NO_FATAL_FAILURE(FollowThenRestart(testing::IpcPublisherOptions(dir), 100, &r));
  auto& sub = r.sub;
  r.publisher->Flush();
  // One batch at a time, so the first one seen is still below the old run's seqs.
  std::vector<EventDelivery> before;
  const std::optional<EventDelivery> reset = AwaitReset(r, &before);
  ASSERT_TRUE(reset) << "no reset reported";
  EXPECT_GE(reset->previous_seq, 100u);
  EXPECT_LT(reset->seq, 100u);
  // The new run from its seq 0 (AllBlocksCleared), replayed if it was missed.
  auto ds = CollectUntil(*sub, reset->seq);
  ExpectContiguousBatches(ds, 0);
  ASSERT_FALSE(ds.empty());
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(ds[0].batch->events[0]));
  EXPECT_EQ(sub->stats().resets, 1u);
}

// A restarted publisher whose new run passed our position before the SUB heard it: live alone
// looks like a gap, and the replay that fills it comes from the new run (before, it was taken for
// the continuation of the old one). The replay begins at the last batch delivered; the new run's
// batch there differs, so the restart is reported and the new run followed from its seq 0.
TEST(EventSubscriber, APublisherRestartSeenOnlyThroughAReplayIsReportedAsAReset) {
  testing::TempDir dir;
  Restarted r;
  ASSERT_NO_FATAL_FAILURE(FollowThenRestart(testing::IpcPublisherOptions(dir), 10, &r));
  auto& sub = r.sub;
  const uint64_t last_old = r.last_old;
  // Before the SUB reconnects (ZMQ retries after 100 ms), the new run goes past the old one.
  PublishSingles(*r.publisher, 7000, last_old + 5);
  r.publisher->Flush();
  const uint64_t passed = r.publisher->stats().next_seq;
  std::vector<EventDelivery> before;
  const std::optional<EventDelivery> reset = AwaitReset(r, &before);
  ASSERT_TRUE(reset) << "no reset reported; " << before.size() << " deliveries first, the first "
                     << (before.empty() ? std::string("none") : std::to_string(before[0].seq));
  EXPECT_TRUE(before.empty()) << "the new run's batches were delivered as the old run's";
  EXPECT_EQ(reset->previous_seq, last_old);
  auto ds = CollectUntil(*sub, passed);
  ExpectContiguousBatches(ds, 0);
  ASSERT_FALSE(ds.empty());
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(ds[0].batch->events[0]));
  EXPECT_EQ(sub->stats().resets, 1u);
  EXPECT_EQ(sub->stats().resets_seen_in_replay, 1u);
}

TEST(EventSubscriber, MalformedLiveMessagesAreSkippedAndCounted) {
  zmq::context_t context(1);
  zmq::socket_t pub(context, zmq::socket_type::pub);
  pub.set(zmq::sockopt::linger, 0);
  pub.bind("tcp://127.0.0.1:*");
  auto sub = StartSubscriber(SubscriberOf(pub.get(zmq::sockopt::last_endpoint)));
  ASSERT_TRUE(sub);
  const std::string payload = EncodeEventBatch(EventBatch{1.0, {AllBlocksCleared{}}, 0});
  // Until the subscription has reached the PUB, send valid batches 0, 1, 2...
  uint64_t seq = 0;
  bool joined = false;
  for (; seq < 200 && !joined; ++seq) {
    testing::SendFrames(pub, {"", EncodeSeq(seq), payload});
    joined = sub->Next(50ms).ok();
  }
  ASSERT_TRUE(joined);
  testing::SendFrames(pub, {"", EncodeSeq(seq)});                    // 2 frames
  testing::SendFrames(pub, {"", "1234567", payload});                // 7-byte seq
  testing::SendFrames(pub, {"", EncodeSeq(seq), payload, "extra"});  // 4 frames
  testing::SendFrames(pub, {"", EncodeSeq(seq), "\x93\x01"});        // bad payload
  auto d = sub->Next(10s);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  // Batches sent while joining may still be queued; skip to the one after them.
  while (d.ok() && d->seq < seq) d = sub->Next(10s);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->seq, seq);
  EXPECT_FALSE(d->batch.has_value());
  EXPECT_TRUE(d->decode_status.IsInvalidParams()) << d->decode_status.ToString();
  EXPECT_EQ(sub->stats().malformed_messages, 3u);
}

TEST(EventSubscriber, AcceptsTheThreeFrameReplayLayoutOfOlderPublishers) {
  zmq::context_t context(1);
  zmq::socket_t pub(context, zmq::socket_type::pub);  // silent: everything comes from replay
  pub.set(zmq::sockopt::linger, 0);
  pub.bind("tcp://127.0.0.1:*");
  const std::string payload = EncodeEventBatch(EventBatch{1.0, {AllBlocksCleared{}}, 0});
  testing::ReplayServer sglang(context, {{0, payload}, {1, payload}, {2, payload}},
                               /*with_topic=*/false);
  EventSubscriberOptions o = SubscriberOf(pub.get(zmq::sockopt::last_endpoint), sglang.endpoint());
  o.from_seq = 1;
  auto sub = StartSubscriber(o);
  ASSERT_TRUE(sub);
  auto ds = CollectUntil(*sub, 2);
  ExpectContiguousBatches(ds, 1);
  EXPECT_TRUE(ds[0].replayed);
  EXPECT_EQ(ds[0].topic, "");
}

TEST(EventSubscriber, BatchLostBeforeAQuietPeriodIsRepairedByTheIdleProbe) {
  zmq::context_t context(1);
  zmq::socket_t pub(context, zmq::socket_type::pub);
  pub.set(zmq::sockopt::linger, 0);
  pub.bind("tcp://127.0.0.1:*");
  std::map<uint64_t, std::string> history;
  for (uint64_t seq = 0; seq < 400; ++seq) {
    history[seq] = EncodeEventBatch(EventBatch{double(seq), {AllBlocksCleared{}}, 0});
  }
  testing::ReplayServer server(context, history, /*with_topic=*/true);
  EventSubscriberOptions o = SubscriberOf(pub.get(zmq::sockopt::last_endpoint), server.endpoint());
  o.idle_probe_interval = 100ms;
  auto sub = StartSubscriber(o);
  ASSERT_TRUE(sub);
  std::optional<uint64_t> joined;
  for (uint64_t seq = 0; seq < 200 && !joined; ++seq) {
    testing::SendFrames(pub, {"", EncodeSeq(seq), history[seq]});
    auto d = sub->Next(50ms);
    if (d.ok()) joined = d->seq;
  }
  ASSERT_TRUE(joined);
  // The batches after the last one sent exist (in the replay history) but never arrive live:
  // nothing live follows, so only the idle probe can find them.
  auto ds = CollectUntil(*sub, 399);
  EXPECT_GE(server.requests(), 1);
  ASSERT_FALSE(ds.empty());
  EXPECT_TRUE(ds.back().replayed);
  EXPECT_EQ(sub->stats().gaps_reported, 0u);
  uint64_t next = *joined + 1;
  for (const EventDelivery& d : ds) {
    ASSERT_EQ(d.kind, Kind::kBatch);
    EXPECT_EQ(d.seq, next++);
  }
}

TEST(EventSubscriber, FromSeqWithoutReplayEndpointIsRejected) {
  EventSubscriberOptions o = SubscriberOf("tcp://127.0.0.1:1");
  o.from_seq = 0;
  auto sub = EventSubscriber::Start(o);
  ASSERT_FALSE(sub.ok());
  EXPECT_NE(sub.status().message().find("replay_endpoint"), std::string::npos);
}

TEST(EventSubscriber, MissingEndpointOrBadOptionIsRejectedWithAReason) {
  auto none = EventSubscriber::Start(EventSubscriberOptions{});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("endpoint"), std::string::npos);
  EventSubscriberOptions o = SubscriberOf("tcp://127.0.0.1:1");
  o.rcvhwm = -1;
  auto bad = EventSubscriber::Start(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rcvhwm"), std::string::npos) << bad.status().ToString();
  auto unparsable = EventSubscriber::Start(SubscriberOf("tcp://no-port"));
  ASSERT_FALSE(unparsable.ok());
  EXPECT_NE(unparsable.status().message().find("tcp://no-port"), std::string::npos);
}

TEST(EventSubscriber, NextTimesOutWhenNothingArrives) {
  testing::TempDir dir;
  auto sub = StartSubscriber(SubscriberOf(dir.Ipc("nobody.sock")));
  ASSERT_TRUE(sub);
  auto d = sub->Next(20ms);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(d.status().IsTimeout());
}

TEST(EventSubscriber, SilentReplayServerIsGivenUpAndTheGapReported) {
  testing::TempDir dir;
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);  // receives, never answers
  router.set(zmq::sockopt::linger, 0);
  router.bind(dir.Ipc("replay.sock"));
  zmq::socket_t pub(context, zmq::socket_type::pub);
  pub.set(zmq::sockopt::linger, 0);
  pub.bind(dir.Ipc("pub.sock"));
  EventSubscriberOptions o = SubscriberOf(dir.Ipc("pub.sock"), dir.Ipc("replay.sock"));
  o.replay_timeout = 200ms;
  o.idle_probe_interval = 0ms;  // exactly one replay request: the gap repair
  auto sub = StartSubscriber(o);
  ASSERT_TRUE(sub);
  const std::string payload = EncodeEventBatch(EventBatch{1.0, {}, 0});
  std::optional<uint64_t> joined;
  for (uint64_t seq = 0; seq < 200 && !joined; ++seq) {
    testing::SendFrames(pub, {"", EncodeSeq(seq), payload});
    auto d = sub->Next(50ms);
    if (d.ok()) joined = d->seq;
  }
  ASSERT_TRUE(joined);
  const uint64_t far = *joined + 1000;  // everything in between is lost
  testing::SendFrames(pub, {"", EncodeSeq(far), payload});
  std::vector<EventDelivery> ds = CollectUntil(*sub, far);
  ASSERT_GE(ds.size(), 2u);
  const EventDelivery& gap = ds[ds.size() - 2];
  EXPECT_EQ(gap.kind, Kind::kGap);
  EXPECT_EQ(gap.gap_to, far - 1);
  EXPECT_EQ(ds.back().seq, far);
  EXPECT_FALSE(ds.back().replayed);
  EXPECT_EQ(sub->stats().replay_requests, 1u);
  EXPECT_EQ(sub->stats().gaps_repaired, 0u);
  auto request = testing::ReceiveFrames(router, 1s);
  ASSERT_TRUE(request) << "the replay request never reached the server";
  EXPECT_EQ(request->size(), 3u);
  // From the last batch delivered, which the answer must begin with (the same run's).
  EXPECT_EQ(DecodeSeq(request->back()), gap.seq - 1);
}

}  // namespace
}  // namespace kvagent::events

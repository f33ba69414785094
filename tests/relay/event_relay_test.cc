// EventRelay against a real master (MasterService + EventPublisher) and a strict downstream
// subscriber: own contiguous seq, gap repair, re-announce after unrepairable gaps and master
// restarts, convergence of a downstream index to the master's key set.
#include "kvagent/relay/event_relay.h"
#include "kvagent/relay/relay_flags.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <set>

#include "relay_test_support.h"

namespace kvagent::relay {
namespace {

using namespace std::chrono_literals;
using testing::Downstream;
using testing::Master;
using testing::RelayOptions;
using testing::Rig;
using testing::TempDir;
using testing::WaitFor;

std::vector<std::string> Keys(const std::string& prefix, int from, int to) {
  std::vector<std::string> keys;
  for (int i = from; i < to; ++i) keys.push_back(prefix + std::to_string(i));
  return keys;
}

// Sessions as writers tag them, non-ASCII included.
std::vector<std::string> Sessions(size_t n) {
  const std::vector<std::string> pool = {"sess-1", "sessão-β", "会话-7", "run-🚀", ""};
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back(pool[i % pool.size()]);
  return out;
}

bool FileExists(const std::string& ipc_endpoint) {
  struct stat st {};
  return stat(ipc_endpoint.substr(6).c_str(), &st) == 0;
}

TEST(EventRelay, RepublishesMasterBatchesUnchangedWithItsOwnContiguousSeqFromZero) {
  TempDir dir;
  Master master(dir);
  master.Put(Keys("before-", 0, 30), Sessions(30));
  Rig rig(dir, master, master.Content(/*limit=*/8));
  ASSERT_TRUE(rig.started());
  rig.Converge();
  // Start: AllBlocksCleared, then the content (30 objects).
  EXPECT_EQ(rig.downstream->cleared(), 1);
  const uint64_t content_batches = rig.downstream->payloads().size();

  const uint64_t master_before = master.next_seq();
  for (int i = 0; i < 10; ++i) {
    master.Put({"live-" + std::to_string(i)}, {"sessão-" + std::to_string(i)});
  }
  master.Remove({"before-3", "live-2"});
  rig.Converge();
  // Each master batch went out as one of ours, byte for byte, in master order.
  const uint64_t relayed = master.next_seq() - master_before;
  const std::vector<std::string>& ours = rig.downstream->payloads();
  ASSERT_EQ(ours.size(), content_batches + relayed);
  const std::vector<events::testing::Frames> theirs =
      events::testing::RequestReplayFrom(master.replay_endpoint(), master_before);
  ASSERT_EQ(theirs.size(), relayed + 1);  // + end marker
  for (uint64_t i = 0; i < relayed; ++i) EXPECT_EQ(ours[content_batches + i], theirs[i][3]) << i;
  const EventRelayStats s = rig.stats();
  EXPECT_EQ(s.reannounces, 1u);
  EXPECT_EQ(s.objects_reannounced, 30u);
  EXPECT_EQ(s.unrepaired_gaps + s.resets, 0u);
  EXPECT_GE(s.relayed_batches, relayed);
}

TEST(EventRelay, AMasterGapIsRepairedThroughTheMastersReplayWithoutReannouncing) {
  TempDir dir;
  Master master(dir);
  testing::Link link(dir, master.events_endpoint());
  Rig rig(dir, master, master.Content(), link.endpoint());
  ASSERT_TRUE(rig.started());
  // Until the link has joined the master's PUB, move the stream on with empty batches.
  ASSERT_TRUE(WaitFor([&] {
    master.PublishEmptyBatch();
    return link.forwarded() > 0;
  }));
  rig.Converge();
  link.Lose(5);
  for (int i = 0; i < 12; ++i) master.Put({"k" + std::to_string(i)}, {"会话-" + std::to_string(i)});
  master.Remove({"k4"});
  ASSERT_TRUE(WaitFor([&] { return link.lost() == 5; }));
  rig.Converge();
  EXPECT_EQ(rig.downstream->cleared(), 1) << "a repaired gap needs no re-announce";
  const EventRelayStats s = rig.stats();
  EXPECT_GE(s.repaired_gaps, 1u);
  EXPECT_GE(s.replayed_batches, 5u);
  EXPECT_EQ(s.unrepaired_gaps, 0u);
  EXPECT_EQ(s.reannounces, 1u);
}

TEST(EventRelay, AGapReplayCannotRepairIsFollowedByAReannounceByDifferencesAndTheIndexConverges) {
  TempDir dir;
  Master master(dir, /*replay_batches=*/2);
  testing::Link link(dir, master.events_endpoint());
  master.Put(Keys("old-", 0, 20), Sessions(20));
  Rig rig(dir, master, master.Content(/*limit=*/5), link.endpoint());
  ASSERT_TRUE(rig.started());
  ASSERT_TRUE(WaitFor([&] {
    master.PublishEmptyBatch();
    return link.forwarded() > 0;
  }));
  rig.Converge();

  // Ten batches lost; the master keeps only two: removes and puts the relay never sees live.
  link.Lose(10);
  master.Remove({"old-1", "old-2"});
  master.Put({"lost-a"}, {"sessão-β"});
  master.Remove({"old-3"});
  master.Put({"lost-b", "lost-c"}, {"", "run-🚀"});
  master.RemoveAll();  // AllBlocksCleared in the lost part
  master.Put(Keys("after-clear-", 0, 6), Sessions(6));
  master.Remove({"after-clear-0"});
  master.Put({"lost-d"});
  master.Put({"lost-e"}, {"s"});
  master.Remove({"lost-d"});
  ASSERT_TRUE(WaitFor([&] { return link.lost() == 10; }));
  master.Put({"seen-1"}, {"sess-1"});  // reveals the gap
  master.Put({"seen-2"});
  rig.Converge();
  // Start, then at least one for the gap (an idle probe may have found part of it earlier),
  // which publishes the differences: the removes and the RemoveAll it missed arrive as one
  // BlockRemoved per object, and nothing clears the consumers' index again.
  EXPECT_EQ(rig.downstream->cleared(), 1);
  for (const char* k : {"old-0", "old-1", "old-3", "old-19"}) {
    EXPECT_EQ(rig.downstream->removed().count(k), 1u) << k;
  }
  const EventRelayStats s = rig.stats();
  EXPECT_GE(s.unrepaired_gaps, 1u);
  EXPECT_GE(s.missing_batches, 1u);
  EXPECT_GE(s.reannounces, 2u);
  EXPECT_EQ(s.clearing_reannounces, 1u);
  EXPECT_GE(s.objects_removed, 20u);
  EXPECT_EQ(s.indexed_objects, master.Keys().size());
}

TEST(EventRelay, AMasterRestartIsFollowedByAReannounceOfTheDifferencesToTheNewContent) {
  TempDir dir;
  Master master(dir);
  master.Put(Keys("first-life-", 0, 10), Sessions(10));
  Rig rig(dir, master, master.Content());
  ASSERT_TRUE(rig.started());
  rig.Converge();
  for (int i = 0; i < 40; ++i) master.Put({"more-" + std::to_string(i)});
  // A long first life: the new run's seq stays below it until the SUB reconnects, so
  // the restart shows as a seq going back (EventSubscriber's documented limit).
  for (int i = 0; i < 1000; ++i) master.PublishEmptyBatch();
  rig.Converge();

  master.Restart();  // seq starts at 0 again; the old content is gone
  // Until the relay's SUB has reconnected, live batches of the new run are lost to it;
  // keep the stream moving so a reconnected SUB sees a seq below the old ones.
  master.Put({"second-life-0"}, {"sessão-β"});
  ASSERT_TRUE(WaitFor([&] {
    if (rig.stats().resets > 0) return true;
    master.PublishEmptyBatch();
    return false;
  }));
  master.Put({"second-life-1"});
  rig.Converge();
  EXPECT_EQ(rig.downstream->keys().count("first-life-0"), 0u);
  EXPECT_EQ(rig.downstream->removed().count("first-life-0"), 1u);
  EXPECT_EQ(rig.downstream->cleared(), 1) << [&] {
    std::string out;
    for (const std::string& p : rig.downstream->payloads()) {
      auto b = events::DecodeEventBatch(p);
      if (!b.ok()) continue;
      out += "batch:";
      for (const auto& e : b->events) out += " " + events::DescribeEvent(e).substr(0, 24) + ";";
      out += "\n";
    }
    return out;
  }();
  EXPECT_GE(rig.stats().reannounces, 2u);
  EXPECT_GE(rig.stats().objects_removed, 50u);  // first-life-* and more-*
}

TEST(EventRelay, ChangesDuringTheScanAreHeldBackAndPublishedAfterTheContent) {
  TempDir dir;
  Master master(dir);
  master.Put(Keys("k", 0, 60), Sessions(60));
  // While the relay pages (7 keys a page), the master keeps changing: keys already listed are
  // removed, keys behind the cursor appear, a key is re-tagged.
  int page = 0;
  auto between_pages = [&](uint64_t) {
    switch (page++) {
      case 0:
        master.Remove({"k1", "k2", "k3", "k50"});
        break;
      case 1:
        master.Put(Keys("new-", 0, 10), Sessions(10));
        break;
      case 2:
        master.Remove({"k7", "new-3"});
        master.Put({"k7"}, {"retagged"});
        break;
      default:
        break;
    }
  };
  Rig rig(dir, master, master.Content(/*limit=*/7, between_pages));
  ASSERT_TRUE(rig.started());
  rig.Converge();
  ASSERT_GE(page, 3) << "the scan had fewer pages than the test changes";
  EXPECT_EQ(rig.downstream->keys().at("k7"), "retagged");
  EXPECT_EQ(rig.stats().reannounces, 1u);
}

TEST(EventRelay, AFailedContentPageIsRetriedAndTheReannounceStartsOver) {
  TempDir dir;
  Master master(dir);
  master.Put(Keys("k", 0, 25), Sessions(25));
  ContentSource real = master.Content(/*limit=*/4);
  std::atomic<int> calls{0};
  // The second page fails once, as a master link that is down for a moment answers.
  ContentSource flaky = [&](uint64_t cursor) -> Result<ContentPage> {
    if (++calls == 2) return Status(ErrorCode::kMasterUnavailable, "master link down");
    return real(cursor);
  };
  Rig rig(dir, master, flaky);
  ASSERT_TRUE(rig.started());
  rig.Converge();
  EXPECT_EQ(rig.downstream->cleared(), 2) << "the failed attempt's AllBlocksCleared, the retry's";
  const EventRelayStats s = rig.stats();
  EXPECT_EQ(s.content_failures, 1u);
  EXPECT_EQ(s.reannounce_restarts, 1u);
  EXPECT_EQ(s.reannounces, 1u);
  EXPECT_EQ(s.objects_reannounced, 25u);
}

TEST(EventRelay, ContentThatWouldBreakStrictConsumersIsSkippedAndCounted) {
  TempDir dir;
  Master master(dir);
  master.Put({"good-1", "good-2"}, {"sess-1", "sessão-β"});
  ContentSource real = master.Content();
  ContentSource with_bad = [&](uint64_t cursor) -> Result<ContentPage> {
    Result<ContentPage> page = real(cursor);
    if (page.ok()) {
      page->objects.push_back(AnnouncementFromKey("bad-session", "\xc3\x28"));
      events::BlockStored tokens = AnnouncementFromKey("bad-tokens", "");
      tokens.token_ids = {1, 2, 3};
      tokens.block_size = 2;
      page->objects.push_back(tokens);
      events::BlockStored medium = AnnouncementFromKey("bad-medium", "");
      medium.medium = "disk";
      page->objects.push_back(medium);
    }
    return page;
  };
  Rig rig(dir, master, with_bad);
  ASSERT_TRUE(rig.started());
  rig.Converge();  // every batch decoded strictly
  EXPECT_EQ(rig.stats().invalid_objects, 3u);
  EXPECT_EQ(rig.stats().objects_reannounced, 2u);
}

// A master batch strict consumers cannot read (a kvmaster of another version, or a broken one)
// is not republished: the downstream here fails the test on any batch it cannot decode. Its
// changes arrive through a re-announce: by differences when the batch failed before its first
// event (consumers keep their index), a clearing one when the relay's index took some of it.
TEST(EventRelay, AMasterBatchStrictConsumersCannotReadIsLeftOutAndItsChangesReannounced) {
  for (const bool trailing : {false, true}) {
    SCOPED_TRACE(trailing ? "fails after its events" : "fails before its first event");
    TempDir dir;
    Master master(dir);
    master.Put(Keys("before-", 0, 10), Sessions(10));
    Rig rig(dir, master, master.Content(/*limit=*/4));
    ASSERT_TRUE(rig.started());
    rig.Converge();
    master.PutUnreadable({"unreadable-a", "unreadable-b"}, trailing);
    master.Put({"after"}, {"sess-1"});
    rig.Converge();  // the downstream index equals the master's key set: both keys included
    const EventRelayStats s = rig.stats();
    EXPECT_EQ(s.unreadable_batches, 1u);
    EXPECT_EQ(s.reannounces, 2u);
    EXPECT_EQ(rig.downstream->cleared(), trailing ? 2 : 1);
    EXPECT_EQ(s.clearing_reannounces, trailing ? 2u : 1u);
    // A second one within 10 s of the last re-announce waits for the next.
    master.PutUnreadable({"unreadable-c"}, trailing);
    master.Put({"after-2"});
    ASSERT_NO_FATAL_FAILURE(testing::Settle(master, *rig.relay, *rig.downstream));
    EXPECT_EQ(rig.stats().unreadable_batches, 2u);
    EXPECT_EQ(rig.stats().reannounces, 2u);
  }
}

TEST(EventRelay, AQuietMasterIsJoinedThroughItsRetainedHistory) {
  TempDir dir;
  Master master(dir);
  master.Put(Keys("k", 0, 5), Sessions(5));
  // Nothing is published after the relay starts: only the master's replay can place it.
  Rig rig(dir, master, master.Content());
  ASSERT_TRUE(rig.started());
  rig.Converge();
  EXPECT_EQ(rig.stats().reannounces, 1u);
}

// A relay that starts (an agent restarting) while its master is quiet and no longer retains
// seq 0: the history it asks for starts with a gap, which the re-announce covers. Nothing is
// lost downstream, so nothing is reported lost (it was logged as "master batches 0..N are
// lost" and counted as an unrepaired gap).
TEST(EventRelay, JoiningAQuietMasterWhoseHistoryNoLongerReachesSeqZeroReportsNoLoss) {
  TempDir dir;
  Master master(dir, /*replay_batches=*/2);
  for (int i = 0; i < 6; ++i) master.Put({"k" + std::to_string(i)}, {"sess-1"});
  Rig rig(dir, master, master.Content());
  ASSERT_TRUE(rig.started());
  rig.Converge();
  EXPECT_EQ(rig.downstream->cleared(), 1);
  const EventRelayStats s = rig.stats();
  EXPECT_EQ(s.unrepaired_gaps, 0u);
  EXPECT_EQ(s.missing_batches, 0u);
  EXPECT_EQ(s.reannounces, 1u);
  EXPECT_EQ(s.reannounce_restarts, 0u);
}

TEST(EventRelay, RequestResyncReannouncesTheContent) {
  TempDir dir;
  Master master(dir);
  master.Put(Keys("k", 0, 8));
  Rig rig(dir, master, master.Content());
  ASSERT_TRUE(rig.started());
  rig.Converge();
  rig.relay->RequestResync();
  ASSERT_TRUE(WaitFor([&] { return rig.stats().reannounces == 2; }));
  rig.Converge();
  // The consumers already hold all of it: the second re-announce publishes nothing.
  EXPECT_EQ(rig.downstream->cleared(), 1);
  EXPECT_EQ(rig.stats().objects_reannounced, 8u);
  EXPECT_EQ(rig.stats().objects_removed, 0u);
  // A re-tagged object is published again, after a BlockRemoved of the old announcement.
  master.Remove({"k3"});
  master.Put({"k3"}, {"new-tag"});
  rig.Converge();
  rig.relay->RequestResync();
  ASSERT_TRUE(WaitFor([&] { return rig.stats().reannounces == 3; }));
  rig.Converge();
  EXPECT_EQ(rig.downstream->keys().at("k3"), "new-tag");
  EXPECT_EQ(rig.stats().objects_reannounced, 8u);
}

TEST(EventRelay, AnExtraTcpEndpointCarriesTheSameBatchesWithTheSameSeq) {
  TempDir dir;
  Master master(dir);
  Rig rig(dir, master, master.Content(), "",
          [](EventRelayOptions& o) { o.extra_endpoints = {"tcp://127.0.0.1:0"}; });
  ASSERT_TRUE(rig.started());
  ASSERT_EQ(rig.relay->extra_endpoints().size(), 1u);
  Downstream tcp(rig.relay->extra_endpoints()[0], rig.relay->replay_endpoint());
  master.Put(Keys("k", 0, 10), Sessions(10));
  rig.Converge();
  tcp.CatchUp(rig.stats().next_seq - 1);
  EXPECT_EQ(rig.downstream->payloads(), tcp.payloads());
  EXPECT_EQ(tcp.keys(), master.Keys());
}

TEST(EventRelay, ShutdownRemovesItsIpcSocketFiles) {
  TempDir dir;
  Master master(dir);
  Rig rig(dir, master, master.Content());
  ASSERT_TRUE(rig.started());
  const std::string pub = rig.relay->endpoint();
  const std::string replay = rig.relay->replay_endpoint();
  EXPECT_TRUE(FileExists(pub));
  EXPECT_TRUE(FileExists(replay));
  rig.relay.reset();
  EXPECT_FALSE(FileExists(pub));
  EXPECT_FALSE(FileExists(replay));
}

TEST(EventRelay, StartRefusesMissingOptionsAndUnbindableEndpointsWithAReason) {
  TempDir dir;
  Master master(dir);
  EventRelayOptions o =
      RelayOptions(dir, master.events_endpoint(), master.replay_endpoint(), master.Content());
  EventRelayOptions no_source = o;
  no_source.list_content = nullptr;
  auto r1 = EventRelay::Start(no_source);
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.status().message().find("list_content"), std::string::npos);
  EventRelayOptions no_master = o;
  no_master.master_events.clear();
  auto r2 = EventRelay::Start(no_master);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("--master-events"), std::string::npos);
  EventRelayOptions missing_dir = o;
  missing_dir.endpoint = "ipc:///nonexistent-kvagent-run-dir/events.sock";
  auto r3 = EventRelay::Start(missing_dir);
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.status().message().find("create it"), std::string::npos) << r3.status().ToString();
  EventRelayOptions bad_master = o;
  bad_master.master_events = "tcp://no-port";
  auto r4 = EventRelay::Start(bad_master);
  ASSERT_FALSE(r4.ok());
  EXPECT_NE(r4.status().message().find("tcp://no-port"), std::string::npos);
  EXPECT_FALSE(FileExists(o.endpoint)) << "a failed start leaves no socket file";
}

}  // namespace
}  // namespace kvagent::relay

namespace kvagent::relay {
namespace {

// A relay told its master later (discovery through etcd): it waits, follows the first master it
// is given, and after a switch to another (a failover) re-announces that one's content and relays
// nothing more of the first, even when the first keeps publishing.
TEST(EventRelay, SwitchMasterFollowsTheNewMasterAndNothingMoreOfTheOld) {
  TempDir dir_a, dir_b, dir;
  Master a(dir_a);
  Master b(dir_b);
  a.Put(Keys("a-", 0, 10), Sessions(10));
  b.Put(Keys("a-", 0, 8), Sessions(8));  // the new leader holds most of the old one's objects
  b.Put({"b-only"});                     // ... and what was written through it since
  std::atomic<Master*> current{&a};
  ContentSource content = [&](uint64_t cursor) { return current.load()->Content()(cursor); };
  EventRelayOptions o = RelayOptions(dir, "", "", content);
  o.await_master = true;
  auto relay = testing::StartRelay(std::move(o));
  ASSERT_TRUE(relay);
  Downstream downstream(relay->endpoint(), relay->replay_endpoint());
  EXPECT_EQ(relay->stats().phase, RelayPhase::kJoining);  // no master to follow yet

  relay->SwitchMaster(a.events_endpoint(), a.replay_endpoint());
  ASSERT_NO_FATAL_FAILURE(testing::Settle(a, *relay, downstream));
  EXPECT_EQ(downstream.keys(), a.Keys());
  relay->SwitchMaster(a.events_endpoint(), a.replay_endpoint());  // the same: changes nothing
  EXPECT_EQ(relay->stats().master_switches, 1u);

  current = &b;
  relay->SwitchMaster(b.events_endpoint(), b.replay_endpoint());
  b.Put({"b-after"});
  ASSERT_NO_FATAL_FAILURE(testing::Settle(b, *relay, downstream));
  EXPECT_EQ(downstream.keys(), b.Keys());
  // Lost in the failover: gone downstream too, each as a BlockRemoved, without clearing the
  // consumers' index.
  for (const char* lost : {"a-8", "a-9"}) {
    EXPECT_EQ(downstream.keys().count(lost), 0u) << lost;
    EXPECT_EQ(downstream.removed().count(lost), 1u) << lost;
  }
  EXPECT_EQ(downstream.removed().size(), 2u);
  EXPECT_EQ(downstream.cleared(), 1);
  EXPECT_EQ(relay->stats().objects_removed, 2u);
  EXPECT_EQ(relay->stats().master_switches, 2u);

  a.Put({"deposed-write"});  // the old master still publishes: nobody downstream sees it
  b.Put({"b-later"});
  ASSERT_NO_FATAL_FAILURE(testing::Settle(b, *relay, downstream));
  EXPECT_EQ(downstream.keys(), b.Keys());
  EXPECT_EQ(downstream.keys().count("deposed-write"), 0u);
}

TEST(EventRelay, AnEtcdMasterLeavesTheEventEndpointsToDiscovery) {
  EventRelayFlags flags;
  auto o = flags.Options("/tmp/run", "etcd://10.0.0.1:2379/prod");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(o->await_master);
  EXPECT_TRUE(o->master_events.empty());
  flags.master_events = "tcp://10.0.0.1:5557";  // fixed endpoints cannot follow a failover
  EXPECT_FALSE(flags.Options("/tmp/run", "etcd://10.0.0.1:2379/prod").ok());
}

}  // namespace
}  // namespace kvagent::relay

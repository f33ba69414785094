// Reserved writes (ReserveWrites + BatchPutCommit): the put path with one master round trip.
// Every fault a commit can meet — sent twice, late, to a restarted master, for a key someone
// else stored, with a write that was returned, expired or never this agent's — ends either in
// the value the agent wrote being readable under its key, or in nothing stored with a code that
// says so; never in a key that reads other bytes.
#include <gtest/gtest.h>

#include <filesystem>

#include "kvagent/master/master_service.h"
#include "master_test_util.h"

namespace kvagent::master {
namespace {

using testing::Cluster;
using testing::Views;

MasterOptions Options() {
  MasterOptions o;
  o.put_timeout_ms = 1000;
  o.put_release_timeout_ms = 5000;
  return o;
}

// What an agent holds after ReserveWrites: per reserved write, its id and placements.
struct Reserved {
  std::vector<uint64_t> ids;
  std::vector<std::vector<Placement>> placements;
  Status status;
};

Reserved Reserve(Cluster& c, AgentId agent, uint64_t size, uint32_t count,
                 std::vector<uint64_t> returned = {}, uint8_t replicas = 1) {
  ReserveWritesRequest r;
  r.agent = agent;
  r.size = size;
  r.replica_count = replicas;
  r.count = count;
  r.returned = returned;
  PlacementBatch out;
  Reserved got;
  got.status = c.svc->ReserveWrites(r, &out);
  got.ids = out.write_ids;
  for (size_t i = 0; i < out.write_ids.size(); ++i) {
    EXPECT_TRUE(out.results[i].ok());
    got.placements.emplace_back(out.placements.begin() + out.first[i],
                                out.placements.begin() + out.first[i + 1]);
  }
  return got;
}

struct Commit {
  std::vector<std::string> keys = {};
  std::vector<uint64_t> sizes = {};
  std::vector<std::string> sessions = {};
  std::vector<uint64_t> ids = {};
  std::vector<uint32_t> part_counts = {};
  std::vector<uint32_t> checksums = {};
  uint64_t epoch = 0;  // 0: the service's
  WriteOptions options = {};
};

KeyResults Send(Cluster& c, AgentId agent, const Commit& m) {
  auto keys = Views(m.keys);
  auto sessions = Views(m.sessions);
  WriteCommitRequest r;
  r.start.agent = agent;
  r.start.keys = keys;
  r.start.sizes = m.sizes;
  r.start.session_ids = sessions;
  r.start.options = m.options;
  r.finish.agent = agent;
  r.finish.keys = keys;
  r.finish.write_ids = m.ids;
  r.finish.part_counts = m.part_counts;
  r.finish.checksums = m.checksums;
  r.master_epoch = m.epoch ? m.epoch : c.svc->epoch();
  KeyResults out;
  c.last_status = c.svc->BatchPutCommit(r, &out);
  return out;
}

TEST(ReservedWrites, ACommittedKeyIsReadableInItsReservedPlacementWithItsSessionAndChecksum) {
  Cluster c(Options());
  c.Events();
  Reserved r = Reserve(c, c.agents[0], 4096, 4);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.ids.size(), 4u);
  EXPECT_EQ(c.svc->Stats().reserved_writes, 4u);
  EXPECT_TRUE(c.Events().empty());  // nothing is readable yet
  for (const auto& p : r.placements) {
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(c.svc->FindPool(p[0].pool_id)->agent, c.agents[0]);  // the writer's pool
  }
  KeyResults k = Send(c, c.agents[0],
                      {.keys = {"a", "b"},
                       .sizes = {4096, 4096},
                       .sessions = {"s-a", "s-b"},
                       .ids = {r.ids[0], r.ids[1]},
                       .part_counts = {1, 1},
                       .checksums = {0xA, 0xB}});
  ASSERT_TRUE(c.last_status.ok()) << c.last_status.ToString();
  ASSERT_TRUE(k.results[0].ok()) << k.results[0].ToString();
  ASSERT_TRUE(k.results[1].ok()) << k.results[1].ToString();
  EXPECT_EQ(k.replicas, (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(c.svc->SessionOf("a"), "s-a");
  EXPECT_EQ(c.svc->SessionOf("b"), "s-b");
  PlacementBatch g = c.Get({"a"});
  ASSERT_TRUE(g.results[0].ok());
  EXPECT_EQ(g.placements[0].pool_id, r.placements[0][0].pool_id);
  EXPECT_EQ(g.placements[0].offset, r.placements[0][0].offset);
  EXPECT_TRUE(g.placements[0].checksummed);
  EXPECT_EQ(g.placements[0].checksum, 0xAu);
  EXPECT_EQ(g.write_ids[0], r.ids[0]);  // the version is the reserved write's id
  auto events = c.Events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(testing::AsStored(events[0]).session_id, "s-a");
  const MasterStats s = c.svc->Stats();
  EXPECT_EQ(s.reserved_writes, 2u);
  EXPECT_EQ(s.reserved_commits, 2u);
  EXPECT_EQ(s.keys, 2u);
}

TEST(ReservedWrites, ACommitSentTwiceIsAnsweredOkOnceStoredAndAnnouncedOnce) {
  Cluster c(Options());
  Reserved r = Reserve(c, c.agents[0], 4096, 1);
  ASSERT_EQ(r.ids.size(), 1u);
  const Commit m{.keys = {"k"}, .sizes = {4096}, .ids = {r.ids[0]}};
  ASSERT_TRUE(Send(c, c.agents[0], m).results[0].ok());
  c.Events();
  KeyResults again = Send(c, c.agents[0], m);
  EXPECT_TRUE(again.results[0].ok()) << again.results[0].ToString();
  EXPECT_EQ(again.replicas[0], 1);
  EXPECT_TRUE(c.Events().empty());
  // Once the key is gone, the same commit arriving late stores nothing: the reserved write
  // is spent, its space may hold another value by now.
  ASSERT_TRUE(c.Remove({"k"}).results[0].ok());
  KeyResults late = Send(c, c.agents[0], m);
  EXPECT_EQ(late.results[0].code(), ErrorCode::kMasterUnavailable);
  EXPECT_FALSE(c.Exists("k"));
}

TEST(ReservedWrites, AKeyAlreadyStoredKeepsItsValueAndTheReservedWriteIsAbandoned) {
  Cluster c(Options());
  c.Put(c.agents[1], {"k"}, 4096, {"first"});
  const uint64_t version = c.Get({"k"}).write_ids[0];
  Reserved r = Reserve(c, c.agents[0], 4096, 1);
  c.Events();
  KeyResults k =
      Send(c, c.agents[0], {.keys = {"k"}, .sizes = {4096}, .sessions = {"second"}, .ids = r.ids});
  EXPECT_EQ(k.results[0].code(), ErrorCode::kObjectAlreadyExists);
  EXPECT_EQ(c.svc->SessionOf("k"), "first");
  EXPECT_EQ(c.Get({"k"}).write_ids[0], version);
  EXPECT_TRUE(c.Events().empty());
  const MasterStats s = c.svc->Stats();
  EXPECT_EQ(s.reserved_writes, 0u);
  EXPECT_EQ(s.reserved_returned, 1u);
  EXPECT_EQ(s.pending_fences, 1u);  // its bytes were written: fenced before reuse
}

TEST(ReservedWrites, AKeyBeingWrittenIsNotTakenOverBeforeThePutTimeoutButIsAfterIt) {
  Cluster c(Options());
  auto started = c.Start(c.agents[1], {"k"}, {4096});
  ASSERT_TRUE(started.results[0].ok());
  Reserved r = Reserve(c, c.agents[0], 4096, 2);
  KeyResults early = Send(c, c.agents[0], {.keys = {"k"}, .sizes = {4096}, .ids = {r.ids[0]}});
  EXPECT_EQ(early.results[0].code(), ErrorCode::kObjectAlreadyExists);
  c.clock.Advance(1500);  // past the put timeout, within the release timeout
  KeyResults late = Send(c, c.agents[0], {.keys = {"k"}, .sizes = {4096}, .ids = {r.ids[1]}});
  ASSERT_TRUE(late.results[0].ok()) << late.results[0].ToString();
  EXPECT_EQ(c.Get({"k"}).write_ids[0], r.ids[1]);
  // The first writer's End finds its write taken over.
  KeyResults end = c.EndWith(c.agents[1], {"k"}, {started.write_ids[0]});
  EXPECT_EQ(end.results[0].code(), ErrorCode::kObjectNotFound);
  EXPECT_EQ(c.svc->Stats().taken_over_puts, 1u);
}

TEST(ReservedWrites, AnotherMastersEpochIsRefusedAndChangesNothing) {
  Cluster c(Options());
  Reserved r = Reserve(c, c.agents[0], 4096, 1);
  KeyResults k =
      Send(c, c.agents[0], {.keys = {"k"}, .sizes = {4096}, .ids = r.ids, .epoch = 12345});
  EXPECT_TRUE(c.last_status.ok());
  EXPECT_EQ(k.results[0].code(), ErrorCode::kMasterUnavailable);
  EXPECT_FALSE(c.Exists("k"));
  EXPECT_EQ(c.svc->Stats().reserved_writes, 1u);
  EXPECT_EQ(c.svc->Stats().bad_requests, 0u);
}

TEST(ReservedWrites, AWriteOfAnotherAgentOrUnknownIsRefusedAndLeftAlone) {
  Cluster c(Options());
  Reserved theirs = Reserve(c, c.agents[1], 4096, 1);
  KeyResults k =
      Send(c, c.agents[0],
           {.keys = {"k", "j"}, .sizes = {4096, 4096}, .ids = {theirs.ids[0], 987654321}});
  EXPECT_EQ(k.results[0].code(), ErrorCode::kMasterUnavailable);
  EXPECT_EQ(k.results[1].code(), ErrorCode::kMasterUnavailable);
  EXPECT_FALSE(c.Exists("k"));
  EXPECT_EQ(c.svc->Stats().reserved_writes, 1u);  // still agent 1's
  KeyResults mine = Send(c, c.agents[1], {.keys = {"k"}, .sizes = {4096}, .ids = theirs.ids});
  EXPECT_TRUE(mine.results[0].ok());
}

TEST(ReservedWrites, ReturnedAndExpiredWritesAreFencedAndCannotBeCommitted) {
  MasterOptions o = Options();
  Cluster c(o);
  Reserved r = Reserve(c, c.agents[0], 4096, 3);
  ASSERT_EQ(r.ids.size(), 3u);
  const uint64_t used = c.svc->Stats().bytes_used;
  Reserved none = Reserve(c, c.agents[0], 4096, 0, {r.ids[0]});
  ASSERT_TRUE(none.status.ok());
  EXPECT_TRUE(none.ids.empty());
  EXPECT_EQ(c.svc->Stats().reserved_writes, 2u);
  EXPECT_EQ(c.svc->Stats().bytes_used, used);  // held until the pool fenced it
  c.Fence(c.agents[0]);
  EXPECT_LT(c.svc->Stats().bytes_used, used);
  KeyResults k = Send(c, c.agents[0], {.keys = {"k"}, .sizes = {4096}, .ids = {r.ids[0]}});
  EXPECT_EQ(k.results[0].code(), ErrorCode::kMasterUnavailable);
  // Past the release timeout the others expire like any write in flight.
  c.Pass(o.put_release_timeout_ms + 200);
  EXPECT_EQ(c.svc->Stats().reserved_writes, 0u);
  KeyResults late = Send(c, c.agents[0], {.keys = {"k"}, .sizes = {4096}, .ids = {r.ids[1]}});
  EXPECT_EQ(late.results[0].code(), ErrorCode::kMasterUnavailable);
  EXPECT_FALSE(c.Exists("k"));
  // The fences name them for the agent's pool.
  HeartbeatResult h = c.Beat(c.agents[0]);
  EXPECT_GE(h.fenced_writes.size() + (h.write_watermark > r.ids[2] ? 2 : 0), 2u);
}

TEST(ReservedWrites, ASizeOrReplicaCountThatDoesNotFitIsRefusedAndTheWriteAbandoned) {
  Cluster c(Options());
  Reserved r = Reserve(c, c.agents[0], 4096, 2);
  KeyResults size = Send(c, c.agents[0], {.keys = {"k"}, .sizes = {8192}, .ids = {r.ids[0]}});
  EXPECT_EQ(size.results[0].code(), ErrorCode::kInvalidParams);
  WriteOptions two;
  two.replica_count = 2;
  KeyResults rc =
      Send(c, c.agents[0], {.keys = {"k"}, .sizes = {4096}, .ids = {r.ids[1]}, .options = two});
  EXPECT_EQ(rc.results[0].code(), ErrorCode::kInvalidParams);
  EXPECT_FALSE(c.Exists("k"));
  EXPECT_EQ(c.svc->Stats().reserved_writes, 0u);
}

TEST(ReservedWrites, ASmallerValueFillsThePartsInOrderAndTheRestIsFreedAtOnce) {
  MasterOptions o = Options();
  o.max_part_bytes = 4096;  // a reserved write of 12 KiB has three parts of 4 KiB
  Cluster c(o);
  Reserved r = Reserve(c, c.agents[0], 12288, 1);
  ASSERT_EQ(r.ids.size(), 1u);
  ASSERT_EQ(r.placements[0].size(), 3u);
  const uint64_t used = c.svc->Stats().bytes_used;
  KeyResults k =
      Send(c, c.agents[0],
           {.keys = {"k"}, .sizes = {5000}, .ids = r.ids, .part_counts = {2}, .checksums = {7, 8}});
  ASSERT_TRUE(k.results[0].ok()) << k.results[0].ToString();
  PlacementBatch g = c.Get({"k"});
  ASSERT_TRUE(g.results[0].ok());
  EXPECT_EQ(g.sizes[0], 5000u);
  ASSERT_EQ(g.placements.size(), 2u);
  EXPECT_EQ(g.placements[0].offset, r.placements[0][0].offset);
  EXPECT_EQ(g.placements[0].length, 4096u);
  EXPECT_EQ(g.placements[1].offset, r.placements[0][1].offset);
  EXPECT_EQ(g.placements[1].length, 904u);
  EXPECT_EQ(g.placements[1].checksum, 8u);
  // The third part and the tail of the second are free again (904 B take 960 B).
  EXPECT_EQ(c.svc->Stats().bytes_used, used - 4096 - (4096 - 960));
  ASSERT_TRUE(c.Remove({"k"}, /*force=*/true).results[0].ok());  // (the get leased it)
  EXPECT_EQ(c.svc->Stats().bytes_used, used - 12288);
}

TEST(ReservedWrites, ChecksumsThatDoNotFitItsPartsLeaveNothingBehind) {
  Cluster c(Options());
  Reserved r = Reserve(c, c.agents[0], 4096, 1);
  KeyResults k =
      Send(c, c.agents[0],
           {.keys = {"k"}, .sizes = {4096}, .ids = r.ids, .part_counts = {2}, .checksums = {1, 2}});
  EXPECT_EQ(k.results[0].code(), ErrorCode::kInvalidParams);
  EXPECT_FALSE(c.Exists("k"));
  EXPECT_EQ(c.svc->Stats().writes_in_flight, 0u);
  EXPECT_FALSE(c.svc->HasSessionTag(""));
}

TEST(ReservedWrites, AnAgentHoldsAtMostItsShareAndReservationsNeverEvict) {
  // Two agents of 1 MiB: an agent's share is 1/8 of 2 MiB, 64 writes of 4 KiB.
  Cluster c(Options());
  Reserved r = Reserve(c, c.agents[0], 4096, 1000);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.ids.size(), 64u);
  EXPECT_TRUE(Reserve(c, c.agents[0], 4096, 10).ids.empty());
  // Near the high watermark nothing is reserved and nothing is evicted for it.
  c.Put(c.agents[1], {"big"}, 1600 * 1024);
  const uint64_t evictions = c.svc->Stats().evictions;
  EXPECT_TRUE(Reserve(c, c.agents[1], 4096, 64).ids.size() < 64u);
  EXPECT_EQ(c.svc->Stats().evictions, evictions);
  EXPECT_TRUE(c.Exists("big"));
}

TEST(ReservedWrites, BadRequestsAreRefusedWhole) {
  Cluster c(Options());
  EXPECT_EQ(Reserve(c, c.agents[0], 0, 1).status.code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(Reserve(c, c.agents[0], 4096, 5000).status.code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(Reserve(c, c.agents[0], 4096, 1, {}, 0).status.code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(Reserve(c, 4242, 4096, 1).status.code(), ErrorCode::kAgentUnavailable);
  Reserved r = Reserve(c, c.agents[0], 4096, 1);
  KeyResults k = Send(c, c.agents[0], {.keys = {"k"}, .sizes = {4096}, .ids = {}});
  EXPECT_EQ(c.last_status.code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(k.results[0].code(), ErrorCode::kInvalidParams);
  KeyResults bad_key = Send(c, c.agents[0], {.keys = {"\xFFk"}, .sizes = {4096}, .ids = r.ids});
  EXPECT_EQ(c.last_status.code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(c.svc->Stats().reserved_writes, 1u);  // refused whole: nothing touched
}

TEST(ReservedWrites, AMasterRestartForgetsThemAndTheirSpace) {
  auto dir =
      std::filesystem::temp_directory_path() / ("kvmaster-reserved-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  MasterOptions o = Options();
  o.state_dir = dir.string();
  {
    Cluster c(o, 1);
    c.Put(c.agents[0], {"kept"}, 4096, {"s"});
    const uint64_t used = c.svc->Stats().bytes_used;
    Reserved r = Reserve(c, c.agents[0], 4096, 8);
    ASSERT_EQ(r.ids.size(), 8u);
    const uint64_t committed_id = r.ids[7];
    ASSERT_TRUE(
        Send(c, c.agents[0], {.keys = {"committed"}, .sizes = {4096}, .ids = {committed_id}})
            .results[0]
            .ok());
    const uint64_t epoch = c.svc->epoch();
    c.Restart();
    c.Rejoin(0);  // registers and mounts again (same incarnation: its pool survived)
    EXPECT_EQ(c.svc->Stats().bytes_used, used + 4096);  // "kept" and "committed"
    EXPECT_EQ(c.svc->Stats().reserved_writes, 0u);
    KeyResults k =
        Send(c, c.agents[0], {.keys = {"k"}, .sizes = {4096}, .ids = {r.ids[0]}, .epoch = epoch});
    EXPECT_EQ(k.results[0].code(), ErrorCode::kMasterUnavailable);
    EXPECT_FALSE(c.Exists("k"));
    EXPECT_TRUE(c.Exists("kept"));
    // A commit that reached the previous master's log, sent again, is answered OK.
    KeyResults again =
        Send(c, c.agents[0],
             {.keys = {"committed"}, .sizes = {4096}, .ids = {committed_id}, .epoch = epoch});
    EXPECT_TRUE(again.results[0].ok()) << again.results[0].ToString();
    EXPECT_EQ(again.replicas[0], 1);
  }
  std::filesystem::remove_all(dir);
}

TEST(ReservedWrites, AReservationForTwoReplicasPlacesThemOnTwoAgents) {
  Cluster c(Options());
  Reserved r = Reserve(c, c.agents[0], 4096, 1, {}, 2);
  ASSERT_EQ(r.ids.size(), 1u);
  ASSERT_EQ(r.placements[0].size(), 2u);
  EXPECT_NE(r.placements[0][0].pool_id, r.placements[0][1].pool_id);
  WriteOptions two;
  two.replica_count = 2;
  KeyResults k =
      Send(c, c.agents[0], {.keys = {"k"}, .sizes = {4096}, .ids = r.ids, .options = two});
  ASSERT_TRUE(k.results[0].ok()) << k.results[0].ToString();
  EXPECT_EQ(k.replicas[0], 2);
}

TEST(ReservedWrites, ADroppedAgentsReservationsGoWithIt) {
  MasterOptions o = Options();
  o.agent_ttl_ms = 1000;
  o.agent_dead_ms = 2000;
  Cluster c(o);
  Reserved r = Reserve(c, c.agents[0], 4096, 4, {}, 2);
  ASSERT_EQ(r.ids.size(), 4u);
  for (int i = 0; i < 30; ++i) {
    c.clock.Advance(100);
    c.Beat(c.agents[1]);
    c.svc->Tick();
  }
  EXPECT_EQ(c.svc->Stats().agents, 1u);
  EXPECT_EQ(c.svc->Stats().reserved_writes, 0u);
  EXPECT_EQ(c.svc->Stats().writes_in_flight, 0u);
}

}  // namespace
}  // namespace kvagent::master

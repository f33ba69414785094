// `kvctl sessions` at the master: per-session blocks and bytes kept next to the session tags
// (MasterService::SessionStats) agree, at every quiet point of a randomized run, with what a
// consumer of the event stream knows (which key each session stored) and the keys' sizes;
// through puts, revoked puts, upserts that keep or move a session, removals, RemoveAll,
// eviction, and a restart from the operation log.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "master_test_util.h"

namespace kvagent::master {
namespace {

using testing::Cluster;
using testing::StreamIndex;

struct Usage {
  uint64_t blocks = 0;
  uint64_t bytes = 0;
  bool operator==(const Usage&) const = default;
};

// What the query says: every session, paged 3 at a time (the cursor contract).
std::map<std::string, Usage> Queried(const MasterService& svc) {
  std::map<std::string, Usage> out;
  uint64_t cursor = 0;
  int pages = 0;
  do {
    std::vector<MasterService::SessionUsage> page;
    svc.SessionStats("", cursor, 3, &page, &cursor);
    for (const auto& u : page) {
      EXPECT_FALSE(out.count(u.session_id)) << u.session_id << " listed twice";
      out[u.session_id] = Usage{u.blocks, u.bytes};
    }
    EXPECT_LT(++pages, 1000);
  } while (cursor != 0);
  return out;
}

// What an event consumer knows (key -> session from BlockStored/BlockRemoved/AllBlocksCleared),
// with each key's size from a listing.
std::map<std::string, Usage> FromEvents(const StreamIndex& index, const MasterService& svc) {
  std::map<std::string, uint64_t> sizes;
  uint64_t cursor = 0;
  do {
    ListPage page;
    EXPECT_TRUE(svc.ListKeys(cursor, 50, &page).ok());
    if (page.restarted) sizes.clear();
    for (const auto& k : page.keys) sizes[k.key] = k.size;
    cursor = page.next_cursor;
  } while (cursor != 0);
  std::map<std::string, Usage> out;
  for (const auto& [key, session] : index.keys()) {
    EXPECT_TRUE(sizes.count(key)) << key << " is in the event index but not stored";
    if (session.empty()) continue;
    ++out[session].blocks;
    out[session].bytes += sizes[key];
  }
  return out;
}

void ExpectAgree(Cluster& c, StreamIndex& index, const std::string& when) {
  index.Apply(c.Events());
  const auto expected = FromEvents(index, *c.svc);
  EXPECT_EQ(Queried(*c.svc), expected) << when;
  for (const auto& [session, usage] : expected) {
    std::vector<MasterService::SessionUsage> one;
    uint64_t cursor = 1;
    c.svc->SessionStats(session, 0, 0, &one, &cursor);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(cursor, 0u);
    EXPECT_EQ((Usage{one[0].blocks, one[0].bytes}), usage) << session << " " << when;
  }
}

TEST(SessionUsage, QueryAgreesWithAnEventConsumerThroughARandomizedRun) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("kvmaster-sessions-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  MasterOptions o;
  o.state_dir = dir;
  Cluster c(o, 2, 1 << 20);
  StreamIndex index;
  std::mt19937 rng(20261201);
  const std::vector<std::string> sessions = {"", "s-a", "s-b", "s-c", "会话-d", "s-e"};
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  for (int step = 0; step < 400; ++step) {
    const std::string key = "k" + std::to_string(pick(40));
    const std::string session = sessions[pick(sessions.size())];
    const uint64_t size = 64 + pick(16) * 4096;
    const AgentId agent = c.agents[pick(2)];
    switch (pick(7)) {
      case 0:
      case 1: {  // put, ended
        auto p = c.Start(agent, {key}, {size}, {session});
        if (p.results[0].ok() && p.results[0].code() != ErrorCode::kObjectAlreadyExists) {
          c.End(agent, {key});
        }
        break;
      }
      case 2: {  // put, revoked: leaves nothing
        auto p = c.Start(agent, {key}, {size}, {session});
        if (p.results[0].ok()) c.Revoke(agent, {key});
        break;
      }
      case 3: {  // upsert: a session moves the key to it, none keeps the old one
        auto p = c.Start(agent, {key}, {size}, {session}, {}, /*upsert=*/true);
        if (p.results[0].ok()) {
          const std::vector<std::string> one = {key};
          auto k = testing::Views(one);
          KeyResults out;
          EXPECT_TRUE(c.svc->BatchUpsertEnd(agent, k, &out).ok());
        }
        break;
      }
      case 4:
        c.Remove({key}, /*force=*/true);
        break;
      case 5:
        if (pick(10) == 0) {
          ASSERT_TRUE(c.svc->RemoveAll(true).ok());
        }
        break;
      case 6:
        c.Pass(200);  // ticks: eviction above the high watermark of the 2 MiB of pools
        break;
    }
    for (AgentId a : c.agents) c.Fence(a);  // live agents: heartbeats, fences acknowledged
    if (step % 20 == 0) ExpectAgree(c, index, "step " + std::to_string(step));
  }
  ExpectAgree(c, index, "end");
  // A restart replays the log: the counters come back with the objects.
  const auto before = Queried(*c.svc);
  ASSERT_GE(before.size(), 3u);  // the run ends with several sessions storing something
  c.Restart();
  index = StreamIndex();
  ExpectAgree(c, index, "after a restart");
  EXPECT_EQ(Queried(*c.svc), before);
  std::filesystem::remove_all(dir);
}

TEST(SessionUsage, AnUnknownSessionStoresNothingAndPagesSkipSessionsWithOnlyWritesInFlight) {
  Cluster c;
  c.Put(c.agents[0], {"a", "b"}, 100, {"done", "done"});
  auto p = c.Start(c.agents[0], {"c"}, {100}, {"in-flight"});
  ASSERT_TRUE(p.results[0].ok());
  std::vector<MasterService::SessionUsage> out;
  uint64_t cursor = 0;
  c.svc->SessionStats("nobody", 0, 10, &out, &cursor);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].blocks, 0u);
  EXPECT_EQ(out[0].bytes, 0u);
  const auto all = Queried(*c.svc);
  ASSERT_EQ(all.size(), 1u);  // "in-flight" stores nothing yet
  EXPECT_EQ(all.at("done"), (Usage{2, 200}));
  c.End(c.agents[0], {"c"});
  EXPECT_EQ(Queried(*c.svc).at("in-flight"), (Usage{1, 100}));
}

}  // namespace
}  // namespace kvagent::master

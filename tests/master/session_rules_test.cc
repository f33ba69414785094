// docs/semantics.md "Sessions", rules 1-11, one test each (rule 11, the allocation
// count, lives in alloc_count_test.cc: it replaces global operator new).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "kvagent/common/validate.h"
#include "kvagent/events/kv_event.h"
#include "kvagent/master/oplog.h"
#include "master_test_util.h"
#include "replication_log.h"

namespace kvagent::master {
namespace {

using testing::AsRemoved;
using testing::AsStored;
using testing::Cluster;
using testing::IsCleared;

using testing::TempDir;

TEST(SessionRules, Rule1_SessionIdsAreOptionalPerKeyAndParallelToKeys) {
  Cluster c;
  c.Events();
  c.Put(c.agents[0], {"k0", "k1", "k2"}, 100, {"sess-a", "", "sess-b"});
  c.Put(c.agents[0], {"k3"}, 100);  // no session IDs at all
  EXPECT_EQ(c.svc->SessionOf("k0"), "sess-a");
  EXPECT_EQ(c.svc->SessionOf("k1"), "");
  EXPECT_EQ(c.svc->SessionOf("k2"), "sess-b");
  EXPECT_EQ(c.svc->SessionOf("k3"), "");
  auto ev = c.Events();
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(AsStored(ev[0]).session_id, "sess-a");
  EXPECT_FALSE(AsStored(ev[1]).session_id.has_value());
  EXPECT_EQ(AsStored(ev[2]).session_id, "sess-b");
  EXPECT_FALSE(AsStored(ev[3]).session_id.has_value());
}

TEST(SessionRules, Rule2_InvalidSessionIdsRejectTheWholeBatchThroughTheSharedBoundary) {
  Cluster c;
  c.Events();
  const std::string too_long(kMaxSessionIdBytes + 1, 's');
  const std::string bad_utf8 = "sess-\xC3\x28";
  struct Case {
    std::vector<std::string> sessions;
    Status expected;
  };
  const Case cases[] = {
      {{"ok", too_long}, ValidateSessionId(too_long, "session_ids[1]")},
      {{bad_utf8, "ok"}, ValidateSessionId(bad_utf8, "session_ids[0]")},
      {{"only-one"}, validate_detail::CheckSessionCount(2, 1)},
  };
  for (const Case& tc : cases) {
    auto p = c.Start(c.agents[0], {"a", "b"}, {64, 64}, tc.sessions);
    ASSERT_FALSE(tc.expected.ok());
    EXPECT_EQ(c.last_status, tc.expected);  // the very status of the shared boundary
    ASSERT_EQ(p.results.size(), 2u);
    for (const Status& s : p.results) EXPECT_EQ(s.code(), ErrorCode::kInvalidParams);
    EXPECT_TRUE(p.placements.empty());
  }
  const MasterStats st = c.svc->Stats();
  EXPECT_EQ(st.bytes_used, 0u);  // nothing allocated
  EXPECT_EQ(st.writes_in_flight, 0u);
  EXPECT_EQ(st.session_tags, 0u);
  EXPECT_EQ(st.bad_requests, 3u);
  EXPECT_TRUE(c.Events().empty());
}

TEST(SessionRules, Rule3_TagIsCommittedAtPutEndAndARevokedPutLeavesNone) {
  Cluster c;
  c.Events();
  auto p = c.Start(c.agents[0], {"kept", "revoked"}, {64, 64}, {"s-kept", "s-revoked"});
  ASSERT_TRUE(p.results[0].ok() && p.results[1].ok());
  EXPECT_EQ(c.svc->SessionOf("kept"), "");  // not committed at PutStart
  EXPECT_TRUE(c.Events().empty());
  ASSERT_TRUE(c.Revoke(c.agents[0], {"revoked"}).results[0].ok());
  EXPECT_FALSE(c.svc->HasSessionTag("s-revoked"));
  EXPECT_EQ(c.svc->SessionOf("revoked"), std::nullopt);
  ASSERT_TRUE(c.End(c.agents[0], {"kept"}).results[0].ok());
  EXPECT_EQ(c.svc->SessionOf("kept"), "s-kept");
  auto ev = c.Events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(AsStored(ev[0]).object_key, "kept");
  EXPECT_EQ(AsStored(ev[0]).session_id, "s-kept");
  EXPECT_EQ(c.svc->Stats().session_tags, 1u);
}

TEST(SessionRules, Rule4_DuplicatePutKeepsExistingObjectAndTagAndEmitsNothing) {
  Cluster c;
  c.Put(c.agents[0], {"k"}, 128, {"first"});
  auto before = c.Get({"k"}).placements;
  c.Events();
  auto p = c.Start(c.agents[1], {"k"}, {4096}, {"second"});
  EXPECT_EQ(p.results[0].code(), ErrorCode::kObjectAlreadyExists);
  EXPECT_TRUE(p.placements.empty());
  EXPECT_EQ(c.svc->SessionOf("k"), "first");
  EXPECT_FALSE(c.svc->HasSessionTag("second"));
  EXPECT_TRUE(c.Events().empty());
  auto after = c.Get({"k"});
  EXPECT_EQ(after.sizes[0], 128u);
  ASSERT_EQ(after.placements.size(), before.size());
  EXPECT_EQ(after.placements[0].offset, before[0].offset);
}

TEST(SessionRules, Rule5_UpsertWithATagReplacesItAndWithoutOneKeepsIt) {
  Cluster c;
  c.Put(c.agents[0], {"k"}, 256, {"original"});
  c.Events();
  // Empty tag: preserved.
  ASSERT_TRUE(c.Start(c.agents[0], {"k"}, {256}, {""}, {}, /*upsert=*/true).results[0].ok());
  ASSERT_TRUE(c.End(c.agents[0], {"k"}).results[0].ok());
  EXPECT_EQ(c.svc->SessionOf("k"), "original");
  // Absent session IDs: preserved.
  ASSERT_TRUE(c.Start(c.agents[0], {"k"}, {512}, {}, {}, /*upsert=*/true).results[0].ok());
  ASSERT_TRUE(c.End(c.agents[0], {"k"}).results[0].ok());
  EXPECT_EQ(c.svc->SessionOf("k"), "original");
  // Non-empty: replaced, and the old tag is gone from the table.
  ASSERT_TRUE(c.Start(c.agents[0], {"k"}, {512}, {"replacement"}, {}, true).results[0].ok());
  ASSERT_TRUE(c.End(c.agents[0], {"k"}).results[0].ok());
  EXPECT_EQ(c.svc->SessionOf("k"), "replacement");
  EXPECT_FALSE(c.svc->HasSessionTag("original"));
  auto ev = c.Events();
  ASSERT_EQ(ev.size(), 6u);  // Removed + Stored per upsert
  EXPECT_EQ(AsStored(ev[1]).session_id, "original");
  EXPECT_EQ(AsStored(ev[3]).session_id, "original");
  EXPECT_EQ(AsStored(ev[5]).session_id, "replacement");
}

TEST(SessionRules, Rule6_ReadsNeverChangeATag) {
  Cluster c;
  c.Put(c.agents[0], {"k"}, 64, {"reader-proof"});
  c.Events();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(c.Get({"k"}).results[0].ok());
    EXPECT_TRUE(c.Exists("k"));
    EXPECT_EQ(testing::ListAll(*c.svc).at("k"), "reader-proof");
  }
  EXPECT_EQ(c.svc->SessionOf("k"), "reader-proof");
  EXPECT_TRUE(c.Events().empty());
}

TEST(SessionRules, Rule7_TagsSurviveTheOperationLogAndARestart) {
  TempDir dir;
  MasterOptions o;
  o.state_dir = dir.path();
  Cluster c(o);
  c.Put(c.agents[0], {"tagged", "plain"}, 64, {"durable-session", ""});
  ASSERT_TRUE(c.Start(c.agents[0], {"tagged"}, {64}, {"newer"}, {}, true).results[0].ok());
  ASSERT_TRUE(c.End(c.agents[0], {"tagged"}).results[0].ok());
  c.Restart();
  EXPECT_EQ(c.svc->SessionOf("tagged"), "newer");
  EXPECT_EQ(c.svc->SessionOf("plain"), "");
  EXPECT_FALSE(c.svc->HasSessionTag("durable-session"));
  auto ev = c.Events();
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_TRUE(IsCleared(ev[0]));  // a restarted master starts with a clear ...
  testing::StreamIndex index;     // ... and re-announces what it restored, tags included
  index.Apply(ev);
  EXPECT_EQ(index.keys(), (std::map<std::string, std::string>{{"plain", ""}, {"tagged", "newer"}}));
  // A second restart (the log was compacted at the first one) keeps them too.
  c.Restart();
  EXPECT_EQ(c.svc->SessionOf("tagged"), "newer");
}

// A standby's copy of the state (kvmaster --follow): what it writes from the pages it fetches.
void WriteAsStandby(const ReplicationPage& page, OpLog& log) {
  std::vector<std::string> records;
  ASSERT_TRUE(
      ForEachFramedRecord(page.records, [&](std::string_view r) { records.emplace_back(r); }));
  if (page.snapshot) {
    ASSERT_TRUE(log.Rewrite([&](const std::function<void(std::string_view)>& append) {
                     for (const auto& r : records) append(r);
                   })
                    .ok());
  } else {
    for (const auto& r : records) log.Append(r);
    ASSERT_TRUE(log.Flush().ok());
  }
}

TEST(SessionRules, Rule7_TagsSurviveStandbyReplicationAndPromotion) {
  MasterOptions o;
  o.replication_log_bytes = 1 << 20;
  Cluster primary(o);
  primary.Put(primary.agents[0], {"tagged", "plain", "gone"}, 64, {"first", "", "doomed"});
  TempDir dir;
  auto log = OpLog::Open(dir.path());
  ASSERT_TRUE(log.ok());
  ReplicationPage page;
  ASSERT_TRUE(primary.svc->ReadReplication(0, 0, 1 << 20, &page).ok());
  EXPECT_TRUE(page.snapshot);  // a new standby starts from the whole state
  WriteAsStandby(page, **log);
  // Later changes arrive as records: a re-tagging upsert, a new put, a remove.
  ASSERT_TRUE(
      primary.Start(primary.agents[0], {"tagged"}, {64}, {"newer"}, {}, true).results[0].ok());
  ASSERT_TRUE(primary.End(primary.agents[0], {"tagged"}).results[0].ok());
  primary.Put(primary.agents[1], {"late"}, 64, {"late-session"});
  KeyResults removed;
  ASSERT_TRUE(primary.svc->BatchRemove(testing::Views({"gone"}), false, &removed).ok());
  ASSERT_TRUE(
      primary.svc->ReadReplication(page.last_seq, primary.svc->epoch(), 1 << 20, &page).ok());
  EXPECT_FALSE(page.snapshot);
  EXPECT_EQ(page.last_seq, primary.svc->Stats().replication_last_seq);
  WriteAsStandby(page, **log);
  log->reset();

  // Promotion: a master opened on the standby's log.
  MasterOptions so;
  so.state_dir = dir.path();
  auto promoted = MasterService::Open(so, &primary.clock);
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
  EXPECT_EQ((*promoted)->SessionOf("tagged"), "newer");
  EXPECT_EQ((*promoted)->SessionOf("plain"), "");
  EXPECT_EQ((*promoted)->SessionOf("late"), "late-session");
  EXPECT_EQ((*promoted)->SessionOf("gone"), std::nullopt);
  EXPECT_FALSE((*promoted)->HasSessionTag("doomed"));
}

TEST(SessionRules, Rule8_OnlyBlockStoredCarriesTheSession) {
  Cluster c;
  c.Events();
  c.Put(c.agents[0], {"k"}, 64, {"s1"});
  ASSERT_TRUE(c.Remove({"k"}).results[0].ok());
  ASSERT_TRUE(c.svc->RemoveAll(false).ok());
  auto ev = c.Events();
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(AsStored(ev[0]).session_id, "s1");
  events::EventBatch removed{1.0, {ev[1]}, 0};
  events::EventBatch cleared{1.0, {ev[2]}, 0};
  EXPECT_EQ(events::EncodeEventBatch(removed).find("session_id"), std::string::npos);
  EXPECT_EQ(events::EncodeEventBatch(cleared).find("session_id"), std::string::npos);
  events::EventBatch stored{1.0, {ev[0]}, 0};
  EXPECT_NE(events::EncodeEventBatch(stored).find("session_id"), std::string::npos);
}

TEST(SessionRules, Rule9_FilteredKeysTakeSessionsByTheirOriginalPositions) {
  Cluster c({}, 2, 1 << 16);
  c.Put(c.agents[0], {"k1", "k4"}, 64, {"old-1", "old-4"});  // will fail as duplicates
  c.Events();
  const std::vector<std::string> keys = {"k0", "k1", "k2", "k3", "k4", "k5"};
  const std::vector<std::string> sessions = {"s0", "s1", "s2", "s3", "s4", "s5"};
  // k2 is larger than any pool: NO_SPACE at PutStart.
  auto p = c.Start(c.agents[0], keys, {64, 64, 1 << 20, 64, 64, 64}, sessions);
  EXPECT_TRUE(p.results[0].ok());
  EXPECT_EQ(p.results[1].code(), ErrorCode::kObjectAlreadyExists);
  EXPECT_EQ(p.results[2].code(), ErrorCode::kNoSpace);
  EXPECT_TRUE(p.results[3].ok());
  EXPECT_EQ(p.results[4].code(), ErrorCode::kObjectAlreadyExists);
  EXPECT_TRUE(p.results[5].ok());
  // k3's transfer fails: revoked. The survivors end in a different order.
  ASSERT_TRUE(c.Revoke(c.agents[0], {"k3"}).results[0].ok());
  auto e = c.End(c.agents[0], {"k5", "k0"});
  ASSERT_TRUE(e.results[0].ok() && e.results[1].ok());
  EXPECT_EQ(c.svc->SessionOf("k0"), "s0");
  EXPECT_EQ(c.svc->SessionOf("k1"), "old-1");
  EXPECT_EQ(c.svc->SessionOf("k2"), std::nullopt);
  EXPECT_EQ(c.svc->SessionOf("k3"), std::nullopt);
  EXPECT_EQ(c.svc->SessionOf("k4"), "old-4");
  EXPECT_EQ(c.svc->SessionOf("k5"), "s5");
  auto ev = c.Events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(AsStored(ev[0]).object_key, "k5");
  EXPECT_EQ(AsStored(ev[0]).session_id, "s5");
  EXPECT_EQ(AsStored(ev[1]).object_key, "k0");
  EXPECT_EQ(AsStored(ev[1]).session_id, "s0");
  EXPECT_FALSE(c.svc->HasSessionTag("s2"));
  EXPECT_FALSE(c.svc->HasSessionTag("s3"));
}

TEST(SessionRules, Rule10_MultiPartObjectsInheritTheSessionAndEveryWriteOption) {
  TempDir dir;
  MasterOptions o;
  o.max_part_bytes = 4096;
  o.state_dir = dir.path();
  Cluster c(o, 3, 1 << 16);
  c.Events();
  WriteOptions w;
  w.replica_count = 2;
  w.hard_pin = true;
  const uint64_t size = 3 * 4096 + 100;  // four parts
  auto p = c.Start(c.agents[0], {"big"}, {size}, {"multi-sess"}, w);
  ASSERT_TRUE(p.results[0].ok()) << p.results[0].ToString();
  ASSERT_EQ(p.placements.size(), 8u);  // every part has the object's replica count
  for (uint32_t part = 0; part < 4; ++part) {
    const Placement& a = p.placements[2 * part];
    const Placement& b = p.placements[2 * part + 1];
    EXPECT_EQ(a.part, part);
    EXPECT_EQ(b.part, part);
    EXPECT_EQ(a.length, part < 3 ? 4096u : 100u);
    EXPECT_NE(c.svc->FindPool(a.pool_id)->agent, c.svc->FindPool(b.pool_id)->agent);
  }
  EXPECT_EQ(c.svc->FindPool(p.placements[0].pool_id)->agent, c.agents[0]);  // own first
  ASSERT_TRUE(c.End(c.agents[0], {"big"}).results[0].ok());
  auto ev = c.Events();
  ASSERT_EQ(ev.size(), 1u);  // one logical object, one event
  EXPECT_EQ(AsStored(ev[0]).session_id, "multi-sess");
  // The hard pin covers every part: filling the pool evicts other objects, never a part.
  for (int i = 0; i < 200; ++i) {
    auto q = c.Start(c.agents[1], {"filler-" + std::to_string(i)}, {4096});
    if (q.results[0].ok()) (void)c.End(c.agents[1], {"filler-" + std::to_string(i)});
  }
  c.svc->Tick();
  EXPECT_GT(c.svc->Stats().evictions, 0u);
  auto g = c.Get({"big"});
  ASSERT_TRUE(g.results[0].ok());
  ASSERT_EQ(g.placements.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(g.placements[i].part, i / 2);  // parts in order
  c.Restart();  // and the log restores the parts with the object's tag
  EXPECT_EQ(c.svc->SessionOf("big"), "multi-sess");
  EXPECT_EQ(c.Get({"big"}).placements.size(), 8u);
}

}  // namespace
}  // namespace kvagent::master

// The request pipeline's one-call ops against a fake master port: Exist and Remove batched
// across requests with results by original position, RemoveAll, List paging, Stat.
#include <gtest/gtest.h>

#include "pipeline_fakes.h"

// Designated initializers name only the fields a test cares about; the others keep their
// defaults (GCC 12 warns about those it was not given).
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace kvagent::agent {
namespace {

using namespace testing;

uint64_t ListCursor(const MasterCall& call) { return call.request().body_as_ListKeys()->cursor(); }
uint32_t ListLimit(const MasterCall& call) { return call.request().body_as_ListKeys()->limit(); }
std::string ListPrefix(const MasterCall& call) {
  const auto* p = call.request().body_as_ListKeys()->prefix();
  return p == nullptr ? "" : p->str();
}

std::vector<std::string> Names(const CompletionData& d) {
  std::vector<std::string> out;
  for (const ListedKey& k : d.listed) out.push_back(k.key);
  return out;
}

// `n` listed keys named prefix + i, from `from`.
std::vector<ListedAt> Listed(const std::string& prefix, int from, int n) {
  std::vector<ListedAt> out;
  for (int i = from; i < from + n; ++i) out.push_back({prefix + std::to_string(i), 10, ""});
  return out;
}

TEST(PipelineKeys, ExistResultsFollowEachKeyAcrossRequestsSharingABatch) {
  PipelineRig rig;
  TestClient a(1), b(2);
  ClientRequest ra = a.Keys(proto::Op::Exist, {"a0", "a1"});
  ClientRequest rb = b.Keys(proto::Op::Exist, {"b0", "b1", "b2"});
  const uint64_t ida = ra.request_id, idb = rb.request_id;
  std::vector<ClientRequest> both;
  both.push_back(std::move(ra));
  both.push_back(std::move(rb));
  rig.SendTogether(std::move(both));
  MasterCall call = rig.master->Take(mfb::Body::BatchExist);
  EXPECT_EQ(call.keys(), (std::vector<std::string>{"a0", "a1", "b0", "b1", "b2"}));
  Answer(call, KeyCodesReply(call.id(), std::vector<ErrorCode>(5, ErrorCode::kOk), {},
                             {true, false, false, true, true}));
  EXPECT_EQ(rig.sink.Of(ida).exists, (std::vector<bool>{true, false}));
  EXPECT_EQ(rig.sink.Of(idb).exists, (std::vector<bool>{false, true, true}));
}

TEST(PipelineKeys, RemoveCodesFollowEachKeyAndForceSplitsTheBatch) {
  PipelineRig rig;
  TestClient a(1), b(2);
  ClientRequest ra = a.Keys(proto::Op::Remove, {"a0", "a1"});
  ClientRequest rb = b.Keys(proto::Op::Remove, {"b0"}, /*force=*/true);
  ClientRequest rc = b.Keys(proto::Op::Remove, {"c0"});
  const uint64_t ida = ra.request_id, idb = rb.request_id, idc = rc.request_id;
  std::vector<ClientRequest> all;
  all.push_back(std::move(ra));
  all.push_back(std::move(rb));
  all.push_back(std::move(rc));
  rig.SendTogether(std::move(all));
  MasterCall plain = rig.master->Take(mfb::Body::BatchRemove);
  EXPECT_EQ(plain.keys(), (std::vector<std::string>{"a0", "a1", "c0"}));
  EXPECT_FALSE(plain.request().body_as_BatchRemove()->force());
  MasterCall forced = rig.master->Take(mfb::Body::BatchRemove);
  EXPECT_EQ(forced.keys(), std::vector<std::string>{"b0"});
  EXPECT_TRUE(forced.request().body_as_BatchRemove()->force());
  Answer(forced, KeyCodesReply(forced.id(), {ErrorCode::kOk}));
  Answer(plain, KeyCodesReply(plain.id(), {ErrorCode::kObjectHasLease, ErrorCode::kOk,
                                           ErrorCode::kObjectNotFound}));
  EXPECT_EQ(rig.sink.Of(ida).codes,
            (std::vector<ErrorCode>{ErrorCode::kObjectHasLease, ErrorCode::kOk}));
  EXPECT_EQ(rig.sink.Of(idb).codes, std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(rig.sink.Of(idc).codes, std::vector<ErrorCode>{ErrorCode::kObjectNotFound});
}

TEST(PipelineKeys, AReplyWhoseCodesDoNotMatchTheKeysFailsTheBatchAsInternal) {
  PipelineRig rig;
  TestClient a(1);
  const uint64_t id = rig.Send(a.Keys(proto::Op::Exist, {"a", "b"}));
  MasterCall call = rig.master->Take(mfb::Body::BatchExist);
  Answer(call, KeyCodesReply(call.id(), {ErrorCode::kOk}, {}, {true}));
  EXPECT_EQ(rig.sink.Of(id).codes,
            (std::vector<ErrorCode>{ErrorCode::kInternal, ErrorCode::kInternal}));
}

TEST(PipelineKeys, RemoveAllAnswersHowManyWereRemoved) {
  PipelineRig rig;
  TestClient a(1);
  const uint64_t id = rig.Send(a.Single(proto::Op::RemoveAll, /*force=*/true));
  MasterCall call = rig.master->Take(mfb::Body::RemoveAll);
  EXPECT_TRUE(call.request().body_as_RemoveAll()->force());
  Answer(call, KeyCodesReply(call.id(), {}, {}, {}, /*removed_count=*/42));
  EXPECT_EQ(rig.sink.Of(id).removed_count, 42u);
}

// ---- List -----------------------------------------------------------------------------------

// The agent pages the master from the caller's cursor until the caller's limit is reached and
// returns the master's cursor to continue with.
TEST(PipelineList, PagesTheMasterUntilTheLimitAndReturnsTheCursorToContinueWith) {
  PipelineRig rig;
  TestClient a(1);
  const uint64_t id = rig.Send(a.List("", /*cursor=*/5, /*limit=*/600));
  MasterCall p1 = rig.master->Take(mfb::Body::ListKeys);
  EXPECT_EQ(ListCursor(p1), 5u);
  EXPECT_EQ(ListLimit(p1), 256u) << "master pages of at most 256";
  Answer(p1, ListKeysReply(p1.id(), Listed("k", 0, 256), 11));
  MasterCall p2 = rig.master->Take(mfb::Body::ListKeys);
  EXPECT_EQ(ListCursor(p2), 11u);
  EXPECT_EQ(ListLimit(p2), 256u);
  Answer(p2, ListKeysReply(p2.id(), Listed("k", 256, 256), 12));
  MasterCall p3 = rig.master->Take(mfb::Body::ListKeys);
  EXPECT_EQ(ListLimit(p3), 88u) << "only what the caller's limit still needs";
  Answer(p3, ListKeysReply(p3.id(), Listed("k", 512, 90), 13));
  EXPECT_EQ(rig.master->pending(), 0u);
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.listed.size(), 602u) << "a page may be somewhat longer than the limit";
  EXPECT_EQ(done.next_cursor, 13u);
  EXPECT_EQ(done.listed.front().key, "k0");
  EXPECT_EQ(done.listed.back().key, "k601");
}

TEST(PipelineList, TheEndOfTheScanIsCursorZeroAndEmptyPagesAreFollowed) {
  PipelineRig rig;
  TestClient a(1);
  const uint64_t id = rig.Send(a.List("", 0, 0));  // 0: the default, 1000
  MasterCall p1 = rig.master->Take(mfb::Body::ListKeys);
  Answer(p1, ListKeysReply(p1.id(), {}, 3));  // an empty stretch of hash slots
  MasterCall p2 = rig.master->Take(mfb::Body::ListKeys);
  EXPECT_EQ(ListCursor(p2), 3u);
  Answer(p2, ListKeysReply(p2.id(), {{"only", 4, "sess"}}, 0));
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(Names(done), std::vector<std::string>{"only"});
  EXPECT_EQ(done.listed[0].size, 4u);
  EXPECT_EQ(done.listed[0].session_id, "sess");
  EXPECT_EQ(done.next_cursor, 0u);
}

// The master filters by prefix; the agent checks again and never returns another key.
TEST(PipelineList, ThePrefixGoesToTheMasterAndOtherKeysAreDropped) {
  PipelineRig rig;
  TestClient a(1);
  const uint64_t id = rig.Send(a.List("user/", 0, 10));
  MasterCall p1 = rig.master->Take(mfb::Body::ListKeys);
  EXPECT_EQ(ListPrefix(p1), "user/");
  Answer(p1, ListKeysReply(p1.id(), {{"user/a", 1, ""}, {"other", 1, ""}, {"user/b", 1, ""}}, 0));
  EXPECT_EQ(Names(rig.sink.Of(id)), (std::vector<std::string>{"user/a", "user/b"}));
}

// A rare prefix must not make one request scan the whole store: after 64 master pages the
// agent returns what it has, with the cursor to continue.
TEST(PipelineList, OneRequestScansAtMost64MasterPages) {
  PipelineRig rig;
  TestClient a(1);
  const uint64_t id = rig.Send(a.List("rare", 0, 100));
  for (uint64_t page = 1; page <= 64; ++page) {
    MasterCall p = rig.master->Take(mfb::Body::ListKeys);
    Answer(p, ListKeysReply(p.id(), {{"common" + std::to_string(page), 1, ""}}, page));
  }
  EXPECT_EQ(rig.master->pending(), 0u);
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_TRUE(done.listed.empty());
  EXPECT_EQ(done.next_cursor, 64u);
}

// Key bytes are capped per reply too, so a page of long keys fits the completion ring.
TEST(PipelineList, APageStopsAt128KiBOfKeyAndSessionBytes) {
  PipelineRig rig;
  TestClient a(1);
  const uint64_t id = rig.Send(a.List("", 0, 10000));
  std::vector<ListedAt> big;
  for (int i = 0; i < 40; ++i)
    big.push_back({std::string(4000, 'a' + i % 26) + std::to_string(i), 1, ""});
  MasterCall p1 = rig.master->Take(mfb::Body::ListKeys);
  Answer(p1, ListKeysReply(p1.id(), big, 7));
  EXPECT_EQ(rig.master->pending(), 0u) << "160 KB of keys: no second page";
  EXPECT_EQ(rig.sink.Of(id).listed.size(), 40u);
  EXPECT_EQ(rig.sink.Of(id).next_cursor, 7u);
}

// A page from another master restarts the scan: what was collected is dropped.
TEST(PipelineList, ARestartedScanDropsWhatWasCollected) {
  PipelineRig rig;
  TestClient a(1);
  const uint64_t id = rig.Send(a.List("", 0, 2000));
  MasterCall p1 = rig.master->Take(mfb::Body::ListKeys);
  Answer(p1, ListKeysReply(p1.id(), Listed("old", 0, 3), 9));
  MasterCall p2 = rig.master->Take(mfb::Body::ListKeys);
  Answer(p2, ListKeysReply(p2.id(), Listed("new", 0, 2), 0, /*restarted=*/true));
  EXPECT_EQ(Names(rig.sink.Of(id)), (std::vector<std::string>{"new0", "new1"}));
}

TEST(PipelineList, AFailedPageFailsTheRequest) {
  PipelineRig rig;
  TestClient a(1);
  const uint64_t id = rig.Send(a.List("", 0, 600));
  MasterCall p1 = rig.master->Take(mfb::Body::ListKeys);
  Answer(p1, ListKeysReply(p1.id(), Listed("k", 0, 256), 4));
  MasterCall p2 = rig.master->Take(mfb::Body::ListKeys);
  Fail(p2, ErrorCode::kMasterUnavailable, "link down");
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.status.code(), ErrorCode::kMasterUnavailable);
}

// ---- Stat -----------------------------------------------------------------------------------

TEST(PipelineStat, CountersOfTheAgentThenTheMaster) {
  PipelineRig rig;
  TestClient a(1);
  const uint64_t id = rig.Send(a.Single(proto::Op::Stat));
  MasterCall call = rig.master->Take(mfb::Body::Stats);
  Answer(call, StatsReply(call.id(), {{"keys", 12}, {"bytes_used", 3000}}));
  const std::vector<Counter>& c = rig.sink.Of(id).counters;
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(c.front().name, "agent.clients");
  EXPECT_EQ(c[c.size() - 2].name, "master.keys");
  EXPECT_EQ(c[c.size() - 2].value, 12u);
  EXPECT_EQ(c.back().name, "master.bytes_used");
}

// The agent's counters are worth having while the master is away.
TEST(PipelineStat, WithoutAMasterTheAgentsCountersComeWithTheMastersError) {
  PipelineRig rig;
  TestClient a(1);
  const uint64_t id = rig.Send(a.Single(proto::Op::Stat));
  MasterCall call = rig.master->Take(mfb::Body::Stats);
  Fail(call, ErrorCode::kMasterUnavailable, "kvmaster is not reachable");
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_TRUE(done.status.ok());
  ASSERT_FALSE(done.counters.empty());
  EXPECT_EQ(done.counters.back().name, "master.error");
  EXPECT_NE(done.counters.back().text.find("not reachable"), std::string::npos);
}

}  // namespace
}  // namespace kvagent::agent

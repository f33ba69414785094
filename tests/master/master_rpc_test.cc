// MasterRpc: master.fbs in, replies out; bad input gets an error reply, is counted, and
// changes nothing.
#include "kvagent/master/master_rpc.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "master_test_util.h"
#include "rpc_test_util.h"

namespace kvagent::master {
namespace {

using namespace testing;  // NOLINT: the builders

class MasterRpcTest : public ::testing::Test {
 protected:
  MasterRpcTest() : c({}, 0), rpc(c.svc.get()) {
    agent = Call(RegisterAgentMsg("node-a", 7))->body_as_RegisterAgentReply()->agent_id();
    auto* m = Call(MountPoolMsg(agent, 1 << 20, "tcp://10.0.0.1:7000"));
    EXPECT_EQ(m->status(), 0);
    c.Events();
  }
  const fb::Reply* Call(const Bytes& request) {
    auto reply = rpc.Handle(request);
    last.assign(reply.begin(), reply.end());
    const fb::Reply* r = ParseReply(last.data(), last.size());
    EXPECT_NE(r, nullptr) << "the reply must always verify";
    return r;
  }
  // Nothing stored, nothing allocated, no event.
  void ExpectNothingChanged() {
    MasterStats st = c.svc->Stats();
    EXPECT_EQ(st.keys, 0u);
    EXPECT_EQ(st.writes_in_flight, 0u);
    EXPECT_EQ(st.bytes_used, 0u);
    EXPECT_EQ(st.session_tags, 0u);
    EXPECT_TRUE(c.Events().empty());
  }

  Cluster c;
  MasterRpc rpc;
  AgentId agent = 0;
  Bytes last;
};

TEST_F(MasterRpcTest, PutStartEndAndGetRoundTripWithPlacementsAndEndpoints) {
  auto* r = Call(WriteStartMsg(agent, {"a", "b"}, {100, 200}, {"s-a", ""}));
  ASSERT_EQ(r->status(), 0);
  const fb::PlacementReply* p = r->body_as_PlacementReply();
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->codes()->size(), 2u);
  EXPECT_EQ(p->messages(), nullptr);  // absent when every key is OK
  ASSERT_EQ(p->first()->size(), 3u);
  EXPECT_EQ(p->first()->Get(1), 1u);
  EXPECT_EQ(p->placements()->Get(1)->length(), 200u);
  ASSERT_EQ(p->pools()->size(), 1u);
  EXPECT_EQ(p->pools()->Get(0)->agent_id(), agent);
  EXPECT_EQ(p->pools()->Get(0)->endpoints()->Get(0)->str(), "tcp://10.0.0.1:7000");
  r = Call(WriteFinishMsg(fb::Body::BatchPutEnd, agent, {"a", "b"}));
  ASSERT_EQ(r->status(), 0);
  EXPECT_EQ(r->body_as_KeyCodesReply()->codes()->Get(1), 0);
  r = Call(KeysMsg(fb::Body::BatchGet, {"a", "missing"}));
  p = r->body_as_PlacementReply();
  EXPECT_EQ(p->codes()->Get(0), 0);
  EXPECT_EQ(p->codes()->Get(1), static_cast<uint16_t>(ErrorCode::kObjectNotFound));
  EXPECT_NE(p->messages()->Get(1)->str().find("missing"), std::string::npos);
  EXPECT_EQ(p->sizes()->Get(0), 100u);
  EXPECT_EQ(p->lease_ttl_ms(), c.svc->options().lease_ttl_ms);
  EXPECT_EQ(c.svc->SessionOf("a"), "s-a");
  r = Call(KeysMsg(fb::Body::BatchExist, {"a", "b", "c"}));
  EXPECT_EQ(r->body_as_KeyCodesReply()->exists()->Get(1), 1);
  EXPECT_EQ(r->body_as_KeyCodesReply()->exists()->Get(2), 0);
}

Bytes ReplicateMsg(uint64_t after_seq, uint64_t master_epoch) {
  flatbuffers::FlatBufferBuilder b;
  return Finish(b, fb::Body::Replicate, fb::CreateReplicate(b, after_seq, master_epoch).Union());
}

TEST_F(MasterRpcTest, ReplicateIsRefusedByAMasterThatKeepsNoRecordsForStandbys) {
  auto* r = Call(ReplicateMsg(0, 0));
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
  EXPECT_NE(r->message()->str().find("--replication-log-bytes"), std::string::npos);
}

TEST(MasterRpcReplicate, ANewStandbyGetsASnapshotThenOnlyTheRecordsAfterIt) {
  MasterOptions o;
  o.replication_log_bytes = 1 << 20;
  Cluster c(o, 1);
  MasterRpc rpc(c.svc.get());
  c.Put(c.agents[0], {"a"}, 64, {"s-a"});
  std::vector<uint8_t> last;
  auto call = [&](const Bytes& request) {
    auto reply = rpc.Handle(request);
    last.assign(reply.begin(), reply.end());
    return ParseReply(last.data(), last.size());
  };
  const fb::Reply* r = call(ReplicateMsg(0, 0));
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->status(), 0);
  const fb::ReplicateReply* page = r->body_as_ReplicateReply();
  ASSERT_NE(page, nullptr);
  EXPECT_TRUE(page->snapshot());
  EXPECT_EQ(page->master_epoch(), c.svc->epoch());
  const uint64_t seq = page->last_seq();
  EXPECT_EQ(seq, c.svc->Stats().replication_last_seq);
  EXPECT_GT(page->records()->size(), 0u);
  c.Put(c.agents[0], {"b"}, 64, {"s-b"});
  r = call(ReplicateMsg(seq, c.svc->epoch()));
  page = r->body_as_ReplicateReply();
  ASSERT_NE(page, nullptr);
  EXPECT_FALSE(page->snapshot());
  EXPECT_EQ(page->last_seq(), seq + 1);  // one record: object b
  const std::string records(reinterpret_cast<const char*>(page->records()->data()),
                            page->records()->size());
  EXPECT_NE(records.find("s-b"), std::string::npos);
  EXPECT_EQ(records.find("s-a"), std::string::npos);
  // A standby of another master epoch (the primary restarted) starts over from a snapshot.
  r = call(ReplicateMsg(seq + 1, c.svc->epoch() + 1));
  EXPECT_TRUE(r->body_as_ReplicateReply()->snapshot());
}

// The server parks a Replicate long poll by what last() says. A frame that fails verification
// right after one must not look like another Replicate (parked with its body, its follower
// counted as alive).
TEST(MasterRpcReplicate, AGarbageRequestAfterAReplicateIsNotTakenForOne) {
  MasterOptions o;
  o.replication_log_bytes = 1 << 20;
  Cluster c(o, 1);
  MasterRpc rpc(c.svc.get());
  rpc.Handle(ReplicateMsg(0, 0));
  ASSERT_TRUE(rpc.last().replicate);
  const Bytes garbage = {1, 2, 3, 4, 5, 6, 7, 8};
  rpc.Handle(garbage);
  EXPECT_FALSE(rpc.last().replicate);
  EXPECT_FALSE(rpc.last().replicate_empty);
  EXPECT_EQ(rpc.last().wait_ms, 0u);
  EXPECT_EQ(rpc.last().type, 0);
  EXPECT_EQ(c.svc->Stats().bad_requests, 1u);
}

TEST_F(MasterRpcTest, AMisalignedRequestIsReadCorrectly) {
  // ZMQ hands small frames over at any address; FlatBuffers needs aligned scalars.
  Bytes req = WriteStartMsg(agent, {"odd"}, {100}, {"s"});
  std::vector<uint8_t> storage(req.size() + 1);
  std::memcpy(storage.data() + 1, req.data(), req.size());
  auto reply = rpc.Handle(std::span(storage.data() + 1, req.size()));
  const fb::Reply* r = ParseReply(reply.data(), reply.size());
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), 0);
  EXPECT_EQ(r->body_as_PlacementReply()->codes()->Get(0), 0);
}

// HandleOwn (the embedded master: requests this process built) skips the checks for hostile
// bytes and answers as Handle does, also from a misaligned buffer.
TEST_F(MasterRpcTest, ItsOwnRequestsAreAnsweredAsCheckedOnesAre) {
  const auto own = [&](const Bytes& req) {
    std::vector<uint8_t> storage(req.size() + 1);
    std::memcpy(storage.data() + 1, req.data(), req.size());
    auto reply = rpc.HandleOwn(std::span(storage.data() + 1, req.size()));
    return std::vector<uint8_t>(reply.begin(), reply.end());
  };
  auto started = own(WriteStartMsg(agent, {"own"}, {100}, {"s-own"}));
  ASSERT_EQ(ParseReply(started.data(), started.size())->status(), 0);
  auto ended = own(WriteFinishMsg(fb::Body::BatchPutEnd, agent, {"own"}));
  ASSERT_EQ(ParseReply(ended.data(), ended.size())->status(), 0);
  EXPECT_EQ(c.svc->SessionOf("own"), "s-own");
  for (const Bytes& req : {KeysMsg(fb::Body::BatchGet, {"own", "missing"}),
                           KeysMsg(fb::Body::BatchExist, {"own", "missing"})}) {
    auto checked = rpc.Handle(req);
    const std::vector<uint8_t> expected(checked.begin(), checked.end());
    EXPECT_EQ(own(req), expected);
  }
  const fb::Reply* r = Call(KeysMsg(fb::Body::BatchGet, {"own"}));
  EXPECT_EQ(r->body_as_PlacementReply()->sizes()->Get(0), 100u);
}

TEST_F(MasterRpcTest, GarbageAndTruncatedBuffersGetAnErrorReplyAndAreCounted) {
  std::mt19937 rng(1);
  Bytes good = WriteStartMsg(agent, {"a"}, {100}, {"s"});
  std::vector<Bytes> bad = {{}, {1, 2, 3}, Bytes(good.begin(), good.begin() + good.size() / 2)};
  for (int i = 0; i < 50; ++i) {
    Bytes g(1 + rng() % 300);
    for (auto& x : g) x = static_cast<uint8_t>(rng());
    bad.push_back(g);
  }
  uint64_t rejected = 0;
  for (const Bytes& b : bad) {
    auto* r = Call(b);
    ASSERT_NE(r, nullptr);
    if (r->status() != 0) ++rejected;
  }
  EXPECT_EQ(rejected, bad.size());
  EXPECT_EQ(c.svc->Stats().bad_requests, bad.size());
  ExpectNothingChanged();
}

TEST_F(MasterRpcTest, AnUnknownMessageTypeGetsAnErrorReply) {
  flatbuffers::FlatBufferBuilder b;
  auto body = fb::CreateStats(b);
  fb::RequestBuilder rb(b);
  rb.add_request_id(42);
  rb.add_body_type(static_cast<fb::Body>(200));  // from a newer peer
  rb.add_body(body.Union());
  b.Finish(rb.Finish());
  auto* r = Call(Bytes(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()));
  EXPECT_EQ(r->request_id(), 42u);
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
  EXPECT_NE(r->message()->str().find("unknown request type 200"), std::string::npos);
  EXPECT_EQ(c.svc->Stats().bad_requests, 1u);
}

TEST_F(MasterRpcTest, ABatchWhoseArraysDisagreeIsRejectedWhole) {
  auto* r = Call(WriteStartMsg(agent, {"a", "b", "c"}, {100, 100}));
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
  const fb::PlacementReply* p = r->body_as_PlacementReply();
  ASSERT_EQ(p->codes()->size(), 3u);
  for (uint16_t code : *p->codes())
    EXPECT_EQ(code, static_cast<uint16_t>(ErrorCode::kInvalidParams));
  r = Call(WriteStartMsg(agent, {"a", "b"}, {100, 100}, {"only-one"}));
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
  r = Call(WriteStartMsg(agent, {"a", "b"}, {100, ~uint64_t{0}}));  // absurd size
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
  EXPECT_EQ(c.svc->Stats().bad_requests, 3u);
  ExpectNothingChanged();
}

// A WriteStart whose keys carry block metadata: `tokens_per_block` token IDs per hash.
Bytes WriteStartWithBlocks(uint32_t agent, const std::vector<std::string>& keys,
                           size_t block_entries, uint32_t block_size, size_t tokens) {
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<fb::BlockMeta>> blocks;
  for (size_t i = 0; i < block_entries; ++i) {
    std::vector<block_proto::BlockHash> hashes = {block_proto::BlockHash(1000 + i, false),
                                                  block_proto::BlockHash(2000 + i, true)};
    std::vector<block_proto::BlockHash> parent = {block_proto::BlockHash(7, false)};
    std::vector<uint32_t> token_ids(tokens);
    for (size_t t = 0; t < tokens; ++t) token_ids[t] = static_cast<uint32_t>(t);
    blocks.push_back(fb::CreateBlockMeta(b, b.CreateVectorOfStructs(hashes),
                                         b.CreateVectorOfStructs(parent), b.CreateVector(token_ids),
                                         block_size, b.CreateString("lora-a")));
  }
  std::vector<uint64_t> sizes(keys.size(), 64);
  auto m = fb::CreateWriteStart(b, agent, b.CreateVectorOfStrings(keys), b.CreateVector(sizes), 0,
                                b.CreateVector(blocks), fb::CreateWriteOptions(b, 1));
  return Finish(b, fb::Body::BatchPutStart, m.Union());
}

TEST_F(MasterRpcTest, BlockMetadataTravelsFromTheRequestToTheStoredEvent) {
  auto* r = Call(WriteStartWithBlocks(agent, {"a"}, 1, 2, 4));
  ASSERT_EQ(r->status(), 0);
  r = Call(WriteFinishMsg(fb::Body::BatchPutEnd, agent, {"a"}));
  ASSERT_EQ(r->status(), 0);
  auto ev = c.Events();
  ASSERT_EQ(ev.size(), 1u);
  const auto& s = AsStored(ev[0]);
  EXPECT_EQ(s.block_hashes, (std::vector<events::BlockHash>{events::BlockHash::Unsigned(1000),
                                                            events::BlockHash::Signed(2000)}));
  EXPECT_EQ(s.parent_block_hash, events::BlockHash::Unsigned(7));
  EXPECT_EQ(s.token_ids, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.block_size, 2u);
  EXPECT_EQ(s.lora_name, "lora-a");
}

TEST_F(MasterRpcTest, BlockMetadataThatDisagreesIsRejectedWhole) {
  auto* r = Call(WriteStartWithBlocks(agent, {"a", "b"}, 1, 2, 4));  // one entry, two keys
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
  r = Call(WriteStartWithBlocks(agent, {"a"}, 1, 2, 3));  // 3 tokens for 2 blocks of 2
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
  EXPECT_NE(r->message()->str().find("blocks[0]"), std::string::npos);
  ExpectNothingChanged();
}

TEST_F(MasterRpcTest, InvalidUtf8AndOverlongSessionIdsAreRejectedWhole) {
  auto* r = Call(WriteStartMsg(agent, {"ok", "bad-\xff-key"}, {100, 100}));
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
  EXPECT_NE(r->message()->str().find("keys[1]"), std::string::npos);
  r = Call(WriteStartMsg(agent, {"a", "b"}, {100, 100}, {"fine", std::string(257, 'x')}));
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
  EXPECT_NE(r->message()->str().find("session_ids[1]"), std::string::npos);
  r = Call(WriteStartMsg(agent, {"a"}, {100}, {"\xed\xa0\x80"}));  // a surrogate
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
  EXPECT_EQ(c.svc->Stats().bad_requests, 3u);
  ExpectNothingChanged();
}

TEST_F(MasterRpcTest, AnUnregisteredAgentCannotWrite) {
  auto* r = Call(WriteStartMsg(agent + 100, {"a"}, {100}));
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kAgentUnavailable));
  ExpectNothingChanged();
}

TEST_F(MasterRpcTest, StatsNameTheCounters) {
  Call(Bytes{9, 9, 9});
  auto* r = Call(StatsMsg());
  EXPECT_EQ(StatValue(r, "agents"), 1u);
  EXPECT_EQ(StatValue(r, "pools"), 1u);
  EXPECT_EQ(StatValue(r, "bytes_capacity"), 1u << 20);
  EXPECT_EQ(StatValue(r, "bad_requests"), 1u);
}

}  // namespace
}  // namespace kvagent::master

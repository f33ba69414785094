// The request pipeline's Put/Upsert path against a fake master port and a fake data plane:
// per-key results by original position, checksums in the End, revoke on failure, partial
// replication, deadlines, the End's retry and its TIMEOUT "may be stored".
#include <gtest/gtest.h>

#include <thread>

#include "pipeline_fakes.h"

// Designated initializers name only the fields a test cares about; the others keep their
// defaults (GCC 12 warns about those it was not given).
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace kvagent::agent {
namespace {

using namespace testing;
using namespace std::chrono_literals;

const std::string kPeer = "tcp://10.0.0.2:7000";
constexpr uint32_t kPeerPool = 2;
constexpr uint64_t kPeerIncarnation = 0x2002;

PoolAt Own() { return PoolAt{}; }
PoolAt Peer() { return PoolAt{kPeerPool, kPeer, kPeerIncarnation}; }

// One part of `length` bytes, one replica per pool in `pools`, at `offset` in each.
std::vector<ReplicaAt> OnePart(uint64_t length, std::vector<uint32_t> pools, uint64_t offset = 0,
                               uint32_t part = 0) {
  std::vector<ReplicaAt> out;
  for (uint32_t s : pools) out.push_back(ReplicaAt{part, s, offset, length});
  return out;
}

std::string PoolBytes(PipelineRig& rig, uint64_t offset, uint64_t length) {
  return std::string(reinterpret_cast<const char*>(rig.pool().base() + offset), length);
}

std::string PeerBytes(PipelineRig& rig, uint64_t offset, uint64_t length) {
  const std::vector<uint8_t>& p = rig.data->peer(kPeer);
  return std::string(reinterpret_cast<const char*>(p.data() + offset), length);
}

std::vector<uint32_t> Vec(const flatbuffers::Vector<uint32_t>* v) {
  return v == nullptr ? std::vector<uint32_t>() : std::vector<uint32_t>(v->begin(), v->end());
}
std::vector<uint64_t> Vec(const flatbuffers::Vector<uint64_t>* v) {
  return v == nullptr ? std::vector<uint64_t>() : std::vector<uint64_t>(v->begin(), v->end());
}

// A put sent and its WriteStart taken from the master, to be answered by the test.
struct SentPut {
  uint64_t id = 0;
  MasterCall start;
};
SentPut SendPut(PipelineRig& rig, TestClient& client, const std::vector<std::string>& keys,
                const std::vector<std::string>& values, const WriteArgs& args = {}) {
  SentPut out;
  out.id = rig.Send(client.Put(keys, values, args));
  out.start = rig.master->Take(mfb::Body::BatchPutStart);
  return out;
}

// Waits (bounded) until the steady clock is past `t`: the tests set deadlines, they never
// measure time.
void WaitPast(Clock::time_point t) {
  while (Clock::now() <= t) std::this_thread::sleep_for(1ms);
}

TEST(PipelineWrite, EveryPartGoesToEveryReplicaAndTheEndCarriesEachPartsChecksum) {
  PipelineRig rig;
  rig.data->AddPeer(kPeer, 1 << 20);
  TestClient client(1);
  const std::string value = Pattern("v", 10000);
  const uint64_t id = rig.Send(client.Put({"k"}, {value}, {.replicas = 2}));

  MasterCall start = rig.master->Take(mfb::Body::BatchPutStart);
  EXPECT_EQ(start.keys(), std::vector<std::string>{"k"});
  PlacedKey k{.write_id = 41};
  for (ReplicaAt r : OnePart(6000, {kOwnPool, kPeerPool}, 4096, 0)) k.replicas.push_back(r);
  for (ReplicaAt r : OnePart(4000, {kOwnPool, kPeerPool}, 65536, 1)) k.replicas.push_back(r);
  Answer(start, PlacementReply(start.id(), {k}, {Own(), Peer()}, false));
  // The local replica is copied at once; the peer's go to the data plane in one batch.
  EXPECT_EQ(PoolBytes(rig, 4096, 6000), value.substr(0, 6000));
  EXPECT_EQ(PoolBytes(rig, 65536, 4000), value.substr(6000));
  ASSERT_EQ(rig.data->waiting(), 1u);
  rig.Settle();
  EXPECT_EQ(PeerBytes(rig, 4096, 6000), value.substr(0, 6000));
  EXPECT_EQ(PeerBytes(rig, 65536, 4000), value.substr(6000));
  // Every data-plane write names the peer pool's incarnation, the master's epoch and the write.
  ASSERT_EQ(rig.data->ops_run().size(), 2u);
  for (const transfer::TransferOp& op : rig.data->ops_run()) {
    EXPECT_EQ(op.kind, transfer::TransferKind::kWrite);
    EXPECT_EQ(op.pool_incarnation, kPeerIncarnation);
    EXPECT_EQ(op.master_epoch, kMasterEpoch);
    EXPECT_EQ(op.write_id, 41u);
  }

  MasterCall end = rig.master->Take(mfb::Body::BatchPutEnd);
  EXPECT_TRUE(end.until_answered) << "an End is sent with CallUntilAnswered";
  EXPECT_EQ(Vec(end.finish()->write_ids()), std::vector<uint64_t>{41});
  EXPECT_EQ(Vec(end.finish()->part_counts()), std::vector<uint32_t>{2});
  EXPECT_EQ(Vec(end.finish()->checksums()),
            (std::vector<uint32_t>{Crc(value.substr(0, 6000)), Crc(value.substr(6000))}));
  EXPECT_TRUE(end.finish()->failed() == nullptr || end.finish()->failed()->size() == 0);
  EXPECT_FALSE(rig.sink.Has(id)) << "no answer before the master confirmed the commit";
  Answer(end, KeyCodesReply(end.id(), {ErrorCode::kOk}, {2}));
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_TRUE(done.status.ok());
  EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(done.replicas, std::vector<uint8_t>{2});
  EXPECT_EQ(rig.Counter("agent.bytes_to_pool"), 10000u);
  EXPECT_EQ(rig.Counter("agent.bytes_to_peers"), 10000u);
}

// SEMANTICS rule 9: two clients' requests share one master batch; the master fails some keys
// at the start and some at the end; every result, message and session ID follows its key's
// position in its own request.
TEST(PipelineWrite, ResultsAndSessionsFollowEachKeyAcrossRequestsSharingABatch) {
  PipelineRig rig;
  TestClient a(1), b(2);
  ClientRequest ra = a.Put({"a0", "a1", "a2"}, {"x0", "x1", "x2"}, {.sessions = {"s0", "", "s2"}});
  ClientRequest rb = b.Put({"b0", "b1"}, {"y0", "y1"}, {.sessions = {"t0", "t1"}});
  const uint64_t ida = ra.request_id, idb = rb.request_id;
  std::vector<ClientRequest> both;
  both.push_back(std::move(ra));
  both.push_back(std::move(rb));
  rig.SendTogether(std::move(both));
  ASSERT_EQ(rig.master->pending(), 1u) << "compatible puts of one pass share one master batch";

  MasterCall start = rig.master->Take(mfb::Body::BatchPutStart);
  EXPECT_EQ(start.keys(), (std::vector<std::string>{"a0", "a1", "a2", "b0", "b1"}));
  const auto* ws = static_cast<const mfb::WriteStart*>(start.request().body());
  ASSERT_NE(ws->session_ids(), nullptr);
  std::vector<std::string> sessions;
  for (const flatbuffers::String* s : *ws->session_ids()) sessions.push_back(s->str());
  EXPECT_EQ(sessions, (std::vector<std::string>{"s0", "", "s2", "t0", "t1"}));
  EXPECT_EQ(Vec(ws->sizes()), (std::vector<uint64_t>{2, 2, 2, 2, 2}));

  // a1 exists already, b0 finds no space; the others are placed in this node's pool.
  std::vector<PlacedKey> keys(5);
  for (uint32_t i = 0; i < 5; ++i) {
    keys[i].write_id = 100 + i;
    keys[i].replicas = OnePart(2, {kOwnPool}, 64 * i);
  }
  keys[1] = PlacedKey{.code = ErrorCode::kObjectAlreadyExists, .message = "a1 is stored"};
  keys[3] = PlacedKey{.code = ErrorCode::kNoSpace, .message = "no room for b0"};
  Answer(start, PlacementReply(start.id(), keys, {Own()}, false));
  rig.Settle();

  MasterCall end = rig.master->Take(mfb::Body::BatchPutEnd);
  EXPECT_EQ(end.keys(), (std::vector<std::string>{"a0", "a2", "b1"}));
  EXPECT_EQ(Vec(end.finish()->write_ids()), (std::vector<uint64_t>{100, 102, 104}));
  EXPECT_EQ(Vec(end.finish()->checksums()),
            (std::vector<uint32_t>{Crc("x0"), Crc("x2"), Crc("y1")}));
  // The master loses a2's write at the end (e.g. it was taken over).
  Answer(end, KeyCodesReply(end.id(), {ErrorCode::kOk, ErrorCode::kObjectNotFound, ErrorCode::kOk},
                            {1, 0, 1}));
  const CompletionData& da = rig.sink.Of(ida);
  EXPECT_EQ(da.codes, (std::vector<ErrorCode>{ErrorCode::kOk, ErrorCode::kObjectAlreadyExists,
                                              ErrorCode::kObjectNotFound}));
  ASSERT_EQ(da.messages.size(), 3u);
  EXPECT_EQ(da.messages[1], "a1 is stored");
  EXPECT_NE(da.messages[2].find("OBJECT_NOT_FOUND"), std::string::npos) << da.messages[2];
  EXPECT_EQ(da.replicas, (std::vector<uint8_t>{1, 0, 0}));
  const CompletionData& db = rig.sink.Of(idb);
  EXPECT_EQ(db.codes, (std::vector<ErrorCode>{ErrorCode::kNoSpace, ErrorCode::kOk}));
  EXPECT_EQ(db.messages.at(0), "no room for b0");
  EXPECT_EQ(db.replicas, (std::vector<uint8_t>{0, 1}));
}

TEST(PipelineWrite, PutsWithDifferentWriteOptionsGoInSeparateBatches) {
  PipelineRig rig;
  TestClient a(1), b(2);
  std::vector<ClientRequest> reqs;
  reqs.push_back(a.Put({"one"}, {"1"}, {.replicas = 1}));
  reqs.push_back(b.Put({"two"}, {"2"}, {.replicas = 2}));
  reqs.push_back(b.Put({"three"}, {"3"}, {.replicas = 1}));
  reqs.push_back(a.Put({"up"}, {"u"}, {.upsert = true}));
  rig.SendTogether(std::move(reqs));
  EXPECT_EQ(rig.master->Take(mfb::Body::BatchPutStart).keys(),
            (std::vector<std::string>{"one", "three"}));
  EXPECT_EQ(rig.master->Take(mfb::Body::BatchPutStart).keys(), std::vector<std::string>{"two"});
  EXPECT_EQ(rig.master->Take(mfb::Body::BatchUpsertStart).keys(), std::vector<std::string>{"up"});
}

// A key whose only replica could not be written is revoked (never ended) and fails with
// TRANSFER_FAILED; the other key of the same batch is stored.
TEST(PipelineWrite, AKeyWhoseOnlyReplicaFailedIsRevokedAndTheRestOfTheBatchIsStored) {
  PipelineRig rig;
  rig.data->Refuse(kPeer, Status(ErrorCode::kTransferFailed, "peer " + kPeer + " is unreachable"));
  TestClient client(1);
  auto [id, start] = SendPut(rig, client, {"remote", "local"}, {"rr", "ll"});
  Answer(start, PlacementReply(start.id(),
                               {PlacedKey{.write_id = 7, .replicas = OnePart(2, {kPeerPool})},
                                PlacedKey{.write_id = 8, .replicas = OnePart(2, {kOwnPool}, 128)}},
                               {Own(), Peer()}, false));
  rig.Settle();
  // Both finishing calls go out together.
  MasterCall revoke = rig.master->Take(mfb::Body::BatchPutRevoke);
  EXPECT_EQ(revoke.keys(), std::vector<std::string>{"remote"});
  EXPECT_EQ(Vec(revoke.finish()->write_ids()), std::vector<uint64_t>{7});
  EXPECT_FALSE(revoke.until_answered);
  MasterCall end = rig.master->Take(mfb::Body::BatchPutEnd);
  EXPECT_EQ(end.keys(), std::vector<std::string>{"local"});
  Answer(revoke, KeyCodesReply(revoke.id(), {ErrorCode::kOk}));
  EXPECT_FALSE(rig.sink.Has(id)) << "answered only when both the End and the Revoke are back";
  Answer(end, KeyCodesReply(end.id(), {ErrorCode::kOk}, {1}));
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, (std::vector<ErrorCode>{ErrorCode::kTransferFailed, ErrorCode::kOk}));
  EXPECT_NE(done.messages.at(0).find("unreachable"), std::string::npos) << done.messages[0];
  EXPECT_EQ(done.replicas, (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(rig.Counter("agent.revoked_keys"), 1u);
  EXPECT_EQ(rig.Counter("agent.transfer_failures"), 1u);
}

// A placement that names this node's pool as another incarnation of it (a dead agent that had
// this endpoint, still listed) is not written: its offsets are that pool's, and here they may
// hold live values. The replica fails like an unreachable one.
TEST(PipelineWrite, AStalePlacementInThisPoolIsNotWrittenAndTheReplicaFails) {
  PipelineRig rig;
  TestClient client(1);
  std::memcpy(rig.pool().base() + 256, "live!", 5);
  auto [id, start] = SendPut(rig, client, {"k"}, {"value"}, {.replicas = 2});
  const PoolAt dead{kPeerPool, kOwnEndpoint, kPeerIncarnation};
  Answer(start, PlacementReply(start.id(),
                               {PlacedKey{.write_id = 9,
                                          .replicas = {ReplicaAt{0, kOwnPool, 128, 5},
                                                       ReplicaAt{0, kPeerPool, 256, 5}}}},
                               {Own(), dead}, false));
  rig.Settle();
  EXPECT_EQ(PoolBytes(rig, 256, 5), "live!");
  EXPECT_EQ(PoolBytes(rig, 128, 5), "value");
  EXPECT_EQ(rig.data->ops_run().size(), 0u);
  MasterCall end = rig.master->Take(mfb::Body::BatchPutEnd);
  ASSERT_NE(end.finish()->failed(), nullptr);
  ASSERT_EQ(end.finish()->failed()->size(), 1u);
  EXPECT_EQ(end.finish()->failed()->Get(0)->pool_id(), kPeerPool);
  Answer(end, KeyCodesReply(end.id(), {ErrorCode::kOk}, {1}));
  EXPECT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kOk});
}

// Two replicas asked, one written: the put is stored, the End names the replica that was not
// written (the master drops and fences it) and the caller learns how many were.
TEST(PipelineWrite, APutWithOneOfTwoReplicasWrittenIsStoredAndTheEndNamesTheFailedOne) {
  PipelineRig rig;
  rig.data->Refuse(kPeer, Status(ErrorCode::kTimeout, "peer timed out"));
  TestClient client(1);
  auto [id, start] = SendPut(rig, client, {"k"}, {"value"}, {.replicas = 2});
  Answer(start,
         PlacementReply(start.id(),
                        {PlacedKey{.write_id = 9, .replicas = OnePart(5, {kOwnPool, kPeerPool})}},
                        {Own(), Peer()}, false));
  rig.Settle();
  MasterCall end = rig.master->Take(mfb::Body::BatchPutEnd);
  ASSERT_NE(end.finish()->failed(), nullptr);
  ASSERT_EQ(end.finish()->failed()->size(), 1u);
  const mfb::FailedReplica* f = end.finish()->failed()->Get(0);
  EXPECT_EQ(f->key(), 0u);
  EXPECT_EQ(f->part(), 0u);
  EXPECT_EQ(f->pool_id(), kPeerPool);
  EXPECT_EQ(Vec(end.finish()->checksums()), std::vector<uint32_t>{Crc("value")});
  Answer(end, KeyCodesReply(end.id(), {ErrorCode::kOk}, {1}));
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(done.replicas, std::vector<uint8_t>{1});
  EXPECT_EQ(rig.Counter("agent.degraded_puts"), 1u);
  EXPECT_EQ(rig.Counter("agent.revoked_keys"), 0u);
}

// A batch's containers are kept for the next batch (scratch_pool.h): one that follows a batch
// with a failed replica and a revoke starts with none of its keys, ids, checksums or failures.
TEST(PipelineWrite, ABatchAfterOneWithAFailedReplicaAndARevokeCarriesOnlyItsOwnKeys) {
  PipelineRig rig;
  rig.data->Refuse(kPeer, Status(ErrorCode::kTimeout, "peer timed out"));
  TestClient client(1);
  auto first = SendPut(rig, client, {"a", "b"}, {"aaaa", "bb"}, {.replicas = 2});
  Answer(first.start,
         PlacementReply(first.start.id(),
                        {PlacedKey{.write_id = 9, .replicas = OnePart(4, {kOwnPool, kPeerPool})},
                         PlacedKey{.write_id = 10, .replicas = OnePart(2, {kPeerPool}, 64)}},
                        {Own(), Peer()}, false));
  rig.Settle();
  MasterCall revoke = rig.master->Take(mfb::Body::BatchPutRevoke);
  MasterCall end = rig.master->Take(mfb::Body::BatchPutEnd);
  ASSERT_NE(end.finish()->failed(), nullptr);
  EXPECT_EQ(end.finish()->failed()->size(), 1u);
  Answer(revoke, KeyCodesReply(revoke.id(), {ErrorCode::kOk}));
  Answer(end, KeyCodesReply(end.id(), {ErrorCode::kOk}, {1}));
  EXPECT_EQ(rig.sink.Of(first.id).codes,
            (std::vector<ErrorCode>{ErrorCode::kOk, ErrorCode::kTransferFailed}));

  auto second = SendPut(rig, client, {"c"}, {"ccc"});
  Answer(second.start,
         PlacementReply(second.start.id(),
                        {PlacedKey{.write_id = 11, .replicas = OnePart(3, {kOwnPool}, 256)}},
                        {Own()}, false));
  rig.Settle();
  MasterCall end2 = rig.master->Take(mfb::Body::BatchPutEnd);
  EXPECT_EQ(rig.master->pending(), 0u) << "no revoke: nothing of the first batch is left";
  EXPECT_EQ(end2.keys(), std::vector<std::string>{"c"});
  EXPECT_EQ(Vec(end2.finish()->write_ids()), std::vector<uint64_t>{11});
  EXPECT_EQ(Vec(end2.finish()->part_counts()), std::vector<uint32_t>{1});
  EXPECT_EQ(Vec(end2.finish()->checksums()), std::vector<uint32_t>{Crc("ccc")});
  EXPECT_TRUE(end2.finish()->failed() == nullptr || end2.finish()->failed()->size() == 0);
  Answer(end2, KeyCodesReply(end2.id(), {ErrorCode::kOk}, {1}));
  const CompletionData& done = rig.sink.Of(second.id);
  EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(done.replicas, std::vector<uint8_t>{1});
  EXPECT_EQ(PoolBytes(rig, 256, 3), "ccc");
}

// A value of two parts whose second part has no replica written cannot be read: revoked, even
// though the first part was stored.
TEST(PipelineWrite, AValueWithOnePartWithoutAnyReplicaWrittenIsRevoked) {
  PipelineRig rig;
  rig.data->Refuse(kPeer, Status(ErrorCode::kTransferFailed, "connection refused"));
  TestClient client(1);
  auto [id, start] = SendPut(rig, client, {"k"}, {Pattern("p", 300)});
  PlacedKey k{.write_id = 5};
  k.replicas = OnePart(200, {kOwnPool}, 0, 0);
  k.replicas.push_back(ReplicaAt{1, kPeerPool, 0, 100});
  Answer(start, PlacementReply(start.id(), {k}, {Own(), Peer()}, false));
  rig.Settle();
  MasterCall revoke = rig.master->Take(mfb::Body::BatchPutRevoke);
  EXPECT_EQ(Vec(revoke.finish()->write_ids()), std::vector<uint64_t>{5});
  EXPECT_EQ(rig.master->pending(), 0u) << "nothing to end";
  Answer(revoke, KeyCodesReply(revoke.id(), {ErrorCode::kOk}));
  EXPECT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kTransferFailed});
}

// Placements that do not add up to the value (a master of another version) fail the key with
// INTERNAL and revoke it; nothing is copied past the value.
TEST(PipelineWrite, PlacementsThatDoNotCoverTheValueFailTheKeyAndRevokeIt) {
  PipelineRig rig;
  TestClient client(1);
  auto [id, start] = SendPut(rig, client, {"short", "long"}, {"12345", "12345"});
  Answer(start, PlacementReply(start.id(),
                               {PlacedKey{.write_id = 1, .replicas = OnePart(4, {kOwnPool})},
                                PlacedKey{.write_id = 2, .replicas = OnePart(6, {kOwnPool})}},
                               {Own()}, false));
  rig.Settle();
  MasterCall revoke = rig.master->Take(mfb::Body::BatchPutRevoke);
  EXPECT_EQ(revoke.keys(), (std::vector<std::string>{"short", "long"}));
  Answer(revoke, KeyCodesReply(revoke.id(), {ErrorCode::kOk, ErrorCode::kOk}));
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, (std::vector<ErrorCode>{ErrorCode::kInternal, ErrorCode::kInternal}));
  EXPECT_NE(done.messages.at(0).find("same version"), std::string::npos) << done.messages[0];
}

TEST(PipelineWrite, AMasterThatCannotBeReachedFailsEveryKeyWithMasterUnavailable) {
  PipelineRig rig;
  TestClient client(1);
  auto [id, start] = SendPut(rig, client, {"a", "b"}, {"1", "2"});
  Fail(start, ErrorCode::kMasterUnavailable, "kvmaster is not reachable; retry");
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.status.code(), ErrorCode::kMasterUnavailable);
  EXPECT_EQ(done.codes,
            (std::vector<ErrorCode>{ErrorCode::kMasterUnavailable, ErrorCode::kMasterUnavailable}));
  EXPECT_EQ(rig.master->pending(), 0u) << "nothing was started, so nothing to revoke";
}

TEST(PipelineWrite, AMasterRefusingTheWholeBatchFailsEveryKeyWithItsStatus) {
  PipelineRig rig;
  TestClient client(1);
  auto [id, start] = SendPut(rig, client, {"a"}, {"1"});
  Answer(start, RefusedReply(start.id(), ErrorCode::kMasterUnavailable, "state dir is full"));
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kMasterUnavailable});
  EXPECT_EQ(done.messages.at(0), "state dir is full");
}

// ---- deadlines ------------------------------------------------------------------------------

TEST(PipelineWrite, ARequestPastItsDeadlineOnArrivalIsAnsweredTimeoutWithoutAMasterCall) {
  PipelineRig rig;
  TestClient client(1);
  const uint64_t id = rig.Send(client.Put({"k"}, {"v"}, {.deadline = Clock::now() - 1ms}));
  EXPECT_EQ(rig.master->log().size(), 0u);
  EXPECT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kTimeout});
  EXPECT_EQ(rig.Counter("agent.expired_keys"), 1u);
}

// Placements that arrive after the caller's deadline: nothing is copied, the writes are revoked
// and the keys answer TIMEOUT.
TEST(PipelineWrite, PlacementsAfterTheDeadlineAreRevokedWithoutCopying) {
  PipelineRig rig;
  TestClient client(1);
  const auto deadline = Clock::now() + 200ms;
  auto [id, start] = SendPut(rig, client, {"k"}, {"late"}, {.deadline = deadline});
  WaitPast(deadline);
  std::memset(rig.pool().base(), 0, 64);
  Answer(start,
         PlacementReply(start.id(), {PlacedKey{.write_id = 3, .replicas = OnePart(4, {kOwnPool})}},
                        {Own()}, false));
  rig.Settle();
  MasterCall revoke = rig.master->Take(mfb::Body::BatchPutRevoke);
  EXPECT_EQ(Vec(revoke.finish()->write_ids()), std::vector<uint64_t>{3});
  Answer(revoke, KeyCodesReply(revoke.id(), {ErrorCode::kOk}));
  EXPECT_EQ(PoolBytes(rig, 0, 4), std::string(4, '\0')) << "nothing was copied";
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kTimeout});
  EXPECT_NE(done.messages.at(0).find("not stored"), std::string::npos) << done.messages[0];
}

// The bytes arrived, but after the deadline: revoked, not committed.
TEST(PipelineWrite, ATransferThatEndsAfterTheDeadlineIsRevokedNotCommitted) {
  PipelineRig rig;
  rig.data->AddPeer(kPeer, 4096);
  TestClient client(1);
  const auto deadline = Clock::now() + 300ms;
  auto [id, start] = SendPut(rig, client, {"k"}, {"slow"}, {.deadline = deadline});
  Answer(start,
         PlacementReply(start.id(), {PlacedKey{.write_id = 4, .replicas = OnePart(4, {kPeerPool})}},
                        {Own(), Peer()}, false));
  WaitPast(deadline);  // the data plane holds the bytes until then
  rig.Settle();
  MasterCall revoke = rig.master->Take(mfb::Body::BatchPutRevoke);
  EXPECT_EQ(rig.master->pending(), 0u) << "no End";
  Answer(revoke, KeyCodesReply(revoke.id(), {ErrorCode::kOk}));
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kTimeout});
  EXPECT_NE(done.messages.at(0).find("revoked, not committed"), std::string::npos)
      << done.messages[0];
}

// ---- the End's retry ------------------------------------------------------------------------

// The End is kept by the port across reconnects until shortly before the caller's deadline
// (CallUntilAnswered), so the caller gets the agent's answer rather than its own timeout.
TEST(PipelineWrite, TheEndIsRetriedUntilShortlyBeforeTheCallersDeadline) {
  PipelineRig rig;
  TestClient client(1);
  const auto deadline = Clock::now() + 60s;
  MasterCall start = SendPut(rig, client, {"k"}, {"v"}, {.deadline = deadline}).start;
  Answer(start,
         PlacementReply(start.id(), {PlacedKey{.write_id = 1, .replicas = OnePart(1, {kOwnPool})}},
                        {Own()}, false));
  MasterCall end = rig.master->Take(mfb::Body::BatchPutEnd);
  EXPECT_TRUE(end.until_answered);
  EXPECT_LT(end.retry_until, deadline);
  EXPECT_GE(end.retry_until, deadline - 1s);
}

TEST(PipelineWrite, WithoutADeadlineTheEndIsRetriedForAFixedWindow) {
  PipelineRig rig;
  TestClient client(1);
  const auto before = Clock::now();
  MasterCall start = SendPut(rig, client, {"k"}, {"v"}).start;
  Answer(start,
         PlacementReply(start.id(), {PlacedKey{.write_id = 1, .replicas = OnePart(1, {kOwnPool})}},
                        {Own()}, false));
  MasterCall end = rig.master->Take(mfb::Body::BatchPutEnd);
  EXPECT_TRUE(end.until_answered);
  EXPECT_GE(end.retry_until, before + 30s);
  EXPECT_LE(end.retry_until, Clock::now() + 30s);
}

// No master confirmed the commit before the retries ran out: the outcome is unknown, and the
// caller is told so (TIMEOUT, "may be stored"), never MASTER_UNAVAILABLE (which says "nothing
// was stored").
TEST(PipelineWrite, AnEndNoMasterConfirmedAnswersTimeoutSayingTheValueMayBeStored) {
  PipelineRig rig;
  TestClient client(1);
  auto [id, start] = SendPut(rig, client, {"k", "j"}, {"v", "w"});
  Answer(start, PlacementReply(start.id(),
                               {PlacedKey{.write_id = 1, .replicas = OnePart(1, {kOwnPool})},
                                PlacedKey{.write_id = 2, .replicas = OnePart(1, {kOwnPool}, 64)}},
                               {Own()}, false));
  MasterCall end = rig.master->Take(mfb::Body::BatchPutEnd);
  Fail(end, ErrorCode::kMasterUnavailable, "kvmaster did not answer");
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, (std::vector<ErrorCode>{ErrorCode::kTimeout, ErrorCode::kTimeout}));
  EXPECT_NE(done.messages.at(0).find("may be stored"), std::string::npos) << done.messages[0];
  EXPECT_NE(done.messages.at(0).find("kvmaster did not answer"), std::string::npos);
}

// ---- a client that leaves -------------------------------------------------------------------

// Its writes in flight are revoked (nothing partial becomes readable) and it gets no answer.
TEST(PipelineWrite, AClientThatLeavesDuringTheTransferHasItsWritesRevokedAndNoAnswer) {
  PipelineRig rig;
  rig.data->AddPeer(kPeer, 4096);
  TestClient client(1);
  auto [id, start] = SendPut(rig, client, {"k"}, {"v"});
  Answer(start,
         PlacementReply(start.id(), {PlacedKey{.write_id = 6, .replicas = OnePart(1, {kPeerPool})}},
                        {Own(), Peer()}, false));
  rig.pipeline().OnClientGone(client.id());
  EXPECT_EQ(rig.data->registered().size(), 1u) << "the arena stays registered while in use";
  rig.Settle();
  EXPECT_EQ(rig.data->registered().size(), 0u) << "and goes once the transfer is done";
  MasterCall revoke = rig.master->Take(mfb::Body::BatchPutRevoke);
  EXPECT_EQ(Vec(revoke.finish()->write_ids()), std::vector<uint64_t>{6});
  Answer(revoke, KeyCodesReply(revoke.id(), {ErrorCode::kOk}));
  EXPECT_FALSE(rig.sink.Has(id));
  EXPECT_EQ(rig.Counter("agent.abandoned_requests"), 1u);
}

TEST(PipelineWrite, AQueuedRequestOfAClientThatLeftIsDroppedBeforeAnyMasterCall) {
  PipelineRig rig;
  TestClient client(1);
  rig.pipeline().Handle(client.Put({"k"}, {"v"}), rig.sink);
  rig.pipeline().OnClientGone(client.id());
  rig.pipeline().OnPassEnd();
  EXPECT_EQ(rig.master->log().size(), 0u);
  EXPECT_TRUE(rig.sink.completed.empty());
}

}  // namespace
}  // namespace kvagent::agent

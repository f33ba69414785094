// The request pipeline's Get path against a fake master port and a fake data plane: checksums
// verified, replica fallback (a checksum mismatch moves to the next replica; all bad is
// DATA_CORRUPTED), bad replicas reported, per-key results by original position, the lease and
// the caller's deadline.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "pipeline_fakes.h"

// Designated initializers name only the fields a test cares about; the others keep their
// defaults (GCC 12 warns about those it was not given).
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace kvagent::agent {
namespace {

using namespace testing;
using namespace std::chrono_literals;

const std::string kPeerA = "tcp://10.0.0.2:7000";
const std::string kPeerB = "tcp://10.0.0.3:7000";
constexpr uint32_t kPoolA = 2, kPoolB = 3;
constexpr uint64_t kIncA = 0x2002, kIncB = 0x3003;

PoolAt Own() { return PoolAt{}; }
PoolAt PeerA() { return PoolAt{kPoolA, kPeerA, kIncA}; }
PoolAt PeerB() { return PoolAt{kPoolB, kPeerB, kIncB}; }

// A replica of part `part` of `bytes` at `offset` in pool `pool`, checksummed.
ReplicaAt At(uint32_t pool, uint64_t offset, std::string_view bytes, uint32_t part = 0) {
  return ReplicaAt{part, pool, offset, bytes.size(), Crc(bytes), true};
}

// Puts `bytes` at `offset` of this node's pool.
void InPool(PipelineRig& rig, uint64_t offset, std::string_view bytes) {
  std::memcpy(rig.pool().base() + offset, bytes.data(), bytes.size());
}
// `value` with one bit of byte `at` flipped.
std::string Flipped(std::string value, size_t at, uint8_t bit) {
  value[at] = static_cast<char>(value[at] ^ bit);
  return value;
}

void InPeer(PipelineRig& rig, const std::string& peer, uint64_t offset, std::string_view bytes) {
  std::memcpy(rig.data->peer(peer).data() + offset, bytes.data(), bytes.size());
}

// A Get sent and its BatchGet taken from the master, to be answered by the test.
struct SentGet {
  ClientRequest request;  // a copy: the same frame and arena, to read the buffers back
  uint64_t id = 0;
  MasterCall placed;
};
SentGet SendGet(PipelineRig& rig, TestClient& client, const std::vector<std::string>& keys,
                const std::vector<uint64_t>& capacities,
                std::optional<Clock::time_point> deadline = std::nullopt) {
  SentGet out;
  out.request = client.Get(keys, capacities, deadline);
  out.id = rig.Send(out.request);
  out.placed = rig.master->Take(mfb::Body::BatchGet);
  return out;
}

void WaitPast(Clock::time_point t) {
  while (Clock::now() <= t) std::this_thread::sleep_for(1ms);
}

// What ReportBadReplicas named: (key, version, part, pool) per replica.
struct Bad {
  std::string key;
  uint64_t version;
  uint32_t part;
  uint32_t pool;
  friend bool operator==(const Bad&, const Bad&) = default;
};
std::vector<Bad> Reported(const MasterCall& call) {
  const mfb::ReportBadReplicas* r = call.request().body_as_ReportBadReplicas();
  std::vector<Bad> out;
  for (uint32_t i = 0; i < r->keys()->size(); ++i) {
    out.push_back(Bad{r->keys()->Get(i)->str(), r->versions()->Get(i), r->parts()->Get(i),
                      r->pool_ids()->Get(i)});
  }
  return out;
}

TEST(PipelineRead, ALocalReplicaIsCopiedAndItsChecksumVerifiedInTheSamePass) {
  PipelineRig rig;
  TestClient client(1);
  const std::string value = Pattern("local", 5000);
  InPool(rig, 8192, value);
  auto [copy, id, placed] = SendGet(rig, client, {"k"}, {8192});
  EXPECT_EQ(placed.keys(), std::vector<std::string>{"k"});
  Answer(placed,
         PlacementReply(
             placed.id(),
             {PlacedKey{.write_id = 11, .size = 5000, .replicas = {At(kOwnPool, 8192, value)}}},
             {Own()}, true));
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(done.lengths, std::vector<uint64_t>{5000});
  EXPECT_EQ(client.Bytes(copy, 0, 5000), value);
  EXPECT_EQ(rig.data->ops_run().size(), 0u) << "no data-plane op for a local replica";
  EXPECT_EQ(rig.master->pending(), 0u) << "nothing to report";
  EXPECT_EQ(rig.Counter("agent.bytes_from_pool"), 5000u);
}

TEST(PipelineRead, PartsFromThisPoolAndFromAPeerAssembleTheValueInOrder) {
  PipelineRig rig;
  rig.data->AddPeer(kPeerA, 1 << 20);
  TestClient client(1);
  const std::string value = Pattern("two-parts", 3000);
  const std::string p0 = value.substr(0, 2000), p1 = value.substr(2000);
  InPool(rig, 0, p0);
  InPeer(rig, kPeerA, 4096, p1);
  auto [copy, id, placed] = SendGet(rig, client, {"k"}, {4000});
  Answer(placed,
         PlacementReply(placed.id(),
                        {PlacedKey{.write_id = 1,
                                   .size = 3000,
                                   .replicas = {At(kOwnPool, 0, p0, 0), At(kPoolA, 4096, p1, 1)}}},
                        {Own(), PeerA()}, true));
  rig.Settle();
  ASSERT_EQ(rig.data->ops_run().size(), 1u);
  EXPECT_EQ(rig.data->ops_run()[0].kind, transfer::TransferKind::kRead);
  EXPECT_EQ(rig.data->ops_run()[0].pool_incarnation, kIncA);
  EXPECT_EQ(rig.data->ops_run()[0].master_epoch, kMasterEpoch);
  EXPECT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(client.Bytes(copy, 0, 3000), value);
}

// Bytes in this node's pool that no longer match: the replica is reported and counted, and the
// part is read from the peer instead.
// A get of key "k" whose replica in this node's pool (at 0) is corrupt and whose copy on peer A
// is good: answered OK with the peer's bytes, the local replica reported and counted.
void GetPastACorruptLocalReplica(PipelineRig& rig, TestClient& client) {
  rig.data->AddPeer(kPeerA, 1 << 20);
  const std::string value = Pattern("x", 1000);
  InPool(rig, 0, Flipped(value, 500, 0x01));
  InPeer(rig, kPeerA, 0, value);
  auto [copy, id, placed] = SendGet(rig, client, {"k"}, {1000});
  Answer(placed,
         PlacementReply(placed.id(),
                        {PlacedKey{.write_id = 77,
                                   .size = 1000,
                                   .replicas = {At(kPoolA, 0, value), At(kOwnPool, 0, value)}}},
                        {Own(), PeerA()}, true));
  rig.Settle();
  EXPECT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(client.Bytes(copy, 0, 1000), value);
  MasterCall report = rig.master->Take(mfb::Body::ReportBadReplicas);
  EXPECT_EQ(Reported(report), (std::vector<Bad>{{"k", 77, 0, kOwnPool}}));
  EXPECT_EQ(rig.Counter("agent.checksum_mismatches"), 1u);
  EXPECT_EQ(rig.Counter("agent.corrupted_keys"), 0u);
}

TEST(PipelineRead, ACorruptLocalReplicaIsReportedAndThePartReadFromTheNextReplica) {
  PipelineRig rig;
  TestClient client(1);
  GetPastACorruptLocalReplica(rig, client);
}

TEST(PipelineRead, ACorruptPeerReplicaIsFollowedByTheNextPeer) {
  PipelineRig rig;
  rig.data->AddPeer(kPeerA, 1 << 20);
  rig.data->AddPeer(kPeerB, 1 << 20);
  TestClient client(1);
  const std::string value = Pattern("y", 700);
  InPeer(rig, kPeerA, 64, std::string(700, 'Z'));
  InPeer(rig, kPeerB, 128, value);
  auto [copy, id, placed] = SendGet(rig, client, {"k"}, {700});
  Answer(placed,
         PlacementReply(placed.id(),
                        {PlacedKey{.write_id = 5,
                                   .size = 700,
                                   .replicas = {At(kPoolA, 64, value), At(kPoolB, 128, value)}}},
                        {Own(), PeerA(), PeerB()}, true));
  ASSERT_EQ(rig.data->waiting(), 1u);
  rig.data->RunOne();  // peer A: corrupt bytes
  rig.sink.RunPosted();
  ASSERT_EQ(rig.data->waiting(), 1u) << "peer A is read again";
  rig.data->RunOne();  // corrupt again: blamed
  rig.sink.RunPosted();
  ASSERT_EQ(rig.data->waiting(), 1u) << "the next replica is read";
  rig.Settle();
  EXPECT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(client.Bytes(copy, 0, 700), value);
  MasterCall report = rig.master->Take(mfb::Body::ReportBadReplicas);
  EXPECT_EQ(Reported(report), (std::vector<Bad>{{"k", 5, 0, kPoolA}}));
  EXPECT_EQ(rig.Counter("agent.replica_fallbacks"), 1u);
}

// A batch's containers are kept for the next batch (scratch_pool.h): a get after one that found
// a corrupt replica, read the next one and reported it, reads, reports and counts only its own.
TEST(PipelineRead, AGetAfterOneThatReportedACorruptReplicaStartsClean) {
  PipelineRig rig;
  TestClient client(1);
  GetPastACorruptLocalReplica(rig, client);
  const std::string other = Pattern("o", 300);
  InPool(rig, 8192, other);
  auto [copy, id, placed] = SendGet(rig, client, {"other"}, {300});
  Answer(placed,
         PlacementReply(
             placed.id(),
             {PlacedKey{.write_id = 6, .size = 300, .replicas = {At(kOwnPool, 8192, other)}}},
             {Own()}, true));
  rig.Settle();
  EXPECT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(client.Bytes(copy, 0, 300), other);
  EXPECT_EQ(rig.master->pending(), 0u) << "nothing of the first get is reported again";
  EXPECT_EQ(rig.Counter("agent.checksum_mismatches"), 1u);
  EXPECT_EQ(rig.Counter("agent.replica_fallbacks"), 0u);
}

// Bytes from a peer damaged on their way (here: the peer's bytes are right again by the second
// read): the replica is read again and answers OK; nothing is reported or counted corrupt.
TEST(PipelineRead, APeersBytesDamagedOnceAreReadAgainAndBlameNoReplica) {
  PipelineRig rig;
  rig.data->AddPeer(kPeerA, 1 << 20);
  TestClient client(1);
  const std::string value = Pattern("d", 900);
  InPeer(rig, kPeerA, 0, Flipped(value, 450, 0x20));
  auto [copy, id, placed] = SendGet(rig, client, {"k"}, {900});
  Answer(placed,
         PlacementReply(placed.id(),
                        {PlacedKey{.write_id = 3, .size = 900, .replicas = {At(kPoolA, 0, value)}}},
                        {Own(), PeerA()}, true));
  ASSERT_EQ(rig.data->waiting(), 1u);
  rig.data->RunOne();  // the damaged bytes
  rig.sink.RunPosted();
  InPeer(rig, kPeerA, 0, value);
  ASSERT_EQ(rig.data->waiting(), 1u) << "the same replica is read again";
  rig.Settle();
  EXPECT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(client.Bytes(copy, 0, 900), value);
  EXPECT_EQ(rig.master->pending(), 0u) << "a replica was reported for one damaged read";
  EXPECT_EQ(rig.Counter("agent.peer_rereads"), 1u);
  EXPECT_EQ(rig.Counter("agent.checksum_mismatches"), 0u);
  EXPECT_EQ(rig.Counter("agent.replica_fallbacks"), 0u);
}

// Every replica read and none matches: DATA_CORRUPTED, and every one of them is reported.
TEST(PipelineRead, WhenEveryReplicaIsCorruptTheKeyIsDataCorruptedAndAllAreReported) {
  PipelineRig rig;
  rig.data->AddPeer(kPeerA, 1 << 20);
  TestClient client(1);
  const std::string value = Pattern("z", 256);
  InPool(rig, 0, std::string(256, 'a'));
  InPeer(rig, kPeerA, 0, std::string(256, 'b'));
  auto [copy, id, placed] = SendGet(rig, client, {"k"}, {256});
  Answer(placed,
         PlacementReply(placed.id(),
                        {PlacedKey{.write_id = 9,
                                   .size = 256,
                                   .replicas = {At(kOwnPool, 0, value), At(kPoolA, 0, value)}}},
                        {Own(), PeerA()}, true));
  rig.Settle();
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kDataCorrupted});
  EXPECT_NE(done.messages.at(0).find("put the value again"), std::string::npos) << done.messages[0];
  MasterCall report = rig.master->Take(mfb::Body::ReportBadReplicas);
  EXPECT_EQ(Reported(report), (std::vector<Bad>{{"k", 9, 0, kOwnPool}, {"k", 9, 0, kPoolA}}));
  EXPECT_EQ(rig.Counter("agent.corrupted_keys"), 1u);
  EXPECT_EQ(rig.Counter("agent.checksum_mismatches"), 2u);
}

// One replica corrupt, the other unreachable, in either order: the unreachable one may still
// hold the value, so the key is TRANSFER_FAILED (retry), not DATA_CORRUPTED (put it again).
TEST(PipelineRead, ACorruptReplicaAndAnUnreachableOneIsTransferFailedWhateverTheOrder) {
  for (const bool corrupt_first : {true, false}) {
    SCOPED_TRACE(corrupt_first ? "corrupt first" : "unreachable first");
    PipelineRig rig;
    rig.data->AddPeer(kPeerA, 4096);
    rig.data->Refuse(kPeerB, Status(ErrorCode::kTransferFailed, "peer B is unreachable"));
    TestClient client(1);
    const std::string value = Pattern("w", 100);
    InPeer(rig, kPeerA, 0, std::string(100, 'c'));
    auto [copy, id, placed] = SendGet(rig, client, {"k"}, {100});
    std::vector<ReplicaAt> replicas = {At(kPoolA, 0, value), At(kPoolB, 0, value)};
    if (!corrupt_first) std::swap(replicas[0], replicas[1]);
    Answer(placed, PlacementReply(placed.id(),
                                  {PlacedKey{.write_id = 2, .size = 100, .replicas = replicas}},
                                  {Own(), PeerA(), PeerB()}, true));
    rig.Settle();
    EXPECT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kTransferFailed});
    MasterCall report = rig.master->Take(mfb::Body::ReportBadReplicas);
    EXPECT_EQ(Reported(report), (std::vector<Bad>{{"k", 2, 0, kPoolA}}));
  }
}

TEST(PipelineRead, AnUnreachablePeerIsFollowedByTheNextAndAllUnreachableIsTransferFailed) {
  PipelineRig rig;
  rig.data->Refuse(kPeerA, Status(ErrorCode::kTransferFailed, "peer A refused"));
  rig.data->AddPeer(kPeerB, 4096);
  TestClient client(1);
  const std::string value = "hello";
  InPeer(rig, kPeerB, 0, value);
  auto [copy, id, placed] = SendGet(rig, client, {"good", "gone"}, {5, 5});
  Answer(placed,
         PlacementReply(placed.id(),
                        {PlacedKey{.write_id = 1,
                                   .size = 5,
                                   .replicas = {At(kPoolA, 0, value), At(kPoolB, 0, value)}},
                         PlacedKey{.write_id = 2, .size = 5, .replicas = {At(kPoolA, 64, value)}}},
                        {Own(), PeerA(), PeerB()}, true));
  rig.Settle();
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, (std::vector<ErrorCode>{ErrorCode::kOk, ErrorCode::kTransferFailed}));
  EXPECT_NE(done.messages.at(1).find("peer A refused"), std::string::npos) << done.messages[1];
  EXPECT_EQ(client.Bytes(copy, 0, 5), value);
  EXPECT_EQ(rig.master->pending(), 0u) << "nothing corrupt, nothing reported";
  EXPECT_EQ(rig.Counter("agent.transfer_failures"), 1u);
}

// SEMANTICS rule 9 for reads: two requests in one BatchGet; results, lengths and bytes follow
// each key's position in its own request.
TEST(PipelineRead, ResultsAndLengthsFollowEachKeyAcrossRequestsSharingABatch) {
  PipelineRig rig;
  TestClient a(1), b(2);
  InPool(rig, 0, "alpha");
  InPool(rig, 64, "gamma!");
  ClientRequest ra = a.Get({"a0", "a1"}, {16, 16});
  ClientRequest rb = b.Get({"b0", "b1"}, {16, 2});
  const ClientRequest ca = ra, cb = rb;
  std::vector<ClientRequest> both;
  both.push_back(std::move(ra));
  both.push_back(std::move(rb));
  rig.SendTogether(std::move(both));
  MasterCall placed = rig.master->Take(mfb::Body::BatchGet);
  EXPECT_EQ(placed.keys(), (std::vector<std::string>{"a0", "a1", "b0", "b1"}));
  Answer(placed,
         PlacementReply(
             placed.id(),
             {PlacedKey{.code = ErrorCode::kObjectNotFound, .message = "no a0"},
              PlacedKey{.write_id = 1, .size = 5, .replicas = {At(kOwnPool, 0, "alpha")}},
              PlacedKey{.write_id = 2, .size = 6, .replicas = {At(kOwnPool, 64, "gamma!")}},
              PlacedKey{.write_id = 3, .size = 6, .replicas = {At(kOwnPool, 64, "gamma!")}}},
             {Own()}, true));
  const CompletionData& da = rig.sink.Of(ca.request_id);
  EXPECT_EQ(da.codes, (std::vector<ErrorCode>{ErrorCode::kObjectNotFound, ErrorCode::kOk}));
  EXPECT_EQ(da.messages.at(0), "no a0");
  EXPECT_EQ(da.lengths, (std::vector<uint64_t>{0, 5}));
  EXPECT_EQ(a.Bytes(ca, 1, 5), "alpha");
  const CompletionData& db = rig.sink.Of(cb.request_id);
  // b1's buffer holds 2 bytes: BUFFER_OUT_OF_RANGE with the size needed, and nothing copied.
  EXPECT_EQ(db.codes, (std::vector<ErrorCode>{ErrorCode::kOk, ErrorCode::kBufferOutOfRange}));
  EXPECT_EQ(db.lengths, (std::vector<uint64_t>{6, 6}));
  EXPECT_EQ(b.Bytes(cb, 0, 6), "gamma!");
  EXPECT_EQ(b.Bytes(cb, 1, 2), "\xEE\xEE");
}

TEST(PipelineRead, PlacementsAfterTheDeadlineAnswerTimeoutWithoutTouchingTheBuffer) {
  PipelineRig rig;
  TestClient client(1);
  InPool(rig, 0, "value");
  const auto deadline = Clock::now() + 200ms;
  auto [copy, id, placed] = SendGet(rig, client, {"k"}, {5}, deadline);
  WaitPast(deadline);
  Answer(placed, PlacementReply(
                     placed.id(),
                     {PlacedKey{.write_id = 1, .size = 5, .replicas = {At(kOwnPool, 0, "value")}}},
                     {Own()}, true));
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kTimeout});
  EXPECT_EQ(client.Bytes(copy, 0, 5), std::string(5, '\xEE'));
}

// Bytes that arrived after the read lease ran out may mix two values (the range may have been
// handed to a new writer): TIMEOUT, even though they checksum correctly.
TEST(PipelineRead, BytesThatArriveAfterTheReadLeaseAreNotAnsweredOk) {
  PipelineRig rig;
  rig.data->AddPeer(kPeerA, 4096);
  TestClient client(1);
  InPeer(rig, kPeerA, 0, "value");
  const auto sent = Clock::now();
  auto [copy, id, placed] = SendGet(rig, client, {"k"}, {5});
  Answer(placed,
         PlacementReply(placed.id(),
                        {PlacedKey{.write_id = 1, .size = 5, .replicas = {At(kPoolA, 0, "value")}}},
                        {Own(), PeerA()}, true, /*lease_ttl_ms=*/20));
  WaitPast(sent + 50ms);
  rig.Settle();
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kTimeout});
  EXPECT_NE(done.messages.at(0).find("lease"), std::string::npos) << done.messages[0];
  EXPECT_EQ(rig.Counter("agent.lease_expired"), 1u);
}

// Bytes that arrive after the read lease and fail their checksum: an upsert of the same size may
// have rewritten the value in place once the lease was gone (seen across a throttled link:
// SlowLink in tests/integrity). They say nothing about the replica: TIMEOUT, nothing reported,
// nothing counted corrupt, no second read (before, the replica was read again, blamed, reported
// and the get answered DATA_CORRUPTED).
TEST(PipelineRead, BytesThatFailTheirChecksumAfterTheReadLeaseBlameNoReplica) {
  PipelineRig rig;
  rig.data->AddPeer(kPeerA, 4096);
  rig.data->AddPeer(kPeerB, 4096);
  TestClient client(1);
  const std::string before = Pattern("old", 600), after = Pattern("new", 600);
  InPeer(rig, kPeerA, 0, after);  // replaced while the bytes were on their way
  InPeer(rig, kPeerB, 0, before);
  const auto sent = Clock::now();
  auto [copy, id, placed] = SendGet(rig, client, {"k"}, {600});
  Answer(placed,
         PlacementReply(placed.id(),
                        {PlacedKey{.write_id = 4,
                                   .size = 600,
                                   .replicas = {At(kPoolA, 0, before), At(kPoolB, 0, before)}}},
                        {Own(), PeerA(), PeerB()}, true, /*lease_ttl_ms=*/20));
  WaitPast(sent + 50ms);
  ASSERT_EQ(rig.data->waiting(), 1u);
  rig.data->RunOne();
  rig.sink.RunPosted();
  EXPECT_EQ(rig.data->waiting(), 0u) << "no other read once the lease is gone";
  rig.Settle();
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kTimeout});
  EXPECT_NE(done.messages.at(0).find("no replica is blamed"), std::string::npos)
      << done.messages[0];
  EXPECT_EQ(rig.master->pending(), 0u) << "a replica was reported";
  EXPECT_EQ(rig.Counter("agent.checksum_mismatches"), 0u);
  EXPECT_EQ(rig.Counter("agent.corrupted_keys"), 0u);
  EXPECT_EQ(rig.Counter("agent.peer_rereads"), 0u);
  EXPECT_EQ(rig.Counter("agent.lease_expired"), 1u);
}

// The same for this node's own replica when the master's answer itself came after the lease.
TEST(PipelineRead, ALocalCopyThatFailsItsChecksumAfterTheReadLeaseBlamesNoReplica) {
  PipelineRig rig;
  TestClient client(1);
  const std::string before = Pattern("old", 300);
  InPool(rig, 0, Pattern("new", 300));
  const auto sent = Clock::now();
  auto [copy, id, placed] = SendGet(rig, client, {"k"}, {300});
  WaitPast(sent + 50ms);
  Answer(placed, PlacementReply(
                     placed.id(),
                     {PlacedKey{.write_id = 6, .size = 300, .replicas = {At(kOwnPool, 0, before)}}},
                     {Own()}, true, /*lease_ttl_ms=*/20));
  rig.Settle();
  EXPECT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kTimeout});
  EXPECT_EQ(rig.master->pending(), 0u) << "a replica was reported";
  EXPECT_EQ(rig.Counter("agent.checksum_mismatches"), 0u);
}

TEST(PipelineRead, WithChecksumsOffCorruptBytesAreNotDetected) {
  PipelineRig rig(/*checksums=*/false);
  TestClient client(1);
  InPool(rig, 0, "xxxxx");
  auto [copy, id, placed] = SendGet(rig, client, {"k"}, {5});
  Answer(placed, PlacementReply(
                     placed.id(),
                     {PlacedKey{.write_id = 1, .size = 5, .replicas = {At(kOwnPool, 0, "value")}}},
                     {Own()}, true));
  EXPECT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(rig.master->pending(), 0u);
}

// A placement in this node's pool is read only as the pool's fence would let a peer read it:
// for this incarnation of the pool, placed by the master the pool is registered with. Else its
// offsets belong to another pool (this agent's predecessor, or a dead agent that had this
// endpoint) or to another master's view, and the bytes there now are another value's: without
// checksums nothing else would notice. Nor is a pool without an endpoint taken for this one.
TEST(PipelineRead, AStalePlacementInThisPoolIsNeverReadEvenWithoutChecksums) {
  struct Case {
    const char* what;
    PoolAt pool;
    uint64_t fence_epoch;
  };
  const Case cases[] = {
      {"another incarnation of this pool", PoolAt{kOwnPool, kOwnEndpoint, kOwnIncarnation + 1},
       kMasterEpoch},
      {"a dead agent's pool at this endpoint", PoolAt{kPoolA, kOwnEndpoint, kIncA}, kMasterEpoch},
      {"another master epoch", Own(), kMasterEpoch + 1},
      {"a pool without an endpoint", PoolAt{kPoolA, "", kIncA}, kMasterEpoch},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    PipelineRig rig(/*checksums=*/false);
    rig.fence().SetEpoch(c.fence_epoch);
    TestClient client(1);
    InPool(rig, 0, "other");  // what the pool holds there now
    auto [copy, id, placed] = SendGet(rig, client, {"k"}, {5});
    Answer(placed,
           PlacementReply(
               placed.id(),
               {PlacedKey{.write_id = 1, .size = 5, .replicas = {At(c.pool.id, 0, "value")}}},
               {c.pool}, true));
    rig.Settle();
    const CompletionData& done = rig.sink.Of(id);
    EXPECT_EQ(done.codes, std::vector<ErrorCode>{ErrorCode::kTransferFailed});
    EXPECT_NE(client.Bytes(copy, 0, 5), "other");
    EXPECT_EQ(rig.data->ops_run().size(), 0u) << "no peer is asked in its place";
    EXPECT_EQ(rig.Counter("agent.bytes_from_pool"), 0u);
  }
}

TEST(PipelineRead, AMasterThatCannotBeReachedFailsEveryKey) {
  PipelineRig rig;
  TestClient client(1);
  auto [copy, id, placed] = SendGet(rig, client, {"a", "b"}, {4, 4});
  Fail(placed, ErrorCode::kMasterUnavailable, "kvmaster is not reachable");
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes,
            (std::vector<ErrorCode>{ErrorCode::kMasterUnavailable, ErrorCode::kMasterUnavailable}));
  EXPECT_EQ(rig.Counter("agent.master_failures"), 1u);
}

// A batch of local parts (each copy asks for the next value ahead; the last one has none): a
// corrupt part in the middle is caught and read from its next replica, a corrupt last part fails
// its key, and the others are answered with their bytes.
TEST(PipelineRead, InABatchCorruptPartsInTheMiddleAndAtTheEndAreCaught) {
  PipelineRig rig;
  rig.data->AddPeer(kPeerA, 1 << 20);
  TestClient client(1);
  constexpr size_t kKeys = 6, kSize = 4096;
  std::vector<std::string> keys, values;
  std::vector<PlacedKey> placed_keys;
  for (size_t i = 0; i < kKeys; ++i) {
    keys.push_back("k" + std::to_string(i));
    values.push_back(Pattern(keys.back(), kSize));
    std::string in_pool = values.back();
    if (i == 2 || i == 5) in_pool[kSize - 1] ^= 0x10;  // corrupt in this node's pool
    InPool(rig, i * kSize, in_pool);
  }
  InPeer(rig, kPeerA, 0, values[2]);
  for (size_t i = 0; i < kKeys; ++i) {
    PlacedKey k{
        .write_id = 100 + i, .size = kSize, .replicas = {At(kOwnPool, i * kSize, values[i])}};
    if (i == 2) k.replicas.push_back(At(kPoolA, 0, values[2]));
    placed_keys.push_back(k);
  }
  auto [copy, id, placed] = SendGet(rig, client, keys, std::vector<uint64_t>(kKeys, kSize));
  Answer(placed, PlacementReply(placed.id(), placed_keys, {Own(), PeerA()}, true));
  rig.Settle();
  const CompletionData& done = rig.sink.Of(id);
  EXPECT_EQ(done.codes,
            (std::vector<ErrorCode>{ErrorCode::kOk, ErrorCode::kOk, ErrorCode::kOk, ErrorCode::kOk,
                                    ErrorCode::kOk, ErrorCode::kDataCorrupted}));
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(client.Bytes(copy, i, kSize), values[i]) << keys[i];
  MasterCall report = rig.master->Take(mfb::Body::ReportBadReplicas);
  EXPECT_EQ(Reported(report),
            (std::vector<Bad>{{"k2", 102, 0, kOwnPool}, {"k5", 105, 0, kOwnPool}}));
  EXPECT_EQ(rig.Counter("agent.checksum_mismatches"), 2u);
  EXPECT_EQ(rig.Counter("agent.corrupted_keys"), 1u);
  EXPECT_EQ(rig.data->ops_run().size(), 1u) << "only k2's part from the peer";
}

// 200 single-key gets of `key` (4 KiB, placed as `placed_key` in `pools`) while another thread
// keeps writing into each get's buffer, as a client may write into its own shared memory: every
// get answers OK (with whatever the buffer holds) and no replica is reported or counted corrupt.
void ExpectScribbledGetsBlameNoReplica(PipelineRig& rig, TestClient& client,
                                       const std::vector<PlacedKey>& placed_key,
                                       const std::vector<PoolAt>& pools) {
  constexpr size_t kSize = 4096;
  for (int round = 0; round < 200; ++round) {
    auto [copy, id, placed] = SendGet(rig, client, {"k"}, {kSize});
    uint8_t* at = client.arena().data() + copy.request().buffers()->Get(0)->offset();
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> sweeps{0};
    std::thread scribbler([&stop, &sweeps, at] {
      for (uint8_t b = 0; !stop.load(std::memory_order_relaxed); ++b) {
        for (size_t i = 0; i < kSize; i += 64) {
          std::atomic_ref<uint8_t>(at[i]).store(b, std::memory_order_relaxed);
        }
        sweeps.fetch_add(1, std::memory_order_relaxed);
      }
    });
    while (sweeps.load() == 0) std::this_thread::yield();
    Answer(placed, PlacementReply(placed.id(), placed_key, pools, true));
    rig.Settle();
    stop.store(true);
    scribbler.join();
    ASSERT_EQ(rig.sink.Of(id).codes, std::vector<ErrorCode>{ErrorCode::kOk}) << "round " << round;
  }
  EXPECT_EQ(rig.master->pending(), 0u) << "a good replica was reported corrupt";
  EXPECT_EQ(rig.Counter("agent.checksum_mismatches"), 0u);
}

// The arena is the client's memory too: a client that writes into its own buffer while its get
// runs gets what it wrote, but a good replica is never blamed (and dropped cluster-wide) for it.
// A single small value's CRC is taken over the buffer after the copy (faster out of cold memory),
// so one that does not match is taken again from the pool's bytes before the replica is blamed.
// (The race is the point: a client process writing into shared memory the agent copies into.
// Here both sides are threads of one process, which ThreadSanitizer rightly reports.)
TEST(PipelineRead, AClientWritingIntoItsBufferDuringGetsNeverGetsAGoodReplicaDropped) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "races on purpose";
#endif
  PipelineRig rig;
  TestClient client(1);
  const std::string value = Pattern("scribbled", 4096);
  InPool(rig, 0, value);
  ExpectScribbledGetsBlameNoReplica(
      rig, client, {PlacedKey{.write_id = 1, .size = 4096, .replicas = {At(kOwnPool, 0, value)}}},
      {Own()});
}

// The same for bytes from a peer: their CRC is the one the transport took as they arrived, so a
// client writing into the buffer they land in cannot get the peer's good replica dropped.
TEST(PipelineRead, AClientWritingIntoItsBufferDuringPeerReadsNeverGetsAPeersReplicaDropped) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "races on purpose";
#endif
  PipelineRig rig;
  rig.data->AddPeer(kPeerA, 1 << 20);
  TestClient client(1);
  const std::string value = Pattern("from-a-peer", 4096);
  InPeer(rig, kPeerA, 0, value);
  ExpectScribbledGetsBlameNoReplica(
      rig, client, {PlacedKey{.write_id = 1, .size = 4096, .replicas = {At(kPoolA, 0, value)}}},
      {Own(), PeerA()});
}

}  // namespace
}  // namespace kvagent::agent

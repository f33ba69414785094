// Attacks on a real kvmaster's RPC and event sockets from a peer that speaks raw ZMQ: every one
// must get an error (or be cut off) and leave kvmaster alive, answering and about as large as
// before. Each comment names what the attack did to kvmaster before it was fixed.
#include <gtest/gtest.h>

#include <thread>

#include "rpc_test_util.h"
#include "security_support.h"
#include "zmq_test_client.h"

namespace kvagent::testing {
namespace {

namespace fb = kvagent::master_proto;
using master::testing::Bytes;
using master::testing::MasterClient;
using master::testing::ParseReply;
using master::testing::StatValue;

constexpr uint16_t kInvalidParams = static_cast<uint16_t>(ErrorCode::kInvalidParams);

// A kvmaster on loopback plus a client on its RPC socket.
struct Master {
  Master() : process({"--tick-ms", "20"}), client(process.rpc()) {}

  // kvmaster still answers a Stats request.
  bool Answers() {
    std::string storage;
    const fb::Reply* r = client.Call(master::testing::StatsMsg(), &storage);
    return r != nullptr && r->status() == 0;
  }
  uint64_t Stat(const std::string& name) {
    std::string storage;
    const fb::Reply* r = client.Call(master::testing::StatsMsg(), &storage);
    return r == nullptr ? ~0ull : StatValue(r, name);
  }
  uint64_t PeakKiB() { return ProcStatusKiB(process.pid(), "VmHWM"); }

  KvmasterProcess process;
  MasterClient client;
};

// The reply's message ("" when it has none: the old code's OK replies).
std::string MessageOf(const fb::Reply* r) {
  return r != nullptr && r->message() != nullptr ? r->message()->str() : "";
}

// A Request whose body_type names `type` but that carries no body table.
Bytes Bodyless(fb::Body type, uint64_t id) {
  flatbuffers::FlatBufferBuilder b;
  fb::RequestBuilder rb(b);
  rb.add_request_id(id);
  rb.add_body_type(type);
  b.Finish(rb.Finish());
  return Bytes(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

TEST(MasterAttack, ARequestTypeWithoutItsBodyIsRefusedForEveryTypeAndKvmasterLives) {
  // Was: SIGSEGV on the first such 32-byte message (15 of 16 types).
  Master m;
  ASSERT_TRUE(m.process.started());
  for (int t = static_cast<int>(fb::Body::MIN); t <= static_cast<int>(fb::Body::MAX); ++t) {
    const auto type = static_cast<fb::Body>(t);
    std::string storage;
    const fb::Reply* r = m.client.Call(Bodyless(type, 1000 + t), &storage);
    ASSERT_NE(r, nullptr) << fb::EnumNameBody(type) << ": no reply (kvmaster died?)";
    EXPECT_EQ(r->request_id(), 1000u + t);
    EXPECT_EQ(r->status(), kInvalidParams) << fb::EnumNameBody(type);
  }
  EXPECT_TRUE(m.Answers());
  EXPECT_GE(m.Stat("bad_requests"), static_cast<uint64_t>(fb::Body::MAX));
}

TEST(MasterAttack, ABatchWhoseKeysShareOneStringIsRefusedWithASmallReply) {
  // Was: 65 536 keys naming one 4 KiB string (a 260 KiB message) made kvmaster build a reply of
  // ~270 MiB (each per-key message names the key); 31 MiB of them, 687 MiB and a 13.6 s stall.
  Master m;
  ASSERT_TRUE(m.process.started());
  const uint64_t peak_before = m.PeakKiB();
  flatbuffers::FlatBufferBuilder b;
  const auto key = b.CreateString(std::string(4096, 'k'));
  const std::vector<flatbuffers::Offset<flatbuffers::String>> keys(65536, key);
  const auto body = fb::CreateBatchGet(b, b.CreateVector(keys));
  b.Finish(fb::CreateRequest(b, 7, fb::Body::BatchGet, body.Union()));
  const Bytes request(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  ASSERT_LT(request.size(), 300u << 10);
  std::string storage;
  const fb::Reply* r = m.client.Call(request, &storage);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), kInvalidParams);
  EXPECT_NE(MessageOf(r).find("share"), std::string::npos) << MessageOf(r);
  EXPECT_LT(storage.size(), 64u << 10);
  EXPECT_LT(m.PeakKiB(), peak_before + (64 << 10)) << "kvmaster's peak memory grew";
  EXPECT_TRUE(m.Answers());
}

// `request` (a verified BatchPutStart) with its sizes vector moved to the end of the buffer so
// that its 8-byte elements sit at an address that is 4 mod 8: the Verifier accepts it.
Bytes WithMisalignedSizes(Bytes request) {
  const auto* req = flatbuffers::GetRoot<fb::Request>(request.data());
  const auto* start = req->body_as_BatchPutStart();
  // The field's place: table start + the offset its vtable gives for VT_SIZES.
  const auto* table = reinterpret_cast<const uint8_t*>(start);
  const uint8_t* vtable = table - flatbuffers::ReadScalar<flatbuffers::soffset_t>(table);
  const size_t field =
      static_cast<size_t>(table - request.data()) +
      flatbuffers::ReadScalar<flatbuffers::voffset_t>(vtable + fb::WriteStart::VT_SIZES);
  const std::vector<uint64_t> sizes(start->sizes()->begin(), start->sizes()->end());
  while (request.size() % 8 != 0) request.push_back(0);
  const size_t vector_at = request.size();  // length at 0 mod 8, elements at 4 mod 8
  const uint32_t count = static_cast<uint32_t>(sizes.size());
  request.insert(request.end(), reinterpret_cast<const uint8_t*>(&count),
                 reinterpret_cast<const uint8_t*>(&count) + 4);
  for (uint64_t s : sizes) {
    request.insert(request.end(), reinterpret_cast<const uint8_t*>(&s),
                   reinterpret_cast<const uint8_t*>(&s) + 8);
  }
  const uint32_t relative = static_cast<uint32_t>(vector_at - field);
  std::memcpy(request.data() + field, &relative, 4);
  return request;
}

TEST(MasterAttack, MisalignedEightByteVectorElementsAreRefusedNotRead) {
  // Was: read through a misaligned pointer (undefined behaviour; UBSan reports it).
  Master m;
  ASSERT_TRUE(m.process.started());
  std::string storage;
  const fb::Reply* reg = m.client.Call(master::testing::RegisterAgentMsg("mallory", 1), &storage);
  ASSERT_NE(reg, nullptr);
  const uint32_t agent = reg->body_as_RegisterAgentReply()->agent_id();
  const Bytes crafted =
      WithMisalignedSizes(master::testing::WriteStartMsg(agent, {"k1", "k2"}, {100, 200}));
  flatbuffers::Verifier verifier(crafted.data(), crafted.size());
  ASSERT_TRUE(verifier.VerifyBuffer<fb::Request>(nullptr)) << "the Verifier accepts it";
  ASSERT_EQ(reinterpret_cast<uintptr_t>(flatbuffers::GetRoot<fb::Request>(crafted.data())
                                            ->body_as_BatchPutStart()
                                            ->sizes()
                                            ->data()) %
                8,
            4u);
  const fb::Reply* r = m.client.Call(crafted, &storage);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), kInvalidParams);
  EXPECT_NE(MessageOf(r).find("aligned"), std::string::npos) << MessageOf(r);
  EXPECT_EQ(m.Stat("writes_in_flight"), 0u);
}

TEST(MasterAttack, AMessageAboveTheLimitIsCutOffWithoutBeingBuffered) {
  // Was: a 512 MiB frame was received, buffered whole and answered.
  Master m;
  ASSERT_TRUE(m.process.started());
  const uint64_t peak_before = m.PeakKiB();
  {
    MasterClient attacker(m.process.rpc(), /*timeout_ms=*/2000);
    attacker.Send(Bytes(96u << 20, 0x41));  // 96 MiB, above the 64 MiB limit
    EXPECT_FALSE(attacker.Receive().has_value()) << "kvmaster answered a 96 MiB message";
  }
  EXPECT_TRUE(m.Answers());
  EXPECT_LT(m.PeakKiB(), peak_before + (32 << 10)) << "kvmaster buffered the message";
}

TEST(MasterAttack, ATinyPoolIsRefusedAndDoesNotShrinkEveryonesParts) {
  // Was: a mounted 64-byte pool became the part size of every value in the cluster.
  Master m;
  ASSERT_TRUE(m.process.started());
  std::string storage;
  auto register_agent = [&](const std::string& name) {
    const fb::Reply* r = m.client.Call(master::testing::RegisterAgentMsg(name, 1), &storage);
    return r == nullptr || r->body_as_RegisterAgentReply() == nullptr
               ? 0u
               : r->body_as_RegisterAgentReply()->agent_id();
  };
  const uint32_t honest = register_agent("honest");
  ASSERT_EQ(m.client.Call(master::testing::MountPoolMsg(honest, 64u << 20, "tcp://h:1"), &storage)
                ->status(),
            0);
  const uint32_t mallory = register_agent("mallory");
  const fb::Reply* tiny =
      m.client.Call(master::testing::MountPoolMsg(mallory, 64, "tcp://m:1"), &storage);
  ASSERT_NE(tiny, nullptr);
  EXPECT_EQ(tiny->status(), kInvalidParams);
  EXPECT_NE(MessageOf(tiny).find("minimum"), std::string::npos);
  // A 4 MiB value is one part (the part size is 64 MiB and only the honest pool is mounted).
  const fb::Reply* put =
      m.client.Call(master::testing::WriteStartMsg(honest, {"big"}, {4u << 20}), &storage);
  ASSERT_NE(put, nullptr);
  ASSERT_EQ(put->status(), 0);
  EXPECT_EQ(put->body_as_PlacementReply()->placements()->size(), 1u);
}

TEST(MasterAttack, AListKeysPageCannotAskForTheWholeStore) {
  Master m;
  ASSERT_TRUE(m.process.started());
  flatbuffers::FlatBufferBuilder b;
  b.Finish(
      fb::CreateRequest(b, 9, fb::Body::ListKeys, fb::CreateListKeys(b, 0, 0xFFFFFFFFu).Union()));
  std::string storage;
  const fb::Reply* r =
      m.client.Call(Bytes(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()), &storage);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), kInvalidParams);
}

// Stores `count` objects whose BlockStored events carry 4 096 token ids each (~16 KiB per event):
// the event publisher then retains that many bytes for replay.
void FillEventHistory(Master& m, int count) {
  std::string storage;
  const uint32_t agent = m.client.Call(master::testing::RegisterAgentMsg("writer", 1), &storage)
                             ->body_as_RegisterAgentReply()
                             ->agent_id();
  ASSERT_EQ(m.client.Call(master::testing::MountPoolMsg(agent, 256u << 20, "tcp://w:1"), &storage)
                ->status(),
            0);
  const std::vector<uint32_t> tokens(4096, 7);
  for (int i = 0; i < count; ++i) {
    flatbuffers::FlatBufferBuilder b;
    const std::vector<std::string> keys = {"obj-" + std::to_string(i)};
    const block_proto::BlockHash hash(static_cast<uint64_t>(i), false);
    const auto meta =
        fb::CreateBlockMeta(b, b.CreateVectorOfStructs(&hash, 1), 0, b.CreateVector(tokens), 4096);
    const std::vector<flatbuffers::Offset<fb::BlockMeta>> metas = {meta};
    const std::vector<uint64_t> sizes = {64};
    const auto start =
        fb::CreateWriteStart(b, agent, b.CreateVectorOfStrings(keys), b.CreateVector(sizes), 0,
                             b.CreateVector(metas), fb::CreateWriteOptions(b));
    b.Finish(fb::CreateRequest(b, 1, fb::Body::BatchPutStart, start.Union()));
    ASSERT_EQ(
        m.client.Call(Bytes(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()), &storage)
            ->status(),
        0);
    ASSERT_EQ(
        m.client
            .Call(master::testing::WriteFinishMsg(fb::Body::BatchPutEnd, agent, keys), &storage)
            ->status(),
        0);
  }
}

TEST(MasterAttack, ReplayRequestsFromPeersThatNeverReadDoNotGrowKvmaster) {
  // Was: each 9-byte replay request copied every retained batch into that peer's queue and
  // kept it there (~95 MiB per request with a full history).
  Master m;
  ASSERT_TRUE(m.process.started());
  FillEventHistory(m, 2000);  // ~32 MiB of retained batches
  ASSERT_TRUE(WaitUntil([&] { return m.Stat("events_published") >= 2000; }));
  const uint64_t peak_before = m.PeakKiB();
  constexpr int kPeers = 16;
  zmq::context_t context(1);
  std::vector<zmq::socket_t> peers;
  for (int i = 0; i < kPeers; ++i) {
    peers.emplace_back(context, zmq::socket_type::dealer);
    peers.back().set(zmq::sockopt::linger, 0);
    peers.back().set(zmq::sockopt::rcvhwm, 1);  // and never read: the queue stays with kvmaster
    peers.back().set(zmq::sockopt::rcvbuf, 4096);
    peers.back().connect(m.process.replay());
    peers.back().send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    const std::string from_zero(8, '\0');
    peers.back().send(zmq::buffer(from_zero), zmq::send_flags::none);
  }
  ASSERT_TRUE(WaitUntil([&] { return m.Stat("event_replay_requests") >= kPeers; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the replays run
  EXPECT_TRUE(m.Answers());
  // 16 copies of the history would be ~512 MiB; references to it cost next to nothing.
  EXPECT_LT(m.PeakKiB(), peak_before + (96 << 10))
      << "kvmaster grew by " << (m.PeakKiB() - peak_before) / 1024 << " MiB";
}

}  // namespace
}  // namespace kvagent::testing

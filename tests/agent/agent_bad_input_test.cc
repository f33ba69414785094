// A real kvagent answers every malformed request with an error that says what is wrong, and
// keeps serving: truncated frames, garbage, out-of-range buffers, bad session IDs, mismatched
// counts, a scribbled ring (that client alone is disconnected).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "agent_process.h"
#include "raw_client.h"

namespace kvagent::testing {
namespace {

using proto::Op;

struct RequestFields {
  Op op = Op::Ping;
  std::vector<std::string> keys;
  std::vector<std::string> session_ids;
  std::vector<proto::BufferRef> buffers;
  bool with_sessions = false;
  uint64_t call_word = 0;
};

std::vector<uint8_t> Encode(uint64_t id, const RequestFields& r) {
  flatbuffers::FlatBufferBuilder fbb;
  auto keys = fbb.CreateVectorOfStrings(r.keys);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> sessions;
  if (r.with_sessions) sessions = fbb.CreateVectorOfStrings(r.session_ids);
  flatbuffers::Offset<flatbuffers::Vector<const proto::BufferRef*>> buffers;
  if (!r.buffers.empty()) buffers = fbb.CreateVectorOfStructs(r.buffers);
  proto::RequestBuilder b(fbb);
  b.add_request_id(id);
  b.add_op(r.op);
  if (!r.keys.empty()) b.add_keys(keys);
  if (r.with_sessions) b.add_session_ids(sessions);
  if (!r.buffers.empty()) b.add_buffers(buffers);
  if (r.call_word != 0) b.add_call_word(r.call_word);
  fbb.Finish(b.Finish());
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

struct Answer {
  uint64_t request_id = 0;
  ErrorCode status = ErrorCode::kInternal;
  std::string message;
  std::vector<ErrorCode> codes;
  std::vector<std::string> messages;
};

// Sends `frame` with `request_id` and returns the agent's completion.
Answer RoundTrip(RawClient& s, uint64_t request_id, std::span<const uint8_t> frame) {
  Answer a;
  EXPECT_TRUE(s.Send(request_id, frame));
  std::vector<uint8_t> bytes;
  if (!s.Receive(&a.request_id, &bytes)) {
    ADD_FAILURE() << "no completion for request " << request_id;
    return a;
  }
  flatbuffers::Verifier verifier(bytes.data(), bytes.size());
  if (!verifier.VerifyBuffer<proto::Completion>(nullptr)) {
    ADD_FAILURE() << "completion does not verify";
    return a;
  }
  const auto* c = flatbuffers::GetRoot<proto::Completion>(bytes.data());
  a.status = ErrorCodeFromWire(c->status());
  a.message = c->message() ? c->message()->str() : "";
  if (c->codes()) {
    for (auto code : *c->codes()) a.codes.push_back(ErrorCodeFromWire(code));
  }
  if (c->messages()) {
    for (const auto* m : *c->messages()) a.messages.push_back(m->str());
  }
  return a;
}

Answer RoundTrip(RawClient& s, uint64_t request_id, const RequestFields& r) {
  return RoundTrip(s, request_id, Encode(request_id, r));
}

class AgentBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(agent_.started());
    client_ = std::make_unique<RawClient>(agent_.socket_path());
    ASSERT_TRUE(client_->ok()) << client_->error();
  }
  // The agent still answers a well-formed Ping on this connection.
  void ExpectStillServing(uint64_t request_id) {
    Answer a = RoundTrip(*client_, request_id, RequestFields{});
    EXPECT_EQ(a.request_id, request_id);
    EXPECT_EQ(a.status, ErrorCode::kOk) << a.message;
  }

  // Degraded (no reachable master): valid requests reach the pipeline and fail there, so each
  // test sees exactly what the ring service's checks let through.
  AgentProcess agent_{DegradedAgentArgs()};
  std::unique_ptr<RawClient> client_;
};

TEST_F(AgentBadInput, PingIsAnsweredOk) { ExpectStillServing(1); }

TEST_F(AgentBadInput, TruncatedFrameIsInvalidParamsAndTheAgentKeepsServing) {
  RequestFields put{Op::Put, {"a", "b"}, {}, {{0, 8}, {64, 8}}};
  std::vector<uint8_t> frame = Encode(7, put);
  // Cuts that drop bytes the request refers to (the very last bytes may be alignment padding).
  for (size_t cut : {size_t{0}, size_t{3}, size_t{8}, frame.size() / 2, frame.size() * 3 / 4}) {
    Answer a = RoundTrip(*client_, 7, std::span<const uint8_t>(frame.data(), cut));
    EXPECT_EQ(a.request_id, 7u);
    EXPECT_EQ(a.status, ErrorCode::kInvalidParams) << "cut at " << cut;
    EXPECT_NE(a.message.find("not a valid Request"), std::string::npos) << a.message;
  }
  ExpectStillServing(8);
}

TEST_F(AgentBadInput, GarbageBytesAreInvalidParamsAndTheAgentKeepsServing) {
  std::mt19937 rng(11);
  for (int i = 0; i < 200; ++i) {
    std::vector<uint8_t> junk(rng() % 512);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    Answer a = RoundTrip(*client_, 100 + i, junk);
    EXPECT_EQ(a.request_id, static_cast<uint64_t>(100 + i));
    EXPECT_NE(a.status, ErrorCode::kOk);
  }
  ExpectStillServing(999);
}

TEST_F(AgentBadInput, BufferOutsideTheArenaIsBufferOutOfRangeForEveryKey) {
  const uint64_t arena = client_->segment().layout().arena_bytes;
  RequestFields put{Op::Put, {"k0", "k1"}, {}, {{0, 16}, {arena - 8, 16}}};
  Answer a = RoundTrip(*client_, 3, put);
  EXPECT_EQ(a.status, ErrorCode::kBufferOutOfRange);
  ASSERT_EQ(a.codes.size(), 2u);
  EXPECT_EQ(a.codes[0], ErrorCode::kBufferOutOfRange);
  EXPECT_EQ(a.codes[1], ErrorCode::kBufferOutOfRange);
  EXPECT_NE(a.messages[1].find("buffers[1]"), std::string::npos) << a.messages[1];
  RequestFields overflow{Op::Get, {"k"}, {}, {{~0ULL - 4, 16}}};
  EXPECT_EQ(RoundTrip(*client_, 4, overflow).status, ErrorCode::kBufferOutOfRange);
  ExpectStillServing(5);
}

// Request.call_word names a 4-byte aligned word inside the arena, on an op that moves bytes.
TEST_F(AgentBadInput, ACallWordOutsideTheArenaOrMisalignedOrOnAnotherOpIsRefused) {
  const uint64_t arena = client_->segment().layout().arena_bytes;
  uint64_t id = 20;
  for (uint64_t word : std::vector<uint64_t>{arena + 1, arena - 2, 3, ~0ULL, arena - 3 + 1}) {
    RequestFields get{Op::Get, {"k"}, {}, {{0, 16}}, false, word};
    const Answer a = RoundTrip(*client_, id, get);
    EXPECT_EQ(a.status, ErrorCode::kBufferOutOfRange) << "call_word " << word << ": " << a.message;
    EXPECT_NE(a.message.find("call_word"), std::string::npos) << a.message;
    ++id;
  }
  RequestFields exist{Op::Exist, {"k"}, {}, {}, false, 1};
  const Answer a = RoundTrip(*client_, id++, exist);
  EXPECT_EQ(a.status, ErrorCode::kInvalidParams) << a.message;
  // The last word of the arena is a word like any other: the request goes on to the pipeline.
  RequestFields last{Op::Get, {"k"}, {}, {{0, 16}}, false, arena - 4 + 1};
  const Answer b = RoundTrip(*client_, id++, last);
  EXPECT_NE(b.status, ErrorCode::kBufferOutOfRange) << b.message;
  EXPECT_NE(b.status, ErrorCode::kInvalidParams) << b.message;
  ExpectStillServing(id);
}

TEST_F(AgentBadInput, InvalidUtf8SessionIdIsInvalidParamsNamingTheId) {
  RequestFields put{
      Op::Put, {"k0", "k1"}, {"ok", std::string("bad\xC3\x28", 5)}, {{0, 8}, {64, 8}}, true};
  Answer a = RoundTrip(*client_, 9, put);
  EXPECT_EQ(a.status, ErrorCode::kInvalidParams);
  ASSERT_EQ(a.codes.size(), 2u);
  EXPECT_EQ(a.codes[0], ErrorCode::kInvalidParams);  // every key fails, not just the bad one
  EXPECT_NE(a.messages[0].find("session_ids[1]"), std::string::npos) << a.messages[0];
  EXPECT_NE(a.messages[0].find("UTF-8"), std::string::npos);
  ExpectStillServing(10);
}

TEST_F(AgentBadInput, SessionIdOf257BytesIsInvalidParamsAnd256IsAccepted) {
  RequestFields too_long{Op::Put, {"k"}, {std::string(257, 's')}, {{0, 8}}, true};
  Answer a = RoundTrip(*client_, 11, too_long);
  EXPECT_EQ(a.status, ErrorCode::kInvalidParams);
  EXPECT_NE(a.message.find("257 bytes"), std::string::npos) << a.message;
  RequestFields at_limit{Op::Put, {"k"}, {std::string(256, 's')}, {{0, 8}}, true};
  // Valid: it reaches the request pipeline, whose master is unreachable here.
  EXPECT_EQ(RoundTrip(*client_, 12, at_limit).status, ErrorCode::kMasterUnavailable);
}

TEST_F(AgentBadInput, SessionIdCountDifferentFromKeyCountIsInvalidParams) {
  RequestFields put{Op::Put, {"a", "b", "c"}, {"s1", "s2"}, {{0, 8}, {64, 8}, {128, 8}}, true};
  Answer a = RoundTrip(*client_, 13, put);
  EXPECT_EQ(a.status, ErrorCode::kInvalidParams);
  EXPECT_EQ(a.codes.size(), 3u);
  EXPECT_NE(a.message.find("session_ids has 2 entries for 3 keys"), std::string::npos) << a.message;
  RequestFields buffers{Op::Put, {"a", "b"}, {}, {{0, 8}}};
  EXPECT_EQ(RoundTrip(*client_, 14, buffers).status, ErrorCode::kInvalidParams);
}

TEST_F(AgentBadInput, RequestIdDifferentFromTheRingRecordsIsInvalidParams) {
  Answer a = RoundTrip(*client_, 15, Encode(16, RequestFields{}));
  EXPECT_EQ(a.request_id, 15u);
  EXPECT_EQ(a.status, ErrorCode::kInvalidParams);
  EXPECT_NE(a.message.find("request_id 16 differs from the frame's request id 15"),
            std::string::npos)
      << a.message;
}

TEST_F(AgentBadInput, ValidRequestsOtherThanPingGoToTheHandler) {
  RequestFields exist{Op::Exist, {"a", "b"}, {}, {}};
  Answer a = RoundTrip(*client_, 17, exist);
  EXPECT_EQ(a.status, ErrorCode::kMasterUnavailable);
  ASSERT_EQ(a.codes.size(), 2u);
  EXPECT_EQ(a.codes[1], ErrorCode::kMasterUnavailable);
  EXPECT_NE(a.messages[1].find("not reachable"), std::string::npos) << a.messages[1];
}

TEST_F(AgentBadInput, ScribbledRingDisconnectsOnlyThatClient) {
  RawClient other(agent_.socket_path());
  ASSERT_TRUE(other.ok()) << other.error();
  // Claim more published bytes than the ring holds.
  client_->segment().request_ring().control->tail.store(1ULL << 40);
  ipc::RingControl* ctl = client_->segment().request_ring().control;
  ctl->data_seq.fetch_add(1);
  ipc::FutexWake(&ctl->data_seq);
  EXPECT_TRUE(client_->WaitForEof(std::chrono::seconds(20)));
  Answer a = RoundTrip(other, 21, RequestFields{});
  EXPECT_EQ(a.status, ErrorCode::kOk);
  EXPECT_TRUE(agent_.Running());
}

TEST_F(AgentBadInput, ScribbledCompletionHeadDisconnectsOnlyThatClient) {
  RawClient victim(agent_.socket_path(), 1 << 20, 4096);  // small rings fill quickly
  ASSERT_TRUE(victim.ok()) << victim.error();
  // A consumer index ahead of everything the agent ever published: impossible.
  victim.segment().completion_ring().control->head.store(1ULL << 40);
  const std::vector<uint8_t> ping = Encode(1, RequestFields{});
  // Never read completions: once the agent's cached view says the completion ring is full it
  // re-reads the head, finds it impossible and drops the client.
  bool eof = false;
  for (int i = 0; i < 1000 && !eof; ++i) {
    if (!victim.Send(1, ping)) eof = victim.WaitForEof(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(eof || victim.WaitForEof(std::chrono::seconds(20)));
  ExpectStillServing(2);
}

}  // namespace
}  // namespace kvagent::testing

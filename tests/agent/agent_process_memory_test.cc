// A real kvagent and requests whose values are in the client's own memory (Request.memory),
// sent by hand: access is granted only on a matching probe, a client without the grant cannot
// name its memory, and malformed ranges or counts are INVALID_PARAMS naming what is wrong,
// while the agent keeps serving.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agent_process.h"
#include "raw_client.h"

namespace kvagent::testing {
namespace {

using proto::Op;

uint64_t g_probe = 0x0dd5eed5eed0dd01;

uint64_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

struct MemoryRequest {
  Op op = Op::Put;
  std::vector<std::string> keys;
  std::vector<proto::MemoryRange> memory;
  std::vector<uint32_t> counts;
  std::vector<proto::BufferRef> buffers;
  bool with_counts = true;
};

MemoryRequest Make(Op op, std::vector<std::string> keys, std::vector<proto::MemoryRange> memory,
                   std::vector<uint32_t> counts) {
  MemoryRequest r;
  r.op = op;
  r.keys = std::move(keys);
  r.memory = std::move(memory);
  r.counts = std::move(counts);
  return r;
}

std::vector<uint8_t> Encode(uint64_t id, const MemoryRequest& r) {
  flatbuffers::FlatBufferBuilder fbb;
  auto keys = fbb.CreateVectorOfStrings(r.keys);
  auto memory = fbb.CreateVectorOfStructs(r.memory);
  auto counts = fbb.CreateVector(r.counts);
  flatbuffers::Offset<flatbuffers::Vector<const proto::BufferRef*>> buffers;
  if (!r.buffers.empty()) buffers = fbb.CreateVectorOfStructs(r.buffers);
  proto::RequestBuilder b(fbb);
  b.add_request_id(id);
  b.add_op(r.op);
  b.add_keys(keys);
  b.add_memory(memory);
  if (r.with_counts) b.add_memory_counts(counts);
  if (!r.buffers.empty()) b.add_buffers(buffers);
  fbb.Finish(b.Finish());
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

// The request-level status and message of the agent's answer to `r`.
std::pair<ErrorCode, std::string> Ask(RawClient& s, uint64_t request_id, const MemoryRequest& r) {
  std::vector<uint8_t> frame = Encode(request_id, r);
  EXPECT_TRUE(s.Send(request_id, frame));
  uint64_t got_request_id = 0;
  std::vector<uint8_t> bytes;
  if (!s.Receive(&got_request_id, &bytes)) return {ErrorCode::kInternal, "no completion"};
  EXPECT_EQ(got_request_id, request_id);
  const auto* c = flatbuffers::GetRoot<proto::Completion>(bytes.data());
  return {ErrorCodeFromWire(c->status()), c->message() ? c->message()->str() : ""};
}

class AgentProcessMemory : public ::testing::Test {
 protected:
  AgentProcess agent_{DegradedAgentArgs()};  // the checks come first; no master is needed
};

TEST_F(AgentProcessMemory, IsGrantedOnAMatchingProbeOnly) {
  ASSERT_TRUE(agent_.started());
  RawClient granted(agent_.socket_path(), 1 << 20, 0, Address(&g_probe), g_probe);
  ASSERT_TRUE(granted.ok()) << granted.error();
  EXPECT_TRUE(granted.welcome().process_memory());

  RawClient wrong(agent_.socket_path(), 1 << 20, 0, Address(&g_probe), g_probe ^ 1);
  ASSERT_TRUE(wrong.ok()) << wrong.error();
  EXPECT_FALSE(wrong.welcome().process_memory());
  ASSERT_NE(wrong.welcome().process_memory_message(), nullptr);
  EXPECT_NE(wrong.welcome().process_memory_message()->str().find("does not match"),
            std::string::npos);

  RawClient not_asked(agent_.socket_path());
  ASSERT_TRUE(not_asked.ok());
  EXPECT_FALSE(not_asked.welcome().process_memory());
  EXPECT_EQ(not_asked.welcome().process_memory_message(), nullptr);
}

TEST_F(AgentProcessMemory, AClientWithoutTheGrantCannotNameItsMemory) {
  ASSERT_TRUE(agent_.started());
  RawClient s(agent_.socket_path());
  ASSERT_TRUE(s.ok());
  uint8_t value[16] = {};
  auto [code, message] = Ask(s, 1, Make(Op::Put, {"k"}, {{Address(value), 16}}, {1}));
  EXPECT_EQ(code, ErrorCode::kInvalidParams);
  EXPECT_NE(message.find("process memory"), std::string::npos) << message;
}

TEST_F(AgentProcessMemory, MalformedRangesAndCountsAreInvalidParamsAndTheAgentKeepsServing) {
  ASSERT_TRUE(agent_.started());
  RawClient s(agent_.socket_path(), 1 << 20, 0, Address(&g_probe), g_probe);
  ASSERT_TRUE(s.ok() && s.welcome().process_memory());
  uint8_t value[64] = {};
  const proto::MemoryRange good(Address(value), 64);
  struct Case {
    const char* what;
    MemoryRequest request;
    const char* says;
  };
  MemoryRequest no_counts = Make(Op::Put, {"a"}, {good}, {});
  no_counts.with_counts = false;
  MemoryRequest both = Make(Op::Get, {"a"}, {good}, {1});
  both.buffers = {proto::BufferRef(0, 64)};
  const std::vector<Case> cases = {
      {"counts for fewer keys", Make(Op::Put, {"a", "b"}, {good, good}, {1}),
       "memory_counts has 1"},
      {"no counts", no_counts, "memory_counts has 0"},
      {"a key with no range", Make(Op::Put, {"a", "b"}, {good}, {1, 0}), "at least one range"},
      {"counts beyond the ranges", Make(Op::Put, {"a"}, {good}, {2}), "at least one range"},
      {"ranges left over", Make(Op::Put, {"a"}, {good, good}, {1}), "add up to 1"},
      {"a range wrapping around", Make(Op::Put, {"a"}, {{~uint64_t{0} - 8, 64}}, {1}), "wraps"},
      {"an empty value", Make(Op::Put, {"a"}, {{Address(value), 0}}, {1}), "at least 1 byte"},
      // Sizes a put's size arithmetic cannot take (the reserved-write buckets divided by 0).
      {"a value of 2^60 bytes", Make(Op::Put, {"a"}, {{0x1000, uint64_t{1} << 60}}, {1}),
       "at most"},
      {"a get of 2^63 bytes", Make(Op::Get, {"a"}, {{0x1000, uint64_t{1} << 63}}, {1}), "at most"},
      {"both buffers and memory", both, "both"},
      {"memory on an exist", Make(Op::Exist, {"a"}, {good}, {1}), "not used by Exist"},
  };
  uint64_t request_id = 1;
  for (const Case& c : cases) {
    auto [code, message] = Ask(s, request_id++, c.request);
    EXPECT_EQ(code, ErrorCode::kInvalidParams) << c.what << ": " << message;
    EXPECT_NE(message.find(c.says), std::string::npos) << c.what << ": " << message;
  }
  // A well-formed one passes the checks and reaches the pipeline (which has no master here).
  auto [code, message] = Ask(s, request_id++, Make(Op::Put, {"a"}, {good}, {1}));
  EXPECT_EQ(code, ErrorCode::kMasterUnavailable) << message;
  EXPECT_TRUE(agent_.Running());
}

}  // namespace
}  // namespace kvagent::testing

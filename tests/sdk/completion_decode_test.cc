// The SDK reads the agent's completions as untrusted: a completion that answers OK without a
// result per key, or a Get key answered OK with a length its target cannot hold, fails the call
// with INTERNAL instead of handing the caller OK with a length of 0 (an empty value) or one that
// reads past its buffer.
#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "call_codec.h"
#include "kvagent/schemas/agent_generated.h"

namespace kvagent::sdk_detail {
namespace {

struct Built {
  flatbuffers::FlatBufferBuilder fbb;
  std::span<const uint8_t> bytes() const { return {fbb.GetBufferPointer(), fbb.GetSize()}; }
};

// A completion of `status`, with `codes` and `lengths` when given (absent when empty).
void Build(Built& out, ErrorCode status, const std::vector<uint16_t>& codes,
           const std::vector<uint64_t>& lengths) {
  auto& b = out.fbb;
  const auto codes_vec = codes.empty() ? 0 : b.CreateVector(codes).o;
  const auto lengths_vec = lengths.empty() ? 0 : b.CreateVector(lengths).o;
  proto::CompletionBuilder c(b);
  c.add_request_id(7);
  c.add_status(static_cast<uint16_t>(status));
  if (codes_vec) c.add_codes(flatbuffers::Offset<flatbuffers::Vector<uint16_t>>(codes_vec));
  if (lengths_vec) c.add_lengths(flatbuffers::Offset<flatbuffers::Vector<uint64_t>>(lengths_vec));
  b.Finish(c.Finish());
}

TEST(CompletionDecode, AnOkWithoutPerKeyCodesIsInternalNotOkForEveryKey) {
  Built c;
  Build(c, ErrorCode::kOk, {}, {});
  const Reply r = DecodeCompletion(c.bytes(), 2);
  EXPECT_EQ(r.status.code(), ErrorCode::kInternal) << r.status.ToString();
  ASSERT_EQ(r.keys.size(), 2u);
  for (const KeyResult& k : r.keys) EXPECT_EQ(k.code, ErrorCode::kInternal);
}

TEST(CompletionDecode, AFailureWithoutPerKeyCodesStillAppliesToEveryKey) {
  Built c;
  Build(c, ErrorCode::kMasterUnavailable, {}, {});
  const Reply r = DecodeCompletion(c.bytes(), 3);
  EXPECT_EQ(r.status.code(), ErrorCode::kMasterUnavailable);
  ASSERT_EQ(r.keys.size(), 3u);
  for (const KeyResult& k : r.keys) EXPECT_EQ(k.code, ErrorCode::kMasterUnavailable);
}

TEST(CompletionDecode, AGetKeyAnsweredOkWithNoLengthOrMoreThanItsTargetFailsTheCall) {
  const std::vector<uint64_t> capacities = {4096, 4096};
  struct Case {
    std::vector<uint64_t> lengths;
    ErrorCode want;
  };
  const Case cases[] = {
      {{4096, 100}, ErrorCode::kOk},         // both fit
      {{4096, 4097}, ErrorCode::kInternal},  // one byte more than its target holds
      {{}, ErrorCode::kInternal},            // no lengths at all: would read as 0 bytes
      {{0, 10}, ErrorCode::kInternal},       // a value is at least one byte
  };
  for (const Case& t : cases) {
    Built c;
    Build(c, ErrorCode::kOk, {0, 0}, t.lengths);
    Reply r = DecodeCompletion(c.bytes(), 2);
    ASSERT_TRUE(r.status.ok());
    CheckGetLengths(capacities, &r);
    EXPECT_EQ(r.status.code(), t.want) << r.status.ToString();
    ASSERT_EQ(r.keys.size(), 2u);
    EXPECT_EQ(r.keys[1].code, t.want);
  }
  // A key that failed may name the size it needs (BUFFER_OUT_OF_RANGE): not a bug.
  Built c;
  Build(c, ErrorCode::kOk, {0, static_cast<uint16_t>(ErrorCode::kBufferOutOfRange)}, {10, 1 << 20});
  Reply r = DecodeCompletion(c.bytes(), 2);
  CheckGetLengths(capacities, &r);
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.keys[1].code, ErrorCode::kBufferOutOfRange);
  EXPECT_EQ(r.keys[1].length, uint64_t{1} << 20);
}

}  // namespace
}  // namespace kvagent::sdk_detail

#include "kvagent/common/status.h"
#include "kvagent/common/format.h"

#include <gtest/gtest.h>

namespace kvagent {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, ToStringJoinsNameAndMessage) {
  Status s(ErrorCode::kNoSpace, "pool is full; raise --pool-size");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "NO_SPACE: pool is full; raise --pool-size");
}

TEST(StatusTest, EveryCodeHasTheNameSemanticsGivesIt) {
  const char* names[] = {"OK",
                         "INVALID_PARAMS",
                         "OBJECT_NOT_FOUND",
                         "OBJECT_ALREADY_EXISTS",
                         "REPLICA_NOT_READY",
                         "OBJECT_BUSY",
                         "OBJECT_HAS_LEASE",
                         "NO_SPACE",
                         "BUFFER_OUT_OF_RANGE",
                         "TRANSFER_FAILED",
                         "TIMEOUT",
                         "AGENT_UNAVAILABLE",
                         "MASTER_UNAVAILABLE",
                         "INTERNAL",
                         "DATA_CORRUPTED"};
  for (uint16_t wire = 0; wire <= kMaxErrorCode; ++wire) {
    EXPECT_EQ(ErrorCodeName(ErrorCodeFromWire(wire)), names[wire]) << wire;
  }
}

TEST(StatusTest, UnknownWireValueMapsToInternal) {
  EXPECT_EQ(ErrorCodeFromWire(kMaxErrorCode + 1), ErrorCode::kInternal);
  EXPECT_EQ(ErrorCodeFromWire(0xFFFF), ErrorCode::kInternal);
}

TEST(ResultTest, HoldsValueOrError) {
  Result<int> good(42);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 42);
  Result<int> bad(Status(ErrorCode::kTimeout, "agent did not answer within 100 ms"));
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().IsTimeout());
}

TEST(ResultTest, OkStatusWithoutValueBecomesInternal) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInternal);
}

TEST(FormatBytesTest, ReadsLikeAPerson) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(4096), "4.00 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{1} << 30), "1.00 GiB");
  EXPECT_EQ(FormatBytes(3 * (uint64_t{1} << 19)), "1.50 MiB");
}

}  // namespace
}  // namespace kvagent

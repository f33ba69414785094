// What of the RDMA path can be tested without a device: discovery, the choice of TCP with its
// one log line, and the registration rules (pure functions).
#include "kvagent/transfer/rdma_probe.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <limits>

#include "test_support.h"

namespace kvagent::transfer {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

TEST(RdmaProbeTest, NoDeviceLineSaysWhyAndThatTcpIsUsed) {
  RdmaProbe empty;
  EXPECT_EQ(NoRdmaDeviceLine(empty),
            "RDMA: no device found (ibv_get_device_list returned 0); using TCP for the data plane");
  RdmaProbe failed;
  failed.list_errno = ENOSYS;
  EXPECT_EQ(NoRdmaDeviceLine(failed),
            "RDMA: no device found (ibv_get_device_list failed: Function not implemented); "
            "using TCP for the data plane");
}

TEST(RdmaProbeTest, WithoutADeviceAutoModeServesTcpAndSaysSoExactlyOnce) {
  if (ProbeRdmaDevices().found()) GTEST_SKIP() << "this machine has an RDMA device";
  testing::LogCapture log;
  auto pool = NodePool::Create({.size_bytes = 1 << 20, .huge_pages = false});
  ASSERT_TRUE(pool.ok());
  TransferEngineOptions options;
  options.listen_address = "127.0.0.1:0";
  options.transport = TransportMode::kAuto;
  auto engine = TransferEngine::Create(**pool, options);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ((*engine)->scheme(), Scheme::kTcp);
  EXPECT_EQ((*engine)->endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << (*engine)->endpoint();
  const auto lines = log.Matching("RDMA: no device found");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("using TCP for the data plane"), std::string::npos);
  EXPECT_EQ(log.Matching("RDMA").size(), 1u) << "no other RDMA line is printed";
}

TEST(RdmaProbeTest, ForcedRdmaModeWithoutADeviceFailsCreateWithTheReason) {
  if (ProbeRdmaDevices().found()) GTEST_SKIP() << "this machine has an RDMA device";
  auto pool = NodePool::Create({.size_bytes = 1 << 20, .huge_pages = false});
  ASSERT_TRUE(pool.ok());
  TransferEngineOptions options;
  options.listen_address = "127.0.0.1:0";
  options.transport = TransportMode::kRdma;
  auto engine = TransferEngine::Create(**pool, options);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("--data-transport=rdma"), std::string::npos)
      << engine.status().message();
  EXPECT_NE(engine.status().message().find("no device found"), std::string::npos);
}

TEST(RdmaProbeTest, ForcedTcpModeNeverMentionsRdma) {
  testing::LogCapture log;
  testing::Node node = testing::MakeNode(1 << 20);
  EXPECT_EQ(node.engine->scheme(), Scheme::kTcp);
  EXPECT_TRUE(log.Matching("RDMA").empty());
}

TEST(RdmaProbeTest, TransportModeParsesTheThreeNames) {
  EXPECT_EQ(*ParseTransportMode("auto"), TransportMode::kAuto);
  EXPECT_EQ(*ParseTransportMode("tcp"), TransportMode::kTcp);
  EXPECT_EQ(*ParseTransportMode("rdma"), TransportMode::kRdma);
  EXPECT_TRUE(ParseTransportMode("RoCE").status().IsInvalidParams());
  EXPECT_EQ(TransportModeName(TransportMode::kRdma), "rdma");
}

TEST(RdmaRegistrationTest, MemlockLimitMustCoverThePinnedBytes) {
  EXPECT_TRUE(CheckMemlockForRegistration(kGiB, kGiB, false).ok());
  EXPECT_TRUE(CheckMemlockForRegistration(kGiB, kUnlimited, false).ok());
  EXPECT_TRUE(CheckMemlockForRegistration(4 * kGiB, 8 << 20, true).ok()) << "CAP_IPC_LOCK exempts";
  Status short_limit = CheckMemlockForRegistration(2 * kGiB, 8 << 20, false);
  ASSERT_FALSE(short_limit.ok());
  EXPECT_EQ(short_limit.code(), ErrorCode::kInternal);
  EXPECT_NE(short_limit.message().find("2.00 GiB"), std::string::npos) << short_limit.message();
  EXPECT_NE(short_limit.message().find("8.00 MiB"), std::string::npos);
  EXPECT_NE(short_limit.message().find("LimitMEMLOCK=infinity"), std::string::npos);
  EXPECT_NE(short_limit.message().find("--data-transport=tcp"), std::string::npos);
}

TEST(RdmaRegistrationTest, RegionMustFitTheDeviceMaxMrSize) {
  EXPECT_TRUE(CheckRegistrationSize(kGiB, kGiB, "mlx5_0").ok());
  Status too_big = CheckRegistrationSize(2 * kGiB, kGiB, "mlx5_0");
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.message().find("mlx5_0"), std::string::npos);
  EXPECT_NE(too_big.message().find("--pool-size"), std::string::npos);
}

TEST(RdmaRegistrationTest, CurrentLimitsAreReadFromTheProcess) {
  const uint64_t limit = CurrentMemlockLimit();
  EXPECT_GT(limit, 0u);
  // Root in this VM has CAP_IPC_LOCK; anyone else may not. Only the call's sanity is checked.
  if (geteuid() == 0) {
    EXPECT_TRUE(HasCapIpcLock());
  }
}

TEST(RdmaWorkRequestTest, OpsAreSplitAtTheMaxMessageSize) {
  EXPECT_EQ(WorkRequestCount(1, 1 << 20), 1u);
  EXPECT_EQ(WorkRequestCount(1 << 20, 1 << 20), 1u);
  EXPECT_EQ(WorkRequestCount((1 << 20) + 1, 1 << 20), 2u);
  EXPECT_EQ(WorkRequestLength((1 << 20) + 1, 1 << 20, 0), uint64_t{1} << 20);
  EXPECT_EQ(WorkRequestLength((1 << 20) + 1, 1 << 20, 1), 1u);
  EXPECT_EQ(WorkRequestLength((1 << 20) + 1, 1 << 20, 2), 0u);
}

TEST(RdmaWorkRequestTest, MessagesAreCappedAtOneGibEvenWhenThePortAllowsMore) {
  const uint64_t two_gib_and_a_byte = 2 * kGiB + 1;
  EXPECT_EQ(WorkRequestCount(two_gib_and_a_byte, 0), 3u);
  EXPECT_EQ(WorkRequestCount(two_gib_and_a_byte, uint64_t{1} << 31), 3u);
  EXPECT_EQ(WorkRequestLength(two_gib_and_a_byte, 0, 2), 1u);
  uint64_t total = 0;
  for (uint64_t i = 0; i < 3; ++i) total += WorkRequestLength(two_gib_and_a_byte, 0, i);
  EXPECT_EQ(total, two_gib_and_a_byte);
}

}  // namespace
}  // namespace kvagent::transfer

// Bytes damaged on the way between agents (a bad NIC or switch memory; TCP's 16-bit checksum
// lets some through): the peer checks a write's bytes against the CRC the writer sent with them
// and refuses a replica that arrived different, so a put acknowledged with N replicas has N
// replicas that hold its bytes, and none lands on another value's space.
#include <gtest/gtest.h>
#include <signal.h>

#include "integrity_support.h"
#include "tcp_proxy.h"

namespace kvagent::testing {
namespace {

// kvmaster and agents A and B; B's data port is reached through `path` (B advertises 127.0.0.2,
// where the proxy listens), so whatever peers send B, and B answers them, can be damaged.
class WireCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(master.started());
    ASSERT_TRUE(path.ok());
    a = std::make_unique<NodeAgent>(Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0"}));
    b = std::make_unique<NodeAgent>(
        Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:" + std::to_string(b_port),
                                    "--data-advertise-host", "127.0.0.2"}));
    ASSERT_TRUE(a->started() && b->started());
    ca = a->Connect();
    cb = b->Connect();
    ASSERT_TRUE(ca && cb);
    ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == 2; }));
  }

  KvmasterProcess master{{"--agent-ttl-ms", "60000"}};
  const uint16_t b_port = FreePort();
  TcpProxy path{"127.0.0.2", b_port, b_port};
  std::unique_ptr<NodeAgent> a, b;
  std::unique_ptr<Client> ca, cb;
};

// Agent A writes keys with two replicas: its own, and one on agent B, whose data port is
// reached through a proxy that damages one byte of the first writes on their way. Then A is
// killed: every key A was told has two replicas must read back from B with its bytes.
TEST_F(WireCorruption, AReplicaDamagedOnTheWayIsNotCountedAndEveryAcknowledgedOneReadsBack) {
  constexpr int kKeys = 200, kFlips = 20;
  path.FlipToServer(kFlips);
  std::vector<std::string> keys, values;
  std::vector<uint32_t> replicas;
  int one = 0;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back("w" + std::to_string(i));
    values.push_back(Pattern(keys.back(), 4096));
    const KeyResult put = PutValue(*ca, keys.back(), values.back(), 2);
    ASSERT_EQ(put.code, ErrorCode::kOk) << put.message;  // A's own replica is always written
    replicas.push_back(put.replicas);
    one += put.replicas == 1;
  }
  EXPECT_EQ(path.flipped(), kFlips);
  // Each damaged write was refused (its payload failed its CRC, or its header did and closed the
  // connection): the put said so.
  EXPECT_EQ(one, kFlips);
  const Reply bst = cb->Stat();
  EXPECT_EQ(CounterOf(bst, "agent.data.served_corrupted") +
                CounterOf(bst, "agent.data.served_dropped_connections"),
            static_cast<uint64_t>(kFlips));
  a->Kill();
  int ok_right = 0, ok_wrong = 0, lost_acknowledged = 0;
  for (int i = 0; i < kKeys; ++i) {
    const Read r = GetValue(*cb, keys[i], 4096);
    if (r.code == ErrorCode::kOk) {
      (r.bytes == values[i] ? ok_right : ok_wrong) += 1;
    } else if (replicas[i] == 2) {
      ++lost_acknowledged;
      ADD_FAILURE() << keys[i]
                    << " was acknowledged with 2 replicas, B's fails: " << ErrorCodeName(r.code)
                    << " " << r.message;
    }
  }
  EXPECT_EQ(ok_wrong, 0);
  EXPECT_EQ(lost_acknowledged, 0);
  EXPECT_EQ(ok_right, kKeys - kFlips);
  EXPECT_EQ(CounterOf(cb->Stat(), "agent.checksum_mismatches"), 0u);
}

// Agent B stores keys with one replica, its own; agent A reads them through a proxy that damages
// one byte of some of B's answers on their way. A reads each damaged one again before blaming
// B's replica: every get answers OK with the stored bytes and no replica is dropped (before,
// one damaged answer made the master drop the key's only replica: an acknowledged put lost).
TEST_F(WireCorruption, BytesDamagedOnTheWayFromAPeerBlameNoReplica) {
  constexpr int kKeys = 40, kDamaged = 10;
  std::vector<std::string> keys, values;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back("r" + std::to_string(i));
    values.push_back(Pattern(keys.back(), 4096));
    ASSERT_EQ(PutValue(*cb, keys.back(), values.back()).replicas, 1u);
  }
  int ok_right = 0;
  for (int i = 0; i < kKeys; ++i) {
    if (i % 4 == 0) path.FlipToClient(1);  // the first answer to this get is damaged
    const Read r = GetValue(*ca, keys[i], 4096);
    EXPECT_EQ(r.code, ErrorCode::kOk) << keys[i] << ": " << r.message;
    EXPECT_FALSE(r.code == ErrorCode::kOk && r.bytes != values[i]) << keys[i];
    ok_right += r.code == ErrorCode::kOk && r.bytes == values[i];
  }
  EXPECT_EQ(path.flipped(), kDamaged);
  EXPECT_EQ(ok_right, kKeys);
  const Reply st = ca->Stat();
  EXPECT_EQ(CounterOf(st, "agent.peer_rereads"), static_cast<uint64_t>(kDamaged));
  EXPECT_EQ(CounterOf(st, "agent.checksum_mismatches"), 0u);
  EXPECT_EQ(MasterStat(master.rpc(), "bad_replicas"), 0u);
  for (const std::string& key : keys) EXPECT_TRUE(KeyExists(*cb, key)) << key;
}

}  // namespace
}  // namespace kvagent::testing

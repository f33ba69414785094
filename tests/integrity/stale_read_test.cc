// Reads that must never answer OK with other bytes: placements that outlived the pool they name
// (scenario 1 of the integrity issue), and bytes that changed in a pool (flipped in the agent's
// memory): the checksum taken at put catches them, the bad replica is dropped and the next one
// read, and with no good replica left the key fails with DATA_CORRUPTED.
#include <gtest/gtest.h>
#include <signal.h>

#include <future>

#include "integrity_support.h"

namespace kvagent::testing {
namespace {

Args AgentOf(const KvmasterProcess& master, uint16_t port = 0) {
  return Concat(master.AgentArgs(),
                {"--data-listen", "127.0.0.1:" + std::to_string(port), "--master-ready-wait-ms",
                 "0", "--data-peer-timeout-ms", "2000"});
}

// Agent A stores keys; agent B reads them. B's BatchGet is answered with placements in A's pool
// while A is restarted on the same run dir and data port (kvmaster is stopped meanwhile, and
// A's new process has not registered: the master still names A's old pool). B's reads reach A's
// new, empty pool: they must fail, never return its bytes (zeros, on the old code) with OK.
TEST(StaleRead, PlacementsIssuedBeforeAnAgentRestartNeverReadItsNewPool) {
  KvmasterProcess master({"--agent-ttl-ms", "60000"});
  ASSERT_TRUE(master.started());
  const uint16_t a_port = FreePort();
  NodeAgent a(AgentOf(master, a_port));
  NodeAgent b(AgentOf(master));
  ASSERT_TRUE(a.started() && b.started());
  auto ca = a.Connect();
  auto cb = b.Connect();
  ASSERT_TRUE(ca && cb);
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == 2; }));
  constexpr int kKeys = 200;
  std::vector<std::string> keys, values;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back("k" + std::to_string(i));
    values.push_back(Pattern(keys.back(), 4096));
    ASSERT_EQ(PutValue(*ca, keys.back(), values.back()).code, ErrorCode::kOk);
  }
  master.Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntil([&] { return IsStopped(master.pid()); }));
  // B asks for every key at once; the request waits in the stopped master.
  auto reads = std::async(std::launch::async, [&] {
    std::vector<ArenaBuffer> buffers;
    std::vector<const ArenaBuffer*> targets;
    for (int i = 0; i < kKeys; ++i) buffers.push_back(cb->Allocate(4096).value());
    for (auto& buf : buffers) targets.push_back(&buf);
    Reply r = cb->Get(keys, targets);
    std::vector<Read> out(kKeys);
    for (int i = 0; i < kKeys && i < static_cast<int>(r.keys.size()); ++i) {
      out[i].code = r.keys[i].code;
      out[i].message = r.keys[i].message;
      if (out[i].code == ErrorCode::kOk) {
        out[i].bytes.assign(reinterpret_cast<const char*>(buffers[i].data()), r.keys[i].length);
      }
    }
    return out;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // B's BatchGet reached it
  // A restarts on its run dir and data port; its master link cannot register (no master there).
  ASSERT_TRUE(a.Restart({"--master", "tcp://127.0.0.1:1", "--master-events", "tcp://127.0.0.1:1",
                         "--master-events-replay", "tcp://127.0.0.1:1"}));
  master.Signal(SIGCONT);
  const std::vector<Read> got = reads.get();
  int ok_right = 0, ok_wrong = 0, refused = 0;
  for (int i = 0; i < kKeys; ++i) {
    if (got[i].code != ErrorCode::kOk) {
      if (got[i].message.find("restarted") != std::string::npos) ++refused;
      continue;
    }
    (got[i].bytes == values[i] ? ok_right : ok_wrong) += 1;
  }
  EXPECT_EQ(ok_wrong, 0) << "gets answered OK with bytes of A's new pool";
  EXPECT_EQ(ok_right, 0);  // A's old pool is gone with its process
  EXPECT_EQ(refused, kKeys) << got[0].message;
}

// The agent that answers a get verifies every part against the checksum taken when the value
// was stored. Bytes flipped in a replica (in the pool's memory, as a bad DIMM or a stray write
// would) are caught: the replica is dropped and the other read; with none left, DATA_CORRUPTED.
TEST(StaleRead, BytesFlippedInAPoolAreCaughtAndTheReplicaDropped) {
  if (geteuid() != 0) GTEST_SKIP() << "writes another process's memory: needs root (CI is root)";
  KvmasterProcess master({"--agent-ttl-ms", "60000"});
  ASSERT_TRUE(master.started());
  NodeAgent a(AgentOf(master));
  NodeAgent b(AgentOf(master));
  ASSERT_TRUE(a.started() && b.started());
  auto ca = a.Connect();
  ASSERT_TRUE(ca);
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == 2; }));
  const std::string two = Pattern("two", 1 << 20), one = Pattern("one", 64 << 10);
  // "big" may be copied into and out of A's pool in chunks by several threads (--copy-threads,
  // when one thread would be slow): its flipped bytes lie in its last chunk.
  const std::string big = Pattern("big", 1 << 20);
  ASSERT_EQ(PutValue(*ca, "two", two, 2).replicas, 2u);
  ASSERT_EQ(PutValue(*ca, "one", one, 1).replicas, 1u);
  ASSERT_EQ(PutValue(*ca, "big", big, 1).replicas, 1u);
  const uint64_t pool = MappingOfSize(a.pid(), NodeAgent::kPoolBytes);
  ASSERT_NE(pool, 0u) << "A's node pool mapping not found";
  // A's own pool: the one "one" is in (the writer's pool comes first).
  const auto one_at = PlacementsOf(master.rpc(), "one");
  ASSERT_EQ(one_at.size(), 1u);
  const uint32_t a_pool = one_at[0].pool_id;
  uint64_t two_offset = 0;
  for (const Placed& p : PlacementsOf(master.rpc(), "two")) {
    if (p.pool_id == a_pool) two_offset = p.offset;
  }
  // Sanity: the test reads A's pool where the master says the bytes are.
  ASSERT_EQ(PeekMemory(a.pid(), pool + one_at[0].offset, 64), one.substr(0, 64));
  const char flip[4] = {'\x5a', '\x5a', '\x5a', '\x5a'};
  ASSERT_TRUE(PokeMemory(a.pid(), pool + two_offset + 777, flip, sizeof(flip)));
  ASSERT_TRUE(PokeMemory(a.pid(), pool + one_at[0].offset + 60000, flip, sizeof(flip)));
  const auto big_at = PlacementsOf(master.rpc(), "big");
  ASSERT_EQ(big_at.size(), 1u);
  ASSERT_EQ(big_at[0].pool_id, a_pool);
  ASSERT_TRUE(PokeMemory(a.pid(), pool + big_at[0].offset + (1 << 20) - 5000, flip, sizeof(flip)));

  // "two": A's copy is corrupt, B's is good: OK with the stored bytes, from B.
  Read r = GetValue(*ca, "two", 1 << 20);
  EXPECT_EQ(r.code, ErrorCode::kOk) << r.message;
  EXPECT_TRUE(r.bytes == two);
  // "one": its only replica is corrupt.
  r = GetValue(*ca, "one", 64 << 10);
  EXPECT_EQ(r.code, ErrorCode::kDataCorrupted) << r.message;
  r = GetValue(*ca, "big", 1 << 20);
  EXPECT_EQ(r.code, ErrorCode::kDataCorrupted) << r.message;
  Reply st = ca->Stat();
  EXPECT_EQ(CounterOf(st, "agent.checksum_mismatches"), 3u);
  EXPECT_EQ(CounterOf(st, "agent.corrupted_keys"), 2u);
  // The master dropped the corrupt replicas: "two" lives on in B only, "one" and "big" are gone.
  EXPECT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "bad_replicas") == 3; }));
  EXPECT_EQ(PlacementsOf(master.rpc(), "two").size(), 1u);
  EXPECT_FALSE(KeyExists(*ca, "one"));
  EXPECT_FALSE(KeyExists(*ca, "big"));
  r = GetValue(*ca, "two", 1 << 20);
  EXPECT_TRUE(r.code == ErrorCode::kOk && r.bytes == two);
}

}  // namespace
}  // namespace kvagent::testing

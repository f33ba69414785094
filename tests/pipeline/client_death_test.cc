// Clients that die with puts in flight: nothing partial becomes readable, their writes are
// revoked, the agent leaks neither shared memory nor descriptors, and other clients go on.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "pipeline_support.h"
#include "test_client_process.h"

namespace kvagent::testing {
namespace {

// Every key PREFIX-i is either absent or holds exactly its Pattern bytes.
void ExpectNothingPartial(Client& c, const std::string& prefix, size_t size, int count,
                          int* complete) {
  auto buffer = c.Allocate(size);
  ASSERT_TRUE(buffer.ok());
  *complete = 0;
  for (int i = 0; i < count; ++i) {
    const std::string key = prefix + "-" + std::to_string(i);
    std::vector<std::string> keys = {key};
    std::vector<const ArenaBuffer*> targets = {&*buffer};
    Reply r = c.Get(keys, targets);
    ASSERT_EQ(r.keys.size(), 1u);
    if (r.keys[0].code == ErrorCode::kObjectNotFound) continue;
    ASSERT_EQ(r.keys[0].code, ErrorCode::kOk) << key << ": " << r.keys[0].message;
    ASSERT_EQ(r.keys[0].length, size) << key;
    const std::string want = Pattern(key, size);
    ASSERT_EQ(std::memcmp(buffer->data(), want.data(), size), 0) << key << " holds other bytes";
    ++*complete;
  }
}

TEST(ClientDeath, ClientKilledDuringLargePutsLeavesNoPartialObjectNoLeakAndOthersGoOn) {
  AgentProcess agent({"--pool-size", "256MiB"});
  ASSERT_TRUE(agent.started());
  auto other = Connect(agent);
  ASSERT_TRUE(other);
  // Answered once the agent serves it, which is after it closed its copy of the segment's
  // descriptor: the count below is stable.
  ASSERT_TRUE(other->Ping().ok());
  const int base_fds = CountFds(agent.pid());
  constexpr size_t kSize = 1 << 20;
  for (int round = 0; round < 3; ++round) {
    const std::string prefix = "victim" + std::to_string(round);
    int out = -1;
    ProcessGuard victim(
        SpawnTestClient({"put-loop", agent.run_dir(), prefix, std::to_string(kSize)}, &out));
    ASSERT_GT(victim.pid(), 0);
    ASSERT_EQ(ReadLine(out), "ready");
    close(out);
    // The other client keeps working while the victim writes and dies.
    const std::string mine = Pattern("other-" + std::to_string(round), 50000);
    std::vector<std::string> keys = {"other-" + std::to_string(round)};
    std::vector<Value> values = {Value(std::string_view(mine))};
    EXPECT_EQ(other->Put(keys, values).keys.at(0).code, ErrorCode::kOk);
    victim.Kill();
    EXPECT_TRUE(WaitUntil([&] { return CountFds(agent.pid()) == base_fds; }))
        << "agent fds " << CountFds(agent.pid()) << ", before the victim " << base_fds;
    EXPECT_EQ(CountShm(agent.pid()), 0);
    int complete = 0;
    ExpectNothingPartial(*other, prefix, kSize, 1024, &complete);
    // It printed "ready" after its first four puts (unless eviction made room since).
    EXPECT_GE(complete + CounterOf(other->Stat(), "master.evictions"), 4u);
    CallOptions force;
    force.force = true;
    EXPECT_TRUE(other->RemoveAll(force).ok());
  }
}

// Deterministic revocation: the victim's puts each need a replica on a peer that is stopped,
// so they are between WriteStart and End when the victim dies.
TEST(ClientDeath, PutsOfAClientThatDiedBeforeTheirEndAreRevoked) {
  KvmasterProcess master({"--agent-ttl-ms", "60000"});
  ASSERT_TRUE(master.started());
  AgentProcess writer(Concat(master.AgentArgs(),
                             {"--data-listen", "127.0.0.1:0", "--data-peer-timeout-ms", "60000"}));
  ASSERT_TRUE(writer.started());
  AgentProcess peer(Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0"}));
  ASSERT_TRUE(peer.started());
  auto observer = Connect(writer);
  ASSERT_TRUE(observer);
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(observer->Stat(), "master.pools") == 2; }));
  peer.Signal(SIGSTOP);  // its data server accepts nothing more: replicas to it wait
  ASSERT_TRUE(WaitUntil([&] { return IsStopped(peer.pid()); }));

  int out = -1;
  ProcessGuard victim(
      SpawnTestClient({"put-async", writer.run_dir(), "doomed", "65536", "5", "2"}, &out));
  ASSERT_EQ(ReadLine(out), "submitted");
  close(out);
  // Every put has been handed to the pipeline and its local replica copied.
  ASSERT_TRUE(WaitUntil([&] {
    const Reply st = observer->Stat();
    return CounterOf(st, "agent.requests.put") == 5 &&
           CounterOf(st, "agent.bytes_to_pool") == 5 * 65536;
  }));
  victim.Kill();
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(observer->Stat(), "agent.clients") == 1; }));
  peer.Signal(SIGCONT);  // the replicas arrive, but their writer is gone: revoke, not end
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(observer->Stat(), "agent.revoked_keys") == 5; }));
  for (int i = 0; i < 5; ++i) {
    std::vector<std::string> keys = {"doomed-" + std::to_string(i)};
    EXPECT_FALSE(observer->Exist(keys).keys.at(0).exists) << keys[0];
  }
  const Reply st = observer->Stat();
  EXPECT_EQ(CounterOf(st, "master.writes_in_flight"), 0u);
  EXPECT_EQ(CounterOf(st, "agent.abandoned_requests"), 5u);
  EXPECT_EQ(CountShm(writer.pid()), 0);
}

}  // namespace
}  // namespace kvagent::testing

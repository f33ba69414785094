// Liveness without data loss (scenario 6 of the integrity issue): a master that stalls does not
// blame its agents for its own silence; an agent cut off from its master past the TTL (stopped,
// or behind a network partition between namespaces) is only suspect, and keeps every object when
// it comes back with the same incarnation.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <fstream>

#include "integrity_support.h"
#include "netns_pair.h"

namespace kvagent::testing {
namespace {

std::vector<std::string> PutMany(Client& c, const std::string& prefix, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) {
    keys.push_back(prefix + std::to_string(i));
    EXPECT_EQ(PutValue(c, keys.back(), Pattern(keys.back(), 1024)).code, ErrorCode::kOk);
  }
  return keys;
}

size_t ReadableWithTheirBytes(Client& c, const std::vector<std::string>& keys) {
  size_t n = 0;
  for (const auto& k : keys) {
    const Read r = GetValue(c, k, 1024);
    if (r.code == ErrorCode::kOk && r.bytes == Pattern(k, 1024)) ++n;
  }
  return n;
}

// kvmaster stopped three times its agents' TTL, longer than their dead timeout (on the old code
// it then dropped every healthy agent with all their objects).
TEST(Liveness, AMasterStallIsNotCountedAsItsAgentsSilence) {
  KvmasterProcess master({"--agent-ttl-ms", "1000", "--agent-dead-ms", "2000", "--tick-ms", "20"});
  ASSERT_TRUE(master.started());
  NodeAgent a(
      Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0", "--heartbeat-ms", "200"}));
  NodeAgent b(
      Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0", "--heartbeat-ms", "200"}));
  ASSERT_TRUE(a.started() && b.started());
  auto ca = a.Connect();
  auto cb = b.Connect();
  ASSERT_TRUE(ca && cb);
  const auto keys_a = PutMany(*ca, "a", 300);
  const auto keys_b = PutMany(*cb, "b", 300);
  master.Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntil([&] { return IsStopped(master.pid()); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  master.Signal(SIGCONT);
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "stalls_forgiven") >= 1; }));
  // A few heartbeat rounds later: nobody was dropped, nothing lost.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto st = MasterStats(master.rpc());
  ASSERT_TRUE(st);
  EXPECT_EQ((*st)["expired_agents"], 0u);
  EXPECT_EQ((*st)["agents_suspected"], 0u);
  EXPECT_EQ((*st)["keys"], 600u);
  EXPECT_EQ(ReadableWithTheirBytes(*ca, keys_a) + ReadableWithTheirBytes(*ca, keys_b), 600u);
}

// An agent silent past the TTL (stopped) becomes suspect: its objects stay, no new replica goes
// to it; when it resumes with the same incarnation it is trusted again with everything.
TEST(Liveness, AnAgentSilentPastItsTtlKeepsItsObjectsWhenItComesBack) {
  KvmasterProcess master({"--agent-ttl-ms", "500", "--agent-dead-ms", "60000", "--tick-ms", "20"});
  ASSERT_TRUE(master.started());
  NodeAgent a(
      Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0", "--heartbeat-ms", "100"}));
  NodeAgent b(
      Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0", "--heartbeat-ms", "100"}));
  ASSERT_TRUE(a.started() && b.started());
  auto ca = a.Connect();
  auto cb = b.Connect();
  ASSERT_TRUE(ca && cb);
  const auto keys = PutMany(*ca, "a", 200);
  a.Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "suspect_agents") == 1; }));
  // While A is suspect, new values go to B only, and A's objects are still listed.
  std::vector<std::string> one = {"while-away"};
  std::string bytes = Pattern("while-away", 1024);
  std::vector<Value> values = {Value(std::string_view(bytes))};
  CallOptions two;
  two.write.replica_count = 2;
  Reply put = cb->Put(one, values, two);
  ASSERT_EQ(put.keys.size(), 1u);
  EXPECT_EQ(put.keys[0].code, ErrorCode::kOk) << put.keys[0].message;
  EXPECT_EQ(put.keys[0].replicas, 1u);
  EXPECT_EQ(MasterStat(master.rpc(), "keys"), 201u);
  a.Signal(SIGCONT);
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "suspect_agents") == 0; }));
  EXPECT_EQ(MasterStat(master.rpc(), "expired_agents"), 0u);
  EXPECT_EQ(ReadableWithTheirBytes(*cb, keys), 200u);
}

// The same across a real partition: the master in one network namespace, the agent in another,
// the link between them down for several TTLs, then up (on the old code every acknowledged
// object of the agent was gone, though the agent and its memory survived).
TEST(Liveness, AnAgentPartitionedFromItsMasterKeepsItsObjectsAfterTheHeal) {
  if (!CanUseNetns()) GTEST_SKIP() << "needs root and `ip netns` (CI is root)";
  NamespacePair net;
  ASSERT_TRUE(net.ok());
  TempDir dir;
  const std::string ready = dir.path() + "/ready";
  const std::string rpc = "tcp://" + net.address_a() + ":50051";
  // Across hosts the planes need the cluster secret (kvmaster refuses such addresses without).
  const std::string secret = dir.path() + "/cluster-secret";
  std::ofstream(secret) << "the liveness test's cluster secret, 32+ bytes\n";
  chmod(secret.c_str(), 0600);
  ProcessGuard master;
  {
    auto argv =
        NamespacePair::In(net.a(), {KVMASTER_BINARY, "--listen", rpc, "--events",
                                    "tcp://" + net.address_a() + ":5557", "--events-replay",
                                    "tcp://" + net.address_a() + ":5558", "--ready-file", ready,
                                    "--agent-ttl-ms", "1000", "--agent-dead-ms", "60000",
                                    "--tick-ms", "20", "--cluster-secret-file", secret});
    master.Reset(SpawnQuiet(std::move(argv)));
  }
  ASSERT_TRUE(WaitUntil([&] { return access(ready.c_str(), F_OK) == 0; }));
  // The agent runs in the other namespace; its client reaches it over the run dir's socket.
  NodeAgent agent({"--master", rpc, "--master-events", "tcp://" + net.address_a() + ":5557",
                   "--master-events-replay", "tcp://" + net.address_a() + ":5558", "--data-listen",
                   net.address_b() + ":0", "--heartbeat-ms", "200", "--master-timeout-ms", "1000",
                   "--master-ready-wait-ms", "5000", "--cluster-secret-file", secret},
                  NamespacePair::In(net.b(), {}));
  ASSERT_TRUE(agent.started());
  auto c = agent.Connect();
  ASSERT_TRUE(c);
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.master_link.ready") == 1; }));
  const auto keys = PutMany(*c, "k", 200);

  ASSERT_TRUE(net.Cut());
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.master_link.ready") == 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // over three TTLs
  ASSERT_TRUE(net.Heal());
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.master_link.ready") == 1; }));
  Reply st = c->Stat();
  EXPECT_EQ(CounterOf(st, "master.expired_agents"), 0u);
  EXPECT_GE(CounterOf(st, "master.keys"), 200u);
  EXPECT_EQ(ReadableWithTheirBytes(*c, keys), 200u);
}

}  // namespace
}  // namespace kvagent::testing

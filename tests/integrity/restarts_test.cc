// Replicas that outlive restarts around them: a value with two replicas keeps the one on the
// agent that survives when the other agent is killed and restarted, across a kvmaster restart on
// its state dir; values written to a restarted agent's new pool survive the next restarts; a
// second agent under a running agent's name is refused; and two agents under one name and agent
// key do not drop each other's objects in turn, also across a kvmaster restart.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "integrity_support.h"

namespace kvagent::testing {
namespace {

// How many of `keys` `c` reads back with their bytes (4 KiB values).
size_t ReadBack(Client& c, const std::vector<std::string>& keys) {
  size_t n = 0;
  for (const auto& k : keys) {
    const Read r = GetValue(c, k, 4096);
    n += r.code == ErrorCode::kOk && r.bytes == Pattern(k, 4096);
  }
  return n;
}

// Puts 200 keys `prefix`0.. of 4 KiB through `c`, each of which must get two replicas.
void PutWithTwoReplicas(Client& c, const std::string& prefix, std::vector<std::string>* keys) {
  for (int i = 0; i < 200; ++i) {
    keys->push_back(prefix + std::to_string(i));
    const KeyResult r = PutValue(c, keys->back(), Pattern(keys->back(), 4096), 2);
    ASSERT_EQ(r.code, ErrorCode::kOk) << r.message;
    ASSERT_EQ(r.replicas, 2u);
  }
}

TEST(Restarts, AReplicaOnTheSurvivingAgentOutlivesAgentAndMasterRestarts) {
  TempDir state;
  KvmasterProcess master({"--state-dir", state.path(), "--agent-ttl-ms", "1000", "--agent-dead-ms",
                          "6000", "--tick-ms", "20"});
  ASSERT_TRUE(master.started());
  const uint16_t pa = FreePort(), pb = FreePort();
  NodeAgent a(Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:" + std::to_string(pa),
                                          "--heartbeat-ms", "200"}));
  NodeAgent b(Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:" + std::to_string(pb),
                                          "--heartbeat-ms", "200"}));
  ASSERT_TRUE(a.started() && b.started());
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == 2; }));
  auto ca = a.Connect();
  std::vector<std::string> keys;
  ASSERT_NO_FATAL_FAILURE(PutWithTwoReplicas(*ca, "k", &keys));
  ca.reset();
  ASSERT_TRUE(a.Restart());
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == 2; }));
  auto cb = b.Connect();
  EXPECT_EQ(ReadBack(*cb, keys), 200u);
  ASSERT_TRUE(master.Restart());
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_EQ(ReadBack(*cb, keys), 200u);
  // Keys written after A's restart (replicas on B and on A's new pool), a master restart, then B
  // killed: every key must read from A's new pool.
  std::vector<std::string> later;
  ASSERT_NO_FATAL_FAILURE(PutWithTwoReplicas(*cb, "later", &later));
  ASSERT_TRUE(master.Restart());
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == 2; }));
  cb.reset();
  ASSERT_TRUE(b.Restart());
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto ca2 = a.Connect();
  EXPECT_EQ(ReadBack(*ca2, later), 200u);
}

// Two running agents under one --agent-name (two hosts given one name): each has its own agent
// key (its run dir's agent.key), so kvmaster refuses the second while the first runs, and the
// first keeps its name and its objects. Before the key was kept, the second replaced the first
// (dropping its objects) as if it were its restart.
TEST(Restarts, ASecondAgentUnderARunningAgentsNameIsRefused) {
  KvmasterProcess master({"--tick-ms", "20"});
  ASSERT_TRUE(master.started());
  const Args twin = {"--agent-name", "twin", "--heartbeat-ms", "100"};
  NodeAgent a(Concat(master.AgentArgs(), twin));
  ASSERT_TRUE(a.started());
  auto ca = a.Connect();
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(ca->Stat(), "agent.master_link.ready") == 1; }));
  std::vector<std::string> keys;
  for (int i = 0; i < 50; ++i) {
    keys.push_back("first-" + std::to_string(i));
    const KeyResult r = PutValue(*ca, keys.back(), Pattern(keys.back(), 4096));
    ASSERT_EQ(r.code, ErrorCode::kOk) << r.message;
  }
  NodeAgent b(Concat(master.AgentArgs(), twin));
  ASSERT_TRUE(b.started());
  auto cb = b.Connect();
  std::string why;
  ASSERT_TRUE(WaitUntil([&] {
    CounterOf(cb->Stat(), "agent.master_link", &why);
    return why.find("is held by a running agent") != std::string::npos;
  })) << why;
  EXPECT_NE(why.find("refused to register this agent: agent name \"twin\""), std::string::npos)
      << why;
  EXPECT_NE(why.find("--agent-name"), std::string::npos) << why;
  // Twenty heartbeats of the first, and as many attempts of the second.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(CounterOf(cb->Stat(), "agent.master_link.ready"), 0u);
  EXPECT_EQ(ReadBack(*ca, keys), keys.size());
  EXPECT_EQ(MasterStat(master.rpc(), "agents"), 1u);
  EXPECT_GE(MasterStat(master.rpc(), "name_conflicts"), 1u);
  cb.reset();
  b.Kill();
  EXPECT_EQ(ReadBack(*ca, keys), keys.size());
}

// Two running agents under one name and one agent key (cloned hosts, run dir and all): kvmaster
// cannot tell the second from the first's restart, so it replaces the first, and then refuses
// the first. Before, the first's next heartbeat (unknown) made it register again and drop the
// second's objects, and the second's did the same in turn: every acknowledged object of either
// was lost within a heartbeat. The same holds across a kvmaster restart on its state dir (the
// incarnation a registration replaced is logged with the agent); before, the restarted kvmaster
// took whichever registered second for a restart and dropped the other's objects.
TEST(Restarts, TwoAgentsUnderOneNameAndKeyDoNotDropEachOthersObjectsInTurn) {
  TempDir state;
  KvmasterProcess master({"--tick-ms", "20", "--state-dir", state.path()});
  ASSERT_TRUE(master.started());
  const Args twin = {"--agent-name", "twin", "--heartbeat-ms", "100"};
  NodeAgent a(Concat(master.AgentArgs(), twin));
  ASSERT_TRUE(a.started());
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == 1; }));
  auto ca = a.Connect();
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(ca->Stat(), "agent.master_link.ready") == 1; }));
  NodeAgent b(Concat(master.AgentArgs(), twin));
  b.Kill();  // started once with a key of its own; now the clone's
  std::filesystem::copy_file(a.run_dir() + "/agent.key", b.run_dir() + "/agent.key",
                             std::filesystem::copy_options::overwrite_existing);
  ASSERT_TRUE(b.Start());
  auto cb = b.Connect();
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(cb->Stat(), "agent.master_link.ready") == 1; }));
  std::vector<std::string> keys;
  for (int i = 0; i < 50; ++i) {
    keys.push_back("twin-" + std::to_string(i));
    const KeyResult r = PutValue(*cb, keys.back(), Pattern(keys.back(), 4096));
    ASSERT_EQ(r.code, ErrorCode::kOk) << r.message;
  }
  // Twenty heartbeats of each.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(ReadBack(*cb, keys), keys.size());
  EXPECT_EQ(MasterStat(master.rpc(), "agents"), 1u);
  EXPECT_GE(MasterStat(master.rpc(), "name_conflicts"), 1u);
  // The refused agent says why.
  std::string why;
  EXPECT_EQ(CounterOf(ca->Stat(), "agent.master_link", &why), 0u);
  EXPECT_NE(why.find("refused to register this agent: agent name \"twin\" is taken"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("--agent-name"), std::string::npos) << why;
  // kvmaster restarts: both register again (the refused one after its backoff, up to 5 s), the
  // replaced one is still refused.
  ASSERT_TRUE(master.Restart());
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "name_conflicts") >= 1; }));
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == 1; }));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // ten heartbeats of each
  EXPECT_EQ(ReadBack(*cb, keys), keys.size());
  EXPECT_EQ(MasterStat(master.rpc(), "agents"), 1u);
  EXPECT_EQ(CounterOf(ca->Stat(), "agent.master_link.ready"), 0u);
  EXPECT_EQ(CounterOf(cb->Stat(), "agent.master_link.ready"), 1u);
  // Stopping the replaced one changes nothing for the other.
  ca.reset();
  a.Kill();
  EXPECT_EQ(ReadBack(*cb, keys), keys.size());
}

}  // namespace
}  // namespace kvagent::testing

// The default transport between an agent and kvmaster (--master-transport auto, kvmaster's
// --framed-listen auto): the agent registers on kvmaster's ROUTER, moves to the framed transport
// the reply names, moves again after kvmaster restarts on another framed port, and stays on ZMQ
// (with every op working) where it cannot reach the framed port or kvmaster serves none.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "master_stats.h"
#include "pipeline_support.h"

namespace kvagent::testing {
namespace {

// An agent of `master` with the default transport: --master is kvmaster's ROUTER, nothing else.
Args DefaultAgentArgs(const KvmasterProcess& master, Args extra = {}) {
  return Concat({"--master", master.rpc(), "--master-events", master.events(),
                 "--master-events-replay", master.replay(), "--data-listen", "127.0.0.1:0"},
                extra);
}

// Stores `key` and reads it back: true when the bytes came back as stored.
bool RoundTrips(Client& c, const std::string& key) {
  const std::string value = Pattern(key, 4096);
  std::vector<std::string> keys = {key};
  std::vector<Value> values = {Value(std::string_view(value))};
  Reply put = c.Put(keys, values);
  if (put.keys.size() != 1 || put.keys[0].code != ErrorCode::kOk) return false;
  auto buffer = c.Allocate(value.size());
  if (!buffer.ok()) return false;
  std::vector<const ArenaBuffer*> targets = {&*buffer};
  Reply got = c.Get(keys, targets);
  return got.keys.size() == 1 && got.keys[0].code == ErrorCode::kOk &&
         std::string(reinterpret_cast<const char*>(buffer->data()), got.keys[0].length) == value;
}

TEST(AutoTransport, AnAgentMovesToTheFramedTransportAndBackOntoItAfterTheMasterRestarts) {
  KvmasterProcess master;  // --framed-listen auto: beside --listen, on an OS-picked port
  ASSERT_TRUE(master.started());
  ASSERT_FALSE(master.framed_rpc().empty()) << "kvmaster serves no framed transport by default";
  AgentProcess agent(DefaultAgentArgs(master));
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(RoundTrips(*c, "before"));
  Reply st = c->Stat();
  std::string link;
  EXPECT_EQ(CounterOf(st, "agent.master_link", &link), 1u);
  EXPECT_NE(link.find("framed transport at " + master.framed_rpc()), std::string::npos) << link;
  EXPECT_EQ(CounterOf(st, "agent.master_link.framed"), 1u);
  EXPECT_EQ(CounterOf(st, "agent.master_link.framed_fallbacks"), 0u);
  EXPECT_EQ(MasterStat(master.rpc(), "framed_accepted"), 1u);

  // A new kvmaster on the same ROUTER, events and replay endpoints: its framed port is another.
  const std::string old_framed = master.framed_rpc();
  ASSERT_TRUE(master.Restart());
  ASSERT_NE(master.framed_rpc(), old_framed);
  ASSERT_TRUE(WaitUntil([&] {
    std::string where;
    return CounterOf(c->Stat(), "agent.master_link", &where) == 1 &&
           where.find("framed transport at " + master.framed_rpc()) != std::string::npos;
  })) << "the agent did not move to the restarted kvmaster's framed transport";
  EXPECT_TRUE(RoundTrips(*c, "after"));
  st = c->Stat();
  EXPECT_EQ(CounterOf(st, "agent.master_link.framed"), 1u);
  EXPECT_EQ(CounterOf(st, "agent.master_link.framed_fallbacks"), 0u);
  EXPECT_EQ(MasterStat(master.rpc(), "framed_accepted"), 1u);
}

// On the framed transport the ring service reads the replies to its own calls while it waits for
// them (it spins up to --spin-us after its last work; 100 ms here, so that even a slow build's
// round trip ends within it): the shipped binaries take that path, and every value round-trips.
TEST(AutoTransport, OnTheFramedTransportTheRingServiceTakesTheRepliesToItsCalls) {
  KvmasterProcess master;
  ASSERT_TRUE(master.started());
  AgentProcess agent(DefaultAgentArgs(master, {"--spin-us", "100000"}));
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.master_link.framed") == 1; }));
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(RoundTrips(*c, "taken-" + std::to_string(i))) << i;
  const Reply st = c->Stat();
  EXPECT_GE(CounterOf(st, "agent.master_link.replies_taken_by_service"), 20u)
      << "20 puts and 20 gets, each at least one master call";
  EXPECT_EQ(CounterOf(st, "agent.master_link.link_downs"), 0u);
}

// kvmaster's ROUTER listens on every address, its framed transport on 127.0.0.1 only; the agent
// reaches kvmaster at 127.0.0.2, where the framed port refuses connections (as a firewall or a
// proxy that forwards one port would). Every op works, on ZMQ, and the agent says why once.
TEST(AutoTransport, AnAgentThatCannotReachTheFramedPortStaysOnZmq) {
  KvmasterProcess master({"--insecure-no-auth", "--listen", "tcp://0.0.0.0:0", "--framed-listen",
                          "tcp://127.0.0.1:0"});
  ASSERT_TRUE(master.started());
  ASSERT_FALSE(master.framed_rpc().empty());
  const std::string port = master.rpc().substr(master.rpc().rfind(':') + 1);
  AgentProcess agent(Concat(
      {"--insecure-no-auth", "--master", "tcp://127.0.0.2:" + port, "--master-events",
       master.events(), "--master-events-replay", master.replay(), "--data-listen", "127.0.0.1:0"},
      {}));
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.master_link") == 1; }));
  EXPECT_TRUE(RoundTrips(*c, "on-zmq"));
  const Reply st = c->Stat();
  EXPECT_EQ(CounterOf(st, "agent.master_link.framed"), 0u);
  EXPECT_EQ(CounterOf(st, "agent.master_link.framed_fallbacks"), 1u);
  EXPECT_EQ(MasterStat("tcp://127.0.0.1:" + port, "framed_accepted"), 0u);
}

TEST(AutoTransport, AnAgentOfAMasterWithoutTheFramedTransportUsesZmq) {
  KvmasterProcess master({"--framed-listen", ""});
  ASSERT_TRUE(master.started());
  EXPECT_TRUE(master.framed_rpc().empty());
  AgentProcess agent(DefaultAgentArgs(master));
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  EXPECT_TRUE(RoundTrips(*c, "on-zmq"));
  const Reply st = c->Stat();
  EXPECT_EQ(CounterOf(st, "agent.master_link.framed"), 0u);
  EXPECT_EQ(CounterOf(st, "agent.master_link.framed_fallbacks"), 0u);
  EXPECT_EQ(CounterOf(st, "agent.master_link.replies_taken_by_service"), 0u)
      << "on ZMQ the link thread owns the socket";
}

// --framed-listen auto with --listen ipc://: the framed transport is TCP only, so none.
TEST(AutoTransport, AMasterOnIpcServesNoFramedTransportAndItsAgentsUseZmq) {
  TempDir dir;
  KvmasterProcess master({"--listen", "ipc://" + dir.path() + "/kvmaster.sock"});
  ASSERT_TRUE(master.started());
  EXPECT_TRUE(master.framed_rpc().empty()) << master.framed_rpc();
  AgentProcess agent(DefaultAgentArgs(master));
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  EXPECT_TRUE(RoundTrips(*c, "on-ipc"));
  EXPECT_EQ(CounterOf(c->Stat(), "agent.master_link.framed"), 0u);
}

}  // namespace
}  // namespace kvagent::testing

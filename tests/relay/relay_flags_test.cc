// EventRelayFlags: endpoints derived from the run dir and the master's address.
#include "kvagent/relay/relay_flags.h"

#include <gtest/gtest.h>

namespace kvagent::relay {
namespace {

Result<EventRelayOptions> ParseAndDerive(std::vector<std::string> args, std::string master) {
  EventRelayFlags relay_flags;
  FlagSet flags("kvagent", "test");
  relay_flags.Declare(&flags);
  std::vector<char*> argv = {const_cast<char*>("kvagent")};
  for (std::string& a : args) argv.push_back(a.data());
  Status parsed = flags.Parse(static_cast<int>(argv.size()), argv.data());
  if (!parsed.ok()) return parsed;
  return relay_flags.Options("/run/kvagent", master);
}

TEST(EventRelayFlags, WithoutFlagsTheMasterTellsItsEndpointsAndTheRunDirHoldsTheSockets) {
  auto o = ParseAndDerive({}, "tcp://10.0.0.5:50051");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->master_events, "");  // asked from the master at registration (master_endpoints)
  EXPECT_EQ(o->master_events_replay, "");
  EXPECT_EQ(o->endpoint, "ipc:///run/kvagent/events.sock");
  EXPECT_EQ(o->replay_endpoint, "ipc:///run/kvagent/events-replay.sock");
  EXPECT_TRUE(o->extra_endpoints.empty());
}

TEST(EventRelayFlags, FlagsOverrideTheDefaultsAndEventsTcpIsAnExtraEndpoint) {
  auto o = ParseAndDerive({"--master-events", "tcp://m:7000", "--master-events-replay=tcp://m:7001",
                           "--events-tcp", "tcp://0.0.0.0:5557"},
                          "ipc:///tmp/master.sock");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->master_events, "tcp://m:7000");
  EXPECT_EQ(o->master_events_replay, "tcp://m:7001");
  EXPECT_EQ(o->extra_endpoints, std::vector<std::string>{"tcp://0.0.0.0:5557"});
}

TEST(EventRelayFlags, AMasterEndpointWithoutTcpHostAndPortNamesTheFlagToSet) {
  auto o = ParseAndDerive({"--master-events", "tcp://m:7000"}, "ipc:///tmp/master.sock");
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--master-events-replay"), std::string::npos)
      << o.status().ToString();
}

TEST(EventRelayFlags, OneFlagGivenTheOtherIsTheMastersHostOnItsDefaultPort) {
  auto o = ParseAndDerive({"--master-events", "tcp://m:7000"}, "tcp://10.0.0.5:50051");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->master_events, "tcp://m:7000");
  EXPECT_EQ(o->master_events_replay, "tcp://10.0.0.5:5558");
}

TEST(EventRelayFlags, AWildcardHostTheMasterBoundBecomesTheMastersAddress) {
  EXPECT_EQ(ResolveAdvertised("tcp://0.0.0.0:6000", "tcp://10.0.0.5:50051"), "tcp://10.0.0.5:6000");
  EXPECT_EQ(ResolveAdvertised("tcp://[::]:6000", "tcp://[fd00::5]:50051"), "tcp://[fd00::5]:6000");
  EXPECT_EQ(ResolveAdvertised("tcp://*:6001", "ipc:///run/master.sock"), "tcp://127.0.0.1:6001");
  EXPECT_EQ(ResolveAdvertised("tcp://10.1.1.1:6000", "tcp://10.0.0.5:50051"),
            "tcp://10.1.1.1:6000");
  EXPECT_EQ(ResolveAdvertised("ipc:///run/events.sock", "tcp://10.0.0.5:50051"),
            "ipc:///run/events.sock");
}

TEST(EventRelayFlags, WithPortKeepsIpv6HostsAndRejectsWhatIsNotTcpHostPort) {
  EXPECT_EQ(WithPort("tcp://[::1]:50051", 5557), "tcp://[::1]:5557");
  EXPECT_EQ(WithPort("tcp://master.example:1", 5558), "tcp://master.example:5558");
  EXPECT_FALSE(WithPort("tcp://:50051", 5557));
  EXPECT_FALSE(WithPort("tcp://[::1", 5557));
  EXPECT_FALSE(WithPort("ipc:///run/master.sock", 5557));
  EXPECT_FALSE(WithPort("tcp://hostonly", 5557));
}

}  // namespace
}  // namespace kvagent::relay

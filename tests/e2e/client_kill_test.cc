// A client process SIGKILLed while its large puts are in flight, with other client processes
// working through the same kvagent (standalone, and with a kvmaster process): nothing of the
// victim's is readable in part, none of its writes stays in flight at the master, the agent
// keeps no descriptor, /dev/shm name or mapping of it, and the other clients never see a wrong
// answer.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "e2e_support.h"
#include "test_client_process.h"

namespace kvagent::testing {
namespace {

constexpr size_t kVictimValue = 4 << 20;  // four of these in flight at a time

// How many keys PREFIX-i hold exactly their Pattern bytes; fails the test on any other
// outcome than that or OBJECT_NOT_FOUND. Stops after 64 absent keys in a row past the last one
// found (the victim writes its keys in order, four at a time).
int CountCompleteObjects(Client& c, const std::string& prefix) {
  auto buffer = c.Allocate(kVictimValue);
  EXPECT_TRUE(buffer.ok());
  if (!buffer.ok()) return -1;
  int complete = 0, absent_in_a_row = 0;
  for (int i = 0; absent_in_a_row < 64 && i < 100000; ++i) {
    const std::string key = prefix + "-" + std::to_string(i);
    std::vector<std::string> keys = {key};
    std::vector<const ArenaBuffer*> targets = {&*buffer};
    const Reply r = c.Get(keys, targets);
    EXPECT_EQ(r.keys.size(), 1u) << r.status.ToString();
    if (r.keys.size() != 1) return -1;
    if (r.keys[0].code == ErrorCode::kObjectNotFound) {
      ++absent_in_a_row;
      continue;
    }
    absent_in_a_row = 0;
    EXPECT_EQ(r.keys[0].code, ErrorCode::kOk) << key << ": " << r.keys[0].message;
    EXPECT_EQ(r.keys[0].length, kVictimValue) << key;
    if (r.keys[0].code != ErrorCode::kOk || r.keys[0].length != kVictimValue) continue;
    const std::string want = Pattern(key, kVictimValue);
    EXPECT_EQ(std::memcmp(buffer->data(), want.data(), kVictimValue), 0) << key << " is partial";
    ++complete;
  }
  return complete;
}

class ClientKill : public ::testing::TestWithParam<Mode> {};

TEST_P(ClientKill, ClientSigkilledDuringLargePutsLeavesNothingPartialOrLeakedAndOthersGoOn) {
  Store store(GetParam(), {"--pool-size", "512MiB"});
  ASSERT_TRUE(store.started());
  const pid_t agent = store.agent().pid();
  // Two other engines keep storing and reading back their own values throughout.
  ClientProcess small({"churn", store.run_dir(), "small", "4096"});
  ClientProcess large({"churn", store.run_dir(), "large", std::to_string(1 << 20)});
  ASSERT_EQ(small.ReadLine(), "ready");
  ASSERT_EQ(large.ReadLine(), "ready");
  auto observer = Connect(store.agent());
  ASSERT_TRUE(observer);
  // Answered once the agent handed it to the ring service, which it does after closing its
  // copy of the segment's descriptor: the count below is stable.
  ASSERT_TRUE(observer->Ping().ok());
  const int base_fds = CountFds(agent);
  const int base_mappings = CountSegmentMappings(agent);
  ASSERT_GE(base_mappings, 3);  // the churners' and the observer's segments

  for (int round = 0; round < 3; ++round) {
    const std::string prefix = "victim" + std::to_string(round);
    int out = -1;
    ProcessGuard victim(
        SpawnTestClient({"put-loop", store.run_dir(), prefix, std::to_string(kVictimValue)}, &out));
    ASSERT_GT(victim.pid(), 0);
    ASSERT_EQ(ReadLine(out), "ready");  // its first four puts are in; more are in flight
    close(out);
    victim.Kill();
    EXPECT_TRUE(WaitUntil([&] { return CountFds(agent) == base_fds; }))
        << "agent fds " << CountFds(agent) << ", " << base_fds << " before the victim";
    EXPECT_TRUE(WaitUntil([&] { return CountSegmentMappings(agent) == base_mappings; }))
        << "the agent still maps the victim's segment";
    EXPECT_EQ(CountShm(agent), 0);
    EXPECT_TRUE(WaitUntil([&] {
      return CounterOf(observer->Stat(), "master.writes_in_flight") == 0;
    })) << "a write of the dead client is neither ended nor revoked";
    EXPECT_GE(CountCompleteObjects(*observer, prefix), 4) << prefix;
    // Makes room for the next round (our gets hold leases, hence force); the churners' keys
    // stay theirs.
    ListOptions lo;
    lo.prefix = prefix + "-";
    std::vector<std::string> victims;
    for (const auto& k : observer->List(lo).listed) victims.push_back(k.key);
    CallOptions force;
    force.force = true;
    const Reply removed = observer->Remove(victims, force);
    EXPECT_TRUE(removed.ok()) << removed.status.ToString();
  }
  EXPECT_EQ(CounterOf(observer->Stat(), "master.evictions"), 0u);
  small.CloseInput();
  large.CloseInput();
  EXPECT_EQ(small.Wait(), 0) << "a client that was not killed saw a wrong answer";
  EXPECT_EQ(large.Wait(), 0) << "a client that was not killed saw a wrong answer";
}

INSTANTIATE_TEST_SUITE_P(E2E, ClientKill, ::testing::Values(Mode::kStandalone, Mode::kRemote),
                         ModeName);

}  // namespace
}  // namespace kvagent::testing

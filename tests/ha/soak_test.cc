// The soak run (`make soak`, ctest -L soak; not part of `make test`): the HA fault tests' cluster
// under load through many faults in a row, each on whoever leads at that moment — kill -9 (the
// member is started again), SIGSTOP past the lease then SIGCONT, etcd killed and restarted —
// then every guarantee checked over the whole run. KVAGENT_SOAK_ROUNDS sets the number of faults
// (default 20); KVAGENT_SOAK_SYNC=1 runs it with --sync-followers 1 (and expects no loss).
#include <cstdlib>
#include <random>

#include "failover_fixture.h"

namespace kvagent::testing {
namespace {

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

TEST_F(Failover, SoakOfFaultsInARowKeepsEveryGuarantee) {
  const int rounds = EnvInt("KVAGENT_SOAK_ROUNDS", 20);
  const bool sync = EnvInt("KVAGENT_SOAK_SYNC", 0) != 0;
  ASSERT_NO_FATAL_FAILURE(StartCluster(sync ? Args{"--sync-followers", "1"} : Args{}));
  ASSERT_NO_FATAL_FAILURE(StartLoad());
  std::mt19937 random(static_cast<uint32_t>(rounds) * 7919u);
  const auto first = Clock::now();
  for (int round = 0; round < rounds; ++round) {
    const auto leader = LeaderOf(etcd_endpoint_, kCluster);
    ASSERT_TRUE(leader.has_value()) << "round " << round;
    HaMaster& m = master(leader->record.name);
    const int kind = static_cast<int>(random() % 3);
    Clock::time_point fault;
    if (kind == 0) {
      ASSERT_TRUE(FailOver([&] { m.Kill(); }, &fault)) << "round " << round << m.LogTail();
      m.Start();
    } else if (kind == 1) {
      ASSERT_TRUE(FailOver([&] { m.Signal(SIGSTOP); }, &fault)) << "round " << round;
      m.Signal(SIGCONT);
    } else {
      fault = Clock::now();
      etcd_->Kill();
      std::this_thread::sleep_for(3000ms);
      ASSERT_TRUE(etcd_->Restart()) << "round " << round;
      ASSERT_TRUE(ServingAgainAfter(fault)) << "round " << round;
    }
    // Every member back in the cluster before the next fault (a leader and two followers).
    ASSERT_TRUE(WaitUntil(
        [&] {
          const auto now = LeaderOf(etcd_endpoint_, kCluster);
          if (!now) return false;
          int following = 0;
          for (const char* name : {"m1", "m2", "m3"}) {
            auto r = MemberOf(etcd_endpoint_, kCluster, name);
            following += r && r->role == "follower" && r->epoch == now->epoch;
          }
          return following == 2;
        },
        60s))
        << "round " << round;
    std::printf("soak round %d: %s\n", round,
                kind == 0   ? "kill -9 of the leader"
                : kind == 1 ? "SIGSTOP/SIGCONT of the leader"
                            : "etcd killed and restarted");
  }
  const size_t lost = Verify("soak of " + std::to_string(rounds) + " faults", first);
  if (sync) {
    EXPECT_EQ(lost, 0u);
  }
}

}  // namespace
}  // namespace kvagent::testing

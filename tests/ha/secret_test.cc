// An etcd cluster of kvmasters with a cluster secret (--cluster-secret-file): the followers fetch
// the leader's log as CURVE clients of its RPC socket, agents that find the leader through etcd
// reach it (and its events) as CURVE clients, and after a failover both go on with the new
// leader. A member or an agent holding another secret gets nothing.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "ha_support.h"

namespace kvagent::testing {
namespace {

constexpr const char* kCluster = "sec";

// A secret file (mode 0600) at `path` holding `content`.
std::string WriteSecret(const std::string& path, const std::string& content) {
  std::ofstream(path) << content << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

TEST(HaWithSecret, FollowersAndAgentsAuthenticateAndFollowAFailoverOutsidersGetNothing) {
  ASSERT_TRUE(access(kEtcdBinary, X_OK) == 0) << "etcd-server is not installed (make deps)";
  TempDir dir;
  EtcdProcess etcd(dir.path());
  ASSERT_TRUE(etcd.Start()) << "see " << etcd.log_path();
  const std::string ours =
      WriteSecret(dir.path() + "/ours", "the cluster's own secret: 32 bytes or more, really");
  const std::string other =
      WriteSecret(dir.path() + "/other", "some other cluster's secret, also long enough!!");
  auto leader = [&] { return LeaderOf(etcd.endpoint(), kCluster); };

  // --sync-followers 1: a put is acknowledged only once a follower holds it, so every
  // acknowledged put below proves that m2 fetched the leader's log through CURVE.
  const Args members = {"--cluster-secret-file", ours, "--sync-followers", "1"};
  HaMaster m1("m1", etcd.endpoint(), kCluster, members);
  ASSERT_TRUE(WaitUntil([&] {
    auto l = leader();
    return l && l->record.name == "m1";
  })) << m1.LogTail();
  const uint64_t first = leader()->epoch;
  // m2 and m3 follow (after m1's death one of them follows the other: synchronous replication
  // needs a follower); m4 holds another secret: it must never fetch a record (its status file
  // is written after each fetch).
  HaMaster m2("m2", etcd.endpoint(), kCluster, members);
  HaMaster m3("m3", etcd.endpoint(), kCluster, members);
  const std::string outsider_status = dir.path() + "/m4-status";
  HaMaster m4("m4", etcd.endpoint(), kCluster,
              {"--cluster-secret-file", other, "--status-file", outsider_status});

  Args agent_args = ClusterAgentArgs(etcd.ClusterUrl(kCluster));
  agent_args.insert(agent_args.end(), {"--cluster-secret-file", ours});
  NodeAgent agent(agent_args);
  ASSERT_TRUE(agent.started());
  auto client = ConnectClient(agent, 5000ms);
  ASSERT_TRUE(client);
  Args outsider_args = ClusterAgentArgs(etcd.ClusterUrl(kCluster));
  outsider_args.insert(outsider_args.end(), {"--cluster-secret-file", other});
  NodeAgent outsider(outsider_args);
  ASSERT_TRUE(outsider.started());
  auto outsider_client = ConnectClient(outsider, 5000ms);
  ASSERT_TRUE(outsider_client);

  ASSERT_TRUE(RegisteredWith(*client, first, 20s)) << m1.LogTail();
  const std::string stored = PutPatterned(*client, "sec", 20);
  ASSERT_EQ(stored, "") << m1.LogTail() << m2.LogTail();

  m1.Kill();
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto l = leader();
        return l && l->epoch > first && (l->record.name == "m2" || l->record.name == "m3");
      },
      30s))
      << m2.LogTail() << m3.LogTail() << m4.LogTail();
  const uint64_t second = leader()->epoch;
  ASSERT_TRUE(RegisteredWith(*client, second))
      << "the agent did not register with the new leader" << m2.LogTail() << m3.LogTail();
  EXPECT_EQ(UnreadablePatterned(*client, "sec", 20), std::vector<std::string>{})
      << "not readable from the new leader";
  const Reply st = client->Stat();
  EXPECT_EQ(CounterOf(st, "agent.master_link.epoch"), second);
  std::string phase;
  CounterOf(st, "agent.relay.phase", &phase);
  EXPECT_TRUE(WaitUntil([&] {
    CounterOf(client->Stat(), "agent.relay.phase", &phase);
    return phase == "live";
  })) << "the relay did not follow the new leader's events (CURVE on the events plane)";

  // The outsiders, with the first and the second leader: nothing.
  EXPECT_NE(::access(outsider_status.c_str(), F_OK), 0) << "m4 fetched records with another secret";
  EXPECT_EQ(CounterOf(outsider_client->Stat(), "agent.master_link.ready"), 0u)
      << "an agent with another secret registered";
  EXPECT_NE(PutValue(*outsider_client, "outsider", Pattern("outsider", 100), 1).code,
            ErrorCode::kOk);
}

}  // namespace
}  // namespace kvagent::testing

// kvmaster high availability on an etcd that serves its clients over TLS, asks each for a
// certificate its CA signed (etcd --client-cert-auth) and has its user authentication on, with
// the real binaries: members elect a leader and fail over, an agent finds the leader through
// etcds:// and stores and reads across the failover, and kvctl shows the cluster, all as an etcd
// user allowed /kvagent/ only, and go on after etcd restarted and forgot their tokens. A client
// without a certificate etcd accepts, or with a wrong password, gets nothing from etcd and is
// told why; TLS files given for a plain etcd address stop a binary at start.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "command_run.h"
#include "ha_support.h"
#include "test_pki.h"

namespace kvagent::testing {
namespace {

constexpr const char* kCluster = "tls";

TEST(HaOverTls, MembersAgentsAndKvctlReachEtcdOverTlsAndOthersAreToldWhy) {
  ASSERT_EQ(access(kEtcdBinary, X_OK), 0) << "etcd-server is not installed (make deps)";
  ASSERT_EQ(access(kOpensslBinary, X_OK), 0) << "openssl is not installed (make deps)";
  TempDir dir;
  TestPki pki;
  ASSERT_TRUE(MakeTestPki(dir.path(), &pki)) << "see " << dir.path() << "/openssl.log";
  const coord::EtcdTls tls{true, pki.ca, pki.client_cert, pki.client_key};
  EtcdProcess etcd(dir.path());
  etcd.ServeTls(pki.server_cert, pki.server_key, pki.ca, tls);
  ASSERT_TRUE(etcd.Start()) << "see " << etcd.log_path();
  ASSERT_TRUE(etcd.EnableAuth("kvagent", "kvagent-password", {"/kvagent/"}))
      << "see " << etcd.log_path();
  const coord::EtcdAuth auth{"kvagent", "kvagent-password"};
  const std::string password = dir.path() + "/etcd-password";
  std::ofstream(password) << auth.password << "\n";
  ::chmod(password.c_str(), 0600);
  const std::string wrong_password = dir.path() + "/wrong-password";
  std::ofstream(wrong_password) << "not-the-password\n";
  ::chmod(wrong_password.c_str(), 0600);
  const Args tls_files = {"--etcd-ca-file",  pki.ca,         "--etcd-cert-file", pki.client_cert,
                          "--etcd-key-file", pki.client_key, "--etcd-user",      "kvagent"};
  const Args files = Concat(tls_files, {"--etcd-password-file", password});
  auto leader = [&] { return LeaderOf(etcd.endpoint(), kCluster, tls, auth); };

  // Two members over TLS: one leads, the other follows (its member record is in etcd).
  HaMaster m1("m1", etcd.url(), kCluster, files);
  ASSERT_TRUE(WaitUntil([&] {
    auto l = leader();
    return l && l->record.name == "m1";
  })) << m1.LogTail();
  const uint64_t first = leader()->epoch;
  HaMaster m2("m2", etcd.url(), kCluster, files);
  ASSERT_TRUE(WaitUntil([&] {
    auto m = MemberOf(etcd.endpoint(), kCluster, "m2", tls, auth);
    return m && m->role == "follower";
  })) << m2.LogTail();

  // An agent that finds the leader through etcds://.
  Args agent_args = ClusterAgentArgs(etcd.ClusterUrl(kCluster));
  agent_args.insert(agent_args.end(), files.begin(), files.end());
  NodeAgent agent(agent_args);
  ASSERT_TRUE(agent.started());
  auto client = ConnectClient(agent, 5000ms);
  ASSERT_TRUE(client);
  const std::string stored = PutPatterned(*client, "tls", 20);
  ASSERT_EQ(stored, "") << m1.LogTail();

  // kvctl with the files shows the cluster; without them it is told what to check.
  Args kvctl = {KVCTL_BINARY, "cluster", "--master", etcd.ClusterUrl(kCluster)};
  Args kvctl_tls = kvctl;
  kvctl_tls.insert(kvctl_tls.end(), files.begin(), files.end());
  const CommandOutput shown = RunCommand(kvctl_tls);
  EXPECT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("leader  m1  epoch " + std::to_string(first)), std::string::npos)
      << shown.out;
  EXPECT_NE(shown.out.find("(etcds://"), std::string::npos) << shown.out;
  const CommandOutput refused = RunCommand(kvctl);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("TLS: "), std::string::npos) << refused.err;

  // The leader dies: m2 takes over through etcd over TLS, the agent follows it there.
  m1.Kill();
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto l = leader();
        return l && l->epoch > first && l->record.name == "m2";
      },
      30s))
      << m2.LogTail();
  const uint64_t second = leader()->epoch;
  ASSERT_TRUE(RegisteredWith(*client, second))
      << "the agent did not follow the leader over etcd with TLS" << m2.LogTail();
  EXPECT_EQ(UnreadablePatterned(*client, "tls", 20), std::vector<std::string>{})
      << "not readable from the new leader";

  // An agent with the CA but no client certificate: etcd refuses it; it serves degraded and its
  // puts say why.
  Args no_cert = ClusterAgentArgs(etcd.ClusterUrl(kCluster));
  no_cert.insert(no_cert.end(), {"--etcd-ca-file", pki.ca});
  NodeAgent outsider(no_cert);
  ASSERT_TRUE(outsider.started());
  auto outsider_client = ConnectClient(outsider, 2000ms);
  ASSERT_TRUE(outsider_client);
  KeyResult r;
  EXPECT_TRUE(WaitUntil([&] {
    r = PutValue(*outsider_client, "outsider", Pattern("outsider", 100), 1);
    return r.message.find("--etcd-cert-file") != std::string::npos;
  })) << r.message;
  EXPECT_EQ(r.code, ErrorCode::kMasterUnavailable) << r.message;
  EXPECT_EQ(CounterOf(outsider_client->Stat(), "agent.master_link.ready"), 0u);

  // An agent with the certificate but a wrong password: likewise.
  NodeAgent guesser(Concat(Concat(ClusterAgentArgs(etcd.ClusterUrl(kCluster)), tls_files),
                           {"--etcd-password-file", wrong_password}));
  ASSERT_TRUE(guesser.started());
  auto guesser_client = ConnectClient(guesser, 2000ms);
  ASSERT_TRUE(guesser_client);
  EXPECT_TRUE(WaitUntil([&] {
    r = PutValue(*guesser_client, "guesser", Pattern("guesser", 100), 1);
    return r.message.find("etcd refused user kvagent") != std::string::npos;
  })) << r.message;
  EXPECT_EQ(CounterOf(guesser_client->Stat(), "agent.master_link.ready"), 0u);

  // etcd restarts (on its ports and data) and forgets its tokens (all but those it replays): the
  // member and the agent authenticate again by themselves when theirs is refused; the cluster
  // serves again and the values are there.
  ASSERT_TRUE(etcd.Restart()) << "see " << etcd.log_path();
  const std::string after = PutPatterned(*client, "after-etcd-restart", 5);
  EXPECT_EQ(after, "") << m2.LogTail();
  EXPECT_EQ(UnreadablePatterned(*client, "tls", 20), std::vector<std::string>{})
      << "not readable after etcd restarted";
  EXPECT_TRUE(WaitUntil([&] {
    auto l = leader();
    return l && l->record.name == "m2";
  })) << m2.LogTail();
}

TEST(HaOverTls, TlsFilesForAPlainEtcdAddressStopEachBinaryAtStart) {
  TempDir dir;
  const std::string ca = dir.path() + "/ca.pem";
  std::ofstream(ca) << "x\n";
  const CommandOutput master = RunCommand(
      {KVMASTER_BINARY, "--etcd", "127.0.0.1:2379", "--cluster", "c", "--state-dir",
       dir.path() + "/state", "--listen", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
       "--events-replay", "tcp://127.0.0.1:0", "--etcd-ca-file", ca});
  EXPECT_EQ(master.exit_code, 2) << master.err;
  EXPECT_NE(master.err.find("https://HOST:PORT"), std::string::npos) << master.err;
  const CommandOutput agent =
      RunCommand({KVAGENT_BINARY, "--run-dir", dir.path() + "/run", "--master",
                  "etcd://127.0.0.1:2379/c", "--etcd-ca-file", ca});
  EXPECT_EQ(agent.exit_code, 2) << agent.err;
  EXPECT_NE(agent.err.find("etcds://"), std::string::npos) << agent.err;
  const CommandOutput kvctl = RunCommand(
      {KVCTL_BINARY, "cluster", "--master", "etcd://127.0.0.1:2379/c", "--etcd-ca-file", ca});
  EXPECT_EQ(kvctl.exit_code, 2) << kvctl.err;
  EXPECT_NE(kvctl.err.find("etcds://"), std::string::npos) << kvctl.err;
  const CommandOutput half = RunCommand(
      {KVCTL_BINARY, "cluster", "--master", "etcds://127.0.0.1:2379/c", "--etcd-cert-file", ca});
  EXPECT_EQ(half.exit_code, 2) << half.err;
  EXPECT_NE(half.err.find("--etcd-key-file"), std::string::npos) << half.err;
}

}  // namespace
}  // namespace kvagent::testing

// Only a cluster's members reach its ZMQ planes: kvmaster's RPC, event PUB and replay sockets,
// a standby's replication, an agent's master link and event relay, and remote event
// subscribers (kvctl events tail over TCP) authenticate with CURVE keys derived from the
// cluster secret; without a secret nothing listens on, or connects to, an address other hosts
// can reach. Each comment says what the attack got before.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "kvagent/client.h"
#include "kvagent/common/cluster_secret.h"
#include "kvagent/zmq/curve_auth.h"
#include "rpc_test_util.h"
#include "security_support.h"
#include "zmq_test_client.h"

namespace kvagent::testing {
namespace {

namespace fb = kvagent::master_proto;
using master::testing::Bytes;
using master::testing::ParseReply;

// A secret file in a fresh directory.
class SecretFile {
 public:
  explicit SecretFile(std::string content) {
    path_ = dir_.path() + "/cluster-secret";
    std::ofstream(path_) << content << "\n";
    ::chmod(path_.c_str(), 0600);
    secret_ = *ClusterSecret::FromBytes(content);
  }
  const std::string& path() const { return path_; }
  CurvePlaneKeys Keys(KeyPlane plane) const { return secret_->CurveKeys(plane); }

 private:
  TempDir dir_;
  std::string path_;
  std::optional<ClusterSecret> secret_;
};

const char* kOurSecret = "the cluster's own secret: 32 bytes or more, really";
const char* kOtherSecret = "some other cluster's secret, also long enough!!";

// One request on kvmaster's RPC socket as a CURVE client of `keys` (or plain): the reply, or
// nullopt when none came within 2 s.
std::optional<std::string> Ask(const std::string& endpoint, const Bytes& request,
                               const CurvePlaneKeys* keys) {
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 2000);
  if (keys != nullptr && !MakeCurveClient(dealer.handle(), *keys).ok()) return std::nullopt;
  dealer.connect(endpoint);
  dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(request.data(), request.size()), zmq::send_flags::none);
  std::vector<zmq::message_t> frames;
  if (!zmq::recv_multipart(dealer, std::back_inserter(frames)) || frames.size() != 2) {
    return std::nullopt;
  }
  return frames[1].to_string();
}

TEST(Auth, WithoutASecretKvmasterRefusesToListenWhereOtherHostsReachIt) {
  // Was: kvmaster served anyone on tcp://0.0.0.0:50051 by default.
  CommandOutput r = RunCommand({KVMASTER_BINARY, "--listen", "tcp://0.0.0.0:0", "--events",
                                "tcp://127.0.0.1:0", "--events-replay", "tcp://127.0.0.1:0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--cluster-secret-file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--insecure-no-auth"), std::string::npos) << r.err;
  // The defaults face the network too.
  EXPECT_EQ(RunCommand({KVMASTER_BINARY}).exit_code, 2);
  SecretFile loose(kOurSecret);
  ::chmod(loose.path().c_str(), 0644);
  CommandOutput l = RunCommand({KVMASTER_BINARY, "--cluster-secret-file", loose.path()});
  EXPECT_EQ(l.exit_code, 2);
  EXPECT_NE(l.err.find("chmod 600"), std::string::npos) << l.err;
}

TEST(Auth, WithoutASecretAnAgentRefusesARemoteMasterOrEventsTcp) {
  // Was: an agent registered with (and trusted the replies of) any kvmaster address.
  TempDir dir;
  CommandOutput r = RunCommand(
      {KVAGENT_BINARY, "--run-dir", dir.path() + "/run", "--master", "tcp://192.0.2.1:50051"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--master tcp://192.0.2.1:50051 is reachable from other hosts"),
            std::string::npos)
      << r.err;
  CommandOutput e = RunCommand(
      {KVAGENT_BINARY, "--run-dir", dir.path() + "/run", "--events-tcp", "tcp://0.0.0.0:0"});
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_NE(e.err.find("--events-tcp"), std::string::npos) << e.err;
  // A standalone agent has no peers: its pool does not face the network.
  CommandOutput d = RunCommand(
      {KVAGENT_BINARY, "--run-dir", dir.path() + "/run", "--data-listen", "0.0.0.0:7000"});
  EXPECT_EQ(d.exit_code, 2);
  EXPECT_NE(d.err.find("standalone agent has no peers"), std::string::npos) << d.err;
}

TEST(Auth, WithASecretOnlyMembersGetAnswersFromKvmaster) {
  // Was: anyone reaching the RPC port listed every key and session ID, removed everything,
  // registered under another agent's name, pulled snapshots.
  SecretFile secret(kOurSecret);
  KvmasterProcess master({"--cluster-secret-file", secret.path()});
  ASSERT_TRUE(master.started());
  const Bytes list = master::testing::StatsMsg();
  const CurvePlaneKeys ours = secret.Keys(KeyPlane::kMasterRpc);
  SecretFile other(kOtherSecret);
  CurvePlaneKeys impostor = other.Keys(KeyPlane::kMasterRpc);
  impostor.server.public_key = ours.server.public_key;  // public: anyone may know it

  EXPECT_FALSE(Ask(master.rpc(), list, nullptr).has_value()) << "a plain client got an answer";
  EXPECT_FALSE(Ask(master.rpc(), list, &impostor).has_value()) << "an outsider got an answer";
  auto answer = Ask(master.rpc(), list, &ours);
  ASSERT_TRUE(answer.has_value()) << "a member got no answer";
  const fb::Reply* reply = ParseReply(answer->data(), answer->size());
  ASSERT_NE(reply, nullptr);
  EXPECT_GE(master::testing::StatValue(reply, "refused_connections"), 1u);
}

// A client of the agent at `run_dir`.
std::unique_ptr<Client> ClientOf(const std::string& run_dir) {
  ClientOptions options;
  options.run_dir = run_dir;
  auto c = Client::Connect(options);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// Puts `value` under `key` through the agent at `writer_dir` (retried until its link is up) and
// reads it back through the one at `reader_dir` (the same agent, or another: then over the data
// plane): the bytes read ("" when no get succeeded within the wait).
std::string StoreAndReadBack(const std::string& writer_dir, const std::string& reader_dir,
                             const std::string& key, const std::string& value) {
  auto w = ClientOf(writer_dir);
  auto r = ClientOf(reader_dir);
  if (!w || !r) return "";
  std::vector<std::string> keys = {key};
  std::vector<Value> values = {Value(std::string_view(value))};
  EXPECT_TRUE(WaitUntil([&] { return w->Put(keys, values).ok(); }));
  auto buffer = r->Allocate(value.size());
  if (!buffer.ok()) return "";
  const ArenaBuffer* into[] = {&*buffer};
  Reply got;
  if (!WaitUntil([&] {
        got = r->Get(keys, into);
        return got.ok() && got.keys[0].code == ErrorCode::kOk;
      })) {
    ADD_FAILURE() << got.status.ToString() << " " << (got.keys.empty() ? "" : got.keys[0].message);
    return "";
  }
  return std::string(reinterpret_cast<const char*>(buffer->data()), value.size());
}

// The agent at `run_dir` gets no call through to its master, and every call says why: the
// cluster secret (MASTER_UNAVAILABLE naming --cluster-secret-file once the link has tried).
void ExpectKeptOut(const std::string& run_dir) {
  auto o = ClientOf(run_dir);
  ASSERT_NE(o, nullptr);
  std::vector<std::string> keys = {"outsider-key"};
  const std::string value = "never stored";
  std::vector<Value> values = {Value(std::string_view(value))};
  Reply r;
  EXPECT_TRUE(WaitUntil([&] {
    r = o->Put(keys, values);
    return r.status.message().find("cluster-secret-file") != std::string::npos;
  })) << r.status.ToString();
  EXPECT_EQ(r.status.code(), ErrorCode::kMasterUnavailable) << r.status.ToString();
}

TEST(Auth, AgentsWithTheSecretFormAClusterAndAnAgentWithAnotherIsKeptOut) {
  SecretFile secret(kOurSecret);
  KvmasterProcess master({"--cluster-secret-file", secret.path()});
  ASSERT_TRUE(master.started());
  AgentProcess member(Concat(master.AgentArgs(), {"--cluster-secret-file", secret.path()}));
  ASSERT_TRUE(member.started());
  // A second member reads the value back over the data plane, which the secret authenticates
  // too.
  AgentProcess reader(Concat(master.AgentArgs(), {"--cluster-secret-file", secret.path()}));
  ASSERT_TRUE(reader.started());
  const std::string value = "stored through an authenticated link";
  EXPECT_EQ(StoreAndReadBack(member.run_dir(), reader.run_dir(), "member-key", value), value);

  SecretFile other(kOtherSecret);
  AgentProcess outsider(Concat(
      master.AgentArgs(), {"--cluster-secret-file", other.path(), "--master-ready-wait-ms", "0"}));
  ASSERT_TRUE(outsider.started());
  ExpectKeptOut(outsider.run_dir());
}

TEST(Auth, OverTheFramedTransportMembersFormAClusterAndOthersAreKeptOut) {
  // Was: kvmaster refused --framed-listen with a secret (the transport had no encryption), so a
  // cluster with a secret could not use it.
  SecretFile secret(kOurSecret);
  KvmasterProcess master({"--cluster-secret-file", secret.path()}, /*framed=*/true);
  ASSERT_TRUE(master.started());
  AgentProcess member(Concat(master.AgentArgs(), {"--cluster-secret-file", secret.path()}));
  ASSERT_TRUE(member.started());
  const std::string value = "stored through an encrypted framed link";
  EXPECT_EQ(StoreAndReadBack(member.run_dir(), member.run_dir(), "framed-key", value), value);
  auto c = ClientOf(member.run_dir());
  ASSERT_NE(c, nullptr);
  std::string link;
  EXPECT_EQ(CounterOf(c->Stat(), "agent.master_link", &link), 1u);
  EXPECT_NE(link.find(master.framed_rpc()), std::string::npos) << link;

  // An agent with another secret, and one with none, get nothing through; each is told why.
  SecretFile other(kOtherSecret);
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--cluster-secret-file", other.path()},
        std::vector<std::string>{}}) {
    AgentProcess outsider(
        Concat(master.AgentArgs(), Concat(extra, {"--master-ready-wait-ms", "0"})));
    ASSERT_TRUE(outsider.started());
    ExpectKeptOut(outsider.run_dir());
  }
  // The member's value is untouched.
  EXPECT_EQ(StoreAndReadBack(member.run_dir(), member.run_dir(), "framed-key-2", value), value);
}

TEST(Auth, OnlyMembersFollowKvmastersEvents) {
  // Was: anyone reaching the event ports read every stored key and session ID.
  SecretFile secret(kOurSecret);
  KvmasterProcess master({"--cluster-secret-file", secret.path()});
  ASSERT_TRUE(master.started());
  auto tail = [&](const std::string* secret_file) {
    std::vector<std::string> args = {KVCTL_BINARY,
                                     "events",
                                     "tail",
                                     "--endpoint",
                                     master.events(),
                                     "--replay-endpoint",
                                     master.replay(),
                                     "--from-seq",
                                     "0",
                                     "--count",
                                     "1",
                                     "--timeout-ms",
                                     "2000"};
    if (secret_file != nullptr) {
      args.push_back("--cluster-secret-file");
      args.push_back(*secret_file);
    }
    return RunCommand(args);
  };
  CommandOutput member = tail(&secret.path());
  EXPECT_EQ(member.exit_code, 0) << member.err;
  EXPECT_NE(member.out.find("AllBlocksCleared"), std::string::npos) << member.out;
  CommandOutput plain = tail(nullptr);
  EXPECT_EQ(plain.exit_code, 1) << plain.out;
  EXPECT_EQ(plain.out, "");
  SecretFile other(kOtherSecret);
  CommandOutput outsider = tail(&other.path());
  EXPECT_EQ(outsider.exit_code, 1);
  EXPECT_EQ(outsider.out, "");
}

TEST(Auth, AStandbyFollowsOnlyWithTheClustersSecret) {
  // Was: anyone could pull the whole state with Replicate.
  SecretFile secret(kOurSecret);
  KvmasterProcess primary({"--cluster-secret-file", secret.path()});
  ASSERT_TRUE(primary.started());
  auto follow = [&](const SecretFile& with) {
    TempDir dir;
    const std::string status = dir.path() + "/status";
    ProcessGuard standby(fork());
    if (standby.pid() == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      dup2(null, 2);
      const std::string binary = KVMASTER_BINARY;
      execl(binary.c_str(), binary.c_str(), "--follow", primary.rpc().c_str(), "--state-dir",
            dir.path().c_str(), "--status-file", status.c_str(), "--cluster-secret-file",
            with.path().c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return WaitUntil([&] { return ::access(status.c_str(), F_OK) == 0; }, std::chrono::seconds(5));
  };
  EXPECT_TRUE(follow(secret)) << "a standby with the secret did not sync";
  SecretFile other(kOtherSecret);
  EXPECT_FALSE(follow(other)) << "a standby with another secret pulled the state";
}

TEST(Auth, AnAgentsEventsOverTcpAreForMembersOnly) {
  SecretFile secret(kOurSecret);
  LoggedAgent agent({"--cluster-secret-file", secret.path(), "--events-tcp", "tcp://127.0.0.1:0"});
  ASSERT_TRUE(agent.started());
  std::string endpoint;
  ASSERT_TRUE(WaitUntil([&] {
    const std::string log = agent.Log();
    const size_t at = log.find("and tcp://127.0.0.1:");
    if (at == std::string::npos) return false;
    endpoint = log.substr(at + 4, log.find_first_of(", ", at + 4) - (at + 4));
    return true;
  }));
  auto tail_live = [&](const std::string* secret_file, const std::string& key) {
    std::vector<std::string> args = {KVCTL_BINARY, "events", "tail",         "--endpoint", endpoint,
                                     "--count",    "1",      "--timeout-ms", "3000"};
    if (secret_file != nullptr) {
      args.push_back("--cluster-secret-file");
      args.push_back(*secret_file);
    }
    // Keep storing while the tail joins: it sees one of them if it may.
    std::atomic<bool> done{false};
    std::thread writer([&] {
      ClientOptions o;
      o.run_dir = agent.run_dir();
      auto c = Client::Connect(o);
      for (int i = 0; c.ok() && !done.load() && i < 400; ++i) {
        std::vector<std::string> keys = {key + std::to_string(i)};
        std::vector<Value> values = {Value(std::string_view("v"))};
        (void)(*c)->Put(keys, values);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
    CommandOutput r = RunCommand(args);
    done = true;
    writer.join();
    return r;
  };
  CommandOutput member = tail_live(&secret.path(), "m-");
  EXPECT_EQ(member.exit_code, 0) << member.err;
  EXPECT_NE(member.out.find("BlockStored"), std::string::npos) << member.out;
  CommandOutput plain = tail_live(nullptr, "p-");
  EXPECT_EQ(plain.exit_code, 1);
  EXPECT_EQ(plain.out, "");
}

}  // namespace
}  // namespace kvagent::testing

// A real kvmaster process: flags, clean shutdown, malformed messages on its ROUTER, and the
// operation log across a restart. Every process started here is stopped (SIGKILL + waitpid on
// any failure path) and every wait is bounded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "process_guard.h"
#include "temp_dir.h"
#include "zmq_test_client.h"

namespace kvagent::master {
namespace {

using namespace testing;  // NOLINT
using kvagent::testing::SpawnQuiet;

using kvagent::testing::TempDir;

// One kvmaster child. The destructor kills and reaps it if it still runs.
class Kvmaster {
 public:
  explicit Kvmaster(std::vector<std::string> extra = {}, bool ephemeral_ports = true) {
    ready_ = dir_.path() + "/ready";
    std::vector<std::string> args = {KVMASTER_BIN};
    if (ephemeral_ports) {
      args.insert(args.end(), {"--listen", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
                               "--events-replay", "tcp://127.0.0.1:0", "--ready-file", ready_});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = SpawnQuiet(std::move(args));  // keep the test log readable; failures show in codes
  }
  ~Kvmaster() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // Waits (at most 20 s) for the ready file; returns rpc/events/replay endpoints.
  std::map<std::string, std::string> WaitReady() {
    for (int i = 0; i < 2000; ++i) {
      std::ifstream in(ready_);
      std::map<std::string, std::string> out;
      std::string line;
      while (std::getline(in, line)) {
        auto eq = line.find('=');
        if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
      }
      if (out.count("replay")) return out;
      if (Exited()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return {};
  }
  // Exit status after it ends by itself (bounded: 20 s), or -1.
  int WaitExit() {
    for (int i = 0; i < 2000; ++i) {
      if (Exited()) return status_;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  int Terminate() {
    kill(pid_, SIGTERM);
    return WaitExit();
  }
  void Kill() {
    kill(pid_, SIGKILL);
    WaitExit();
  }

 private:
  bool Exited() {
    if (pid_ <= 0) return true;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) != pid_) return false;
    pid_ = -1;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return true;
  }
  TempDir dir_;
  std::string ready_;
  pid_t pid_ = -1;
  int status_ = -1;
};

TEST(Kvmaster, ABadFlagExitsWithCode2) {
  Kvmaster m({"--no-such-flag", "1"}, /*ephemeral_ports=*/false);
  EXPECT_EQ(m.WaitExit(), 2);
  Kvmaster w({"--high-watermark", "lots"}, false);
  EXPECT_EQ(w.WaitExit(), 2);
  Kvmaster no_state({"--follow", "tcp://127.0.0.1:1"}, false);  // a standby needs --state-dir
  EXPECT_EQ(no_state.WaitExit(), 2);
  // Failover is elected through etcd; the timer that promoted a standby is gone.
  Kvmaster no_timer({"--promote-after-ms", "100"}, false);
  EXPECT_EQ(no_timer.WaitExit(), 2);
  Kvmaster half_ha({"--etcd", "127.0.0.1:2379"}, false);  // --etcd needs --cluster
  EXPECT_EQ(half_ha.WaitExit(), 2);
  Kvmaster ha_no_state({"--etcd", "127.0.0.1:2379", "--cluster", "c"}, false);
  EXPECT_EQ(ha_no_state.WaitExit(), 2);  // a member keeps the leader's log in --state-dir
  Kvmaster bad_etcd({"--etcd", "nohost", "--cluster", "c", "--state-dir", "/tmp"}, false);
  EXPECT_EQ(bad_etcd.WaitExit(), 2);
  // Without a secret the framed transport is plain TCP: on loopback only.
  Kvmaster open_framed({"--framed-listen", "tcp://0.0.0.0:0"}, /*ephemeral_ports=*/true);
  EXPECT_EQ(open_framed.WaitExit(), 2);
  Kvmaster bad_framed({"--framed-listen", "udp://127.0.0.1:0"}, /*ephemeral_ports=*/true);
  EXPECT_NE(bad_framed.WaitExit(), 0);
}

TEST(Kvmaster, HelpExitsWithCode0) {
  Kvmaster m({"--help"}, false);
  EXPECT_EQ(m.WaitExit(), 0);
}

TEST(Kvmaster, SigtermStopsItCleanly) {
  Kvmaster m;
  ASSERT_FALSE(m.WaitReady().empty());
  EXPECT_EQ(m.Terminate(), 0);
}

TEST(Kvmaster, MalformedMessagesGetErrorRepliesAndTheMasterKeepsServing) {
  Kvmaster m;
  auto ep = m.WaitReady();
  ASSERT_FALSE(ep.empty());
  MasterClient client(ep["rpc"]);
  std::string buf;
  // Not a FlatBuffer.
  client.SendFrames({"", "definitely not a flatbuffer"});
  auto reply = client.Receive();
  ASSERT_TRUE(reply);
  const fb::Reply* r = ParseReply(reply->data(), reply->size());
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), 1);  // INVALID_PARAMS
  // Missing the empty delimiter frame: answered all the same.
  client.SendFrames({"one frame only"});
  reply = client.Receive();
  ASSERT_TRUE(reply);
  r = ParseReply(reply->data(), reply->size());
  ASSERT_NE(r, nullptr);
  EXPECT_NE(r->status(), 0);
  // Too many frames.
  client.SendFrames({"", "a", "b"});
  ASSERT_TRUE(client.Receive());
  // Still serving.
  r = client.Call(RegisterAgentMsg("node-x", 1), &buf);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), 0);
  r = client.Call(StatsMsg(), &buf);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(StatValue(r, "bad_messages"), 2u);  // wrong framing
  EXPECT_EQ(StatValue(r, "bad_requests"), 3u);  // every rejected request
  EXPECT_EQ(StatValue(r, "agents"), 1u);
  EXPECT_EQ(m.Terminate(), 0);
}

// Registers agent "node-p" (incarnation 5), mounts its 1 MiB pool and stores `keys` (64 bytes
// each, tagged with `sessions`) through `client`.
void StoreAsAgent(MasterClient& client, const std::vector<std::string>& keys,
                  const std::vector<std::string>& sessions) {
  std::string buf;
  const fb::Reply* r = client.Call(RegisterAgentMsg("node-p", 5), &buf);
  ASSERT_NE(r, nullptr);
  const uint32_t agent = r->body_as_RegisterAgentReply()->agent_id();
  ASSERT_EQ(client.Call(MountPoolMsg(agent, 1 << 20, "tcp://h:1"), &buf)->status(), 0);
  const std::vector<uint64_t> sizes(keys.size(), 64);
  ASSERT_EQ(client.Call(WriteStartMsg(agent, keys, sizes, sessions), &buf)->status(), 0);
  ASSERT_EQ(client.Call(WriteFinishMsg(fb::Body::BatchPutEnd, agent, keys), &buf)->status(), 0);
}

TEST(Kvmaster, TheOperationLogRestoresObjectsTagsAndPoolsAfterARestart) {
  TempDir state;
  std::string buf;
  {
    Kvmaster m({"--state-dir", state.path()});
    auto ep = m.WaitReady();
    ASSERT_FALSE(ep.empty());
    MasterClient client(ep["rpc"]);
    ASSERT_NO_FATAL_FAILURE(StoreAsAgent(client, {"a", "b"}, {"s", ""}));
    EXPECT_EQ(m.Terminate(), 0);
  }
  Kvmaster m({"--state-dir", state.path()});
  auto ep = m.WaitReady();
  ASSERT_FALSE(ep.empty());
  MasterClient client(ep["rpc"]);
  const fb::Reply* r = client.Call(StatsMsg(), &buf);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(StatValue(r, "keys"), 2u);
  EXPECT_EQ(StatValue(r, "session_tags"), 1u);
  // The same agent incarnation comes back and finds its pool's objects.
  r = client.Call(RegisterAgentMsg("node-p", 5), &buf);
  const uint32_t agent = r->body_as_RegisterAgentReply()->agent_id();
  r = client.Call(MountPoolMsg(agent, 1 << 20, "tcp://h:1"), &buf);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->body_as_MountPoolReply()->restored_objects(), 2u);
  // A reconnect mounts it again: the objects stay, and nothing more was restored.
  r = client.Call(MountPoolMsg(agent, 1 << 20, "tcp://h:1"), &buf);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), 0);
  EXPECT_EQ(r->body_as_MountPoolReply()->restored_objects(), 0u);
  r = client.Call(StatsMsg(), &buf);
  EXPECT_EQ(StatValue(r, "keys"), 2u);
  r = client.Call(KeysMsg(fb::Body::BatchGet, {"a"}), &buf);
  EXPECT_EQ(r->body_as_PlacementReply()->codes()->Get(0), 0);
  // A new incarnation of that agent lost its memory: its objects go.
  r = client.Call(RegisterAgentMsg("node-p", 6), &buf);
  r = client.Call(StatsMsg(), &buf);
  EXPECT_EQ(StatValue(r, "keys"), 0u);
  EXPECT_EQ(m.Terminate(), 0);
}

// A second kvmaster on a state dir in use (a second unit, a standby given the primary's dir)
// would append its records between the first's and replace the log at its next compaction.
TEST(Kvmaster, ASecondKvmasterOnAStateDirInUseDoesNotStartAndTheFirstKeepsItsLog) {
  TempDir state, logs;
  std::string buf;
  Kvmaster first({"--state-dir", state.path()});
  auto ep = first.WaitReady();
  ASSERT_FALSE(ep.empty());
  MasterClient client(ep["rpc"]);
  ASSERT_NO_FATAL_FAILURE(StoreAsAgent(client, {"a"}, {""}));
  const auto log_bytes = std::filesystem::file_size(state.path() + "/master.oplog");

  Kvmaster second({"--state-dir", state.path(), "--log-dir", logs.path()});
  EXPECT_EQ(second.WaitExit(), 1);
  const std::string said = kvagent::testing::ReadFile(logs.path() + "/kvmaster.ERROR");
  EXPECT_NE(said.find("--state-dir " + state.path() + " is in use by another kvmaster"),
            std::string::npos)
      << said;
  Kvmaster standby({"--state-dir", state.path(), "--follow", ep["rpc"]});
  EXPECT_EQ(standby.WaitExit(), 1);
  EXPECT_EQ(std::filesystem::file_size(state.path() + "/master.oplog"), log_bytes);
  const fb::Reply* r = client.Call(KeysMsg(fb::Body::BatchGet, {"a"}), &buf);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->body_as_PlacementReply()->codes()->Get(0), 0);

  // The lock goes with its process: after a SIGKILL a new kvmaster starts on the dir at once.
  first.Kill();
  Kvmaster again({"--state-dir", state.path()});
  auto again_ep = again.WaitReady();
  ASSERT_FALSE(again_ep.empty());
  MasterClient again_client(again_ep["rpc"]);
  r = again_client.Call(StatsMsg(), &buf);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(StatValue(r, "keys"), 1u);
  EXPECT_EQ(again.Terminate(), 0);
}

}  // namespace
}  // namespace kvagent::master

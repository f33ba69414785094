// A standby kvmaster (kvmaster --follow) keeps a copy of the primary's state and, once promoted,
// serves on the primary's endpoints: the agents reconnect by themselves, the stored objects stay
// readable with their session tags, and new writes work.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "master_stats.h"
#include "pipeline_support.h"

namespace kvagent::testing {
namespace {

uint64_t AppliedSeq(const std::string& status_file) {
  return StatusFileValue(status_file, "applied_seq");
}

Reply Put(Client& c, const std::vector<std::string>& keys, const std::vector<std::string>& bytes,
          const std::vector<std::string>& sessions) {
  std::vector<Value> values;
  for (const auto& b : bytes) values.emplace_back(std::string_view(b));
  CallOptions o;
  o.session_ids = sessions;
  return c.Put(keys, values, o);
}

bool AllOk(const Reply& r) {
  if (!r.ok() || r.keys.empty()) return false;
  for (const auto& k : r.keys) {
    if (k.code != ErrorCode::kOk) return false;
  }
  return true;
}

std::string Get(Client& c, const std::string& key, size_t capacity) {
  auto buffer = c.Allocate(capacity);
  if (!buffer.ok()) return "";
  std::vector<std::string> keys = {key};
  std::vector<const ArenaBuffer*> targets = {&*buffer};
  Reply r = c.Get(keys, targets);
  if (r.keys.size() != 1 || r.keys[0].code != ErrorCode::kOk) return "";
  return std::string(reinterpret_cast<const char*>(buffer->data()), r.keys[0].length);
}

// The agent's link is up and its master holds `keys` readable objects.
bool ServedBy(Client& c, uint64_t keys) {
  const Reply st = c.Stat();
  return CounterOf(st, "agent.master_link") == 1 && CounterOf(st, "master.keys") == keys;
}

// Puts `n` keys named `prefix` + i, of `value_bytes` each, tagged `session`, 256 a call; appends
// each key and its bytes to `keys` and `bytes` when given.
bool PutMany(Client& c, const std::string& prefix, int n, const std::string& session,
             size_t value_bytes, std::vector<std::string>* keys = nullptr,
             std::vector<std::string>* bytes = nullptr) {
  for (int done = 0; done < n;) {
    std::vector<std::string> k, b;
    for (; done < n && k.size() < 256; ++done) {
      k.push_back(prefix + std::to_string(done));
      b.push_back(Pattern(k.back(), value_bytes));
    }
    if (keys != nullptr) keys->insert(keys->end(), k.begin(), k.end());
    if (bytes != nullptr) bytes->insert(bytes->end(), b.begin(), b.end());
    if (!AllOk(Put(c, k, b, std::vector<std::string>(k.size(), session)))) return false;
  }
  return true;
}

struct Cluster {
  Cluster() = default;
  explicit Cluster(const Args& primary_extra)
      : primary(Concat({"--agent-ttl-ms", "60000"}, primary_extra)) {}
  KvmasterProcess primary{{"--agent-ttl-ms", "60000"}};
  AgentProcess agent{Concat(primary.AgentArgs(), {"--data-listen", "127.0.0.1:0"})};
  std::unique_ptr<Client> client = Connect(agent);
  TempDir standby_dir;
  std::string status_file = standby_dir.path() + "/status";

  std::unique_ptr<KvmasterProcess> StartStandby(const Args& extra = {}) {
    return KvmasterProcess::StandbyOf(
        primary, Concat({"--state-dir", standby_dir.path() + "/state", "--status-file", status_file,
                         "--agent-ttl-ms", "60000"},
                        extra));
  }
  // A standby with an empty state dir (the last one stopped first): it asks for a snapshot.
  std::unique_ptr<KvmasterProcess> StartNewStandby() {
    std::filesystem::remove_all(standby_dir.path() + "/state");
    std::filesystem::remove(status_file);
    return StartStandby();
  }
  // Waits until the standby holds every record the primary has made so far.
  bool StandbyCaughtUp() {
    const uint64_t seq = CounterOf(client->Stat(), "master.replication_last_seq");
    return seq > 0 && WaitUntil([&] { return AppliedSeq(status_file) == seq; });
  }
};

TEST(Standby, APromotedStandbyServesThePrimarysObjectsWithTheirSessionsAndTakesNewWrites) {
  Cluster cl;
  ASSERT_TRUE(cl.primary.started() && cl.agent.started() && cl.client);
  Client& c = *cl.client;
  const std::vector<std::string> early = {"early-0", "early-1"};
  const std::vector<std::string> early_bytes = {Pattern("early-0", 4096), Pattern("early-1", 100)};
  ASSERT_TRUE(AllOk(Put(c, early, early_bytes, {"sessão-0", ""})));

  // Started after the first puts: its first fetch is a snapshot, the rest are records.
  auto standby = cl.StartStandby();
  ASSERT_TRUE(cl.StandbyCaughtUp());
  const std::vector<std::string> late = {"late-0", "late-1", "gone"};
  const std::vector<std::string> late_bytes = {Pattern("late-0", 70000), Pattern("late-1", 1),
                                               Pattern("gone", 10)};
  ASSERT_TRUE(AllOk(Put(c, late, late_bytes, {"s-late", "s-late", "s-gone"})));
  std::vector<std::string> gone = {"gone"};
  ASSERT_TRUE(AllOk(c.Remove(gone)));
  ASSERT_TRUE(cl.StandbyCaughtUp());

  cl.primary.Kill();
  standby->Signal(SIGUSR1);
  ASSERT_TRUE(standby->WaitServing());
  ASSERT_TRUE(WaitUntil([&] { return ServedBy(c, 4); }, std::chrono::seconds(30)));

  EXPECT_EQ(Get(c, "early-0", 4096), early_bytes[0]);
  EXPECT_EQ(Get(c, "early-1", 4096), early_bytes[1]);
  EXPECT_EQ(Get(c, "late-0", 70000), late_bytes[0]);
  EXPECT_EQ(Get(c, "late-1", 4096), late_bytes[1]);
  std::map<std::string, std::string> tags;
  for (const auto& k : c.List(ListOptions{}).listed) tags[k.key] = k.session_id;
  EXPECT_EQ(
      tags,
      (std::map<std::string, std::string>{
          {"early-0", "sessão-0"}, {"early-1", ""}, {"late-0", "s-late"}, {"late-1", "s-late"}}));
  EXPECT_TRUE(AllOk(Put(c, {"after"}, {"after-bytes"}, {"s-after"})));
  EXPECT_EQ(Get(c, "after", 64), "after-bytes");
}

// The primary builds a new follower's snapshot in a child process: held there (SIGSTOP), it
// holds up the follower, not the primary, which stores puts meanwhile; let go, the follower
// gets the state of the snapshot's moment and the records after it.
TEST(Standby, AFollowersSnapshotIsBuiltWhileThePrimaryGoesOnServing) {
  // A replication log of 16 KiB, that is one block of 1 MiB (the newest block is always kept):
  // 2 MiB of records move it past a built snapshot.
  Cluster cl({"--replication-log-bytes", "16384"});
  ASSERT_TRUE(cl.primary.started() && cl.agent.started() && cl.client);
  Client& c = *cl.client;
  std::vector<std::string> keys, bytes;
  ASSERT_TRUE(PutMany(c, "before-", 50, "s", 1000, &keys, &bytes));
  // The child of 50 objects lives a few milliseconds: a test thread that is not scheduled
  // meanwhile misses it, and the follower gets its snapshot. Then a new follower, once the log
  // moved past that snapshot (~2 MiB of records: long keys and sessions), makes the primary
  // build another.
  std::unique_ptr<KvmasterProcess> standby;
  pid_t builder = 0;
  for (int attempt = 0; attempt < 5 && builder == 0; ++attempt) {
    if (attempt > 0) {
      standby.reset();
      const std::string prefix = "filler-" + std::to_string(attempt) + "-" + std::string(200, 'k');
      ASSERT_TRUE(PutMany(c, prefix, 4000, std::string(200, 's'), 1000, &keys, &bytes));
    }
    standby = cl.StartNewStandby();
    builder = StopAStateWriter(cl.primary.pid(), std::chrono::seconds(10));
  }
  ASSERT_NE(builder, 0) << "the primary built no snapshot in a child";
  for (int i = 0; i < 20; ++i) {  // answered while the snapshot's child is stopped
    const std::string key = "during-" + std::to_string(i);
    ASSERT_TRUE(AllOk(Put(c, {key}, {Pattern(key, 1000)}, {"d"})));
    keys.push_back(key);
    bytes.push_back(Pattern(key, 1000));
  }
  EXPECT_EQ(AppliedSeq(cl.status_file), 0u);  // the follower still waits for its snapshot
  ASSERT_EQ(::kill(builder, SIGCONT), 0);
  ASSERT_TRUE(cl.StandbyCaughtUp());

  cl.primary.Kill();
  standby->Signal(SIGUSR1);
  ASSERT_TRUE(standby->WaitServing());
  ASSERT_TRUE(WaitUntil([&] { return ServedBy(c, keys.size()); }, std::chrono::seconds(30)));
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(Get(c, keys[i], 1000), bytes[i]) << keys[i];
}

// The snapshot mappings ("memfd:kvmaster-follower-snapshot") in process `pid`.
int SnapshotMappings(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find("kvmaster-follower-snapshot") != std::string::npos;
  }
  return n;
}

// A follower's snapshot goes out from its mapping without a copy; the transport holds the
// mapping until the snapshot is sent. Once it is, and the primary has moved on to a newer
// snapshot, the old mapping is gone: nothing the transport held keeps it.
TEST(Standby, ASnapshotsMappingIsReleasedOnceNoFollowerIsSendingIt) {
  Cluster cl({"--replication-log-bytes", "16384"});
  ASSERT_TRUE(cl.primary.started() && cl.agent.started() && cl.client);
  Client& c = *cl.client;
  const std::string long_session(200, 's');  // with long keys: ~500 bytes of records a key
  ASSERT_TRUE(PutMany(c, "first-" + std::string(200, 'k'), 4000, long_session, 64));  // ~2 MB
  auto standby = cl.StartStandby();
  ASSERT_TRUE(cl.StandbyCaughtUp());
  EXPECT_EQ(SnapshotMappings(cl.primary.pid()), 1);

  // The follower goes; the log moves past its snapshot (~2 MiB of records); a new follower
  // gets a newer snapshot, and only that one stays mapped.
  standby.reset();
  ASSERT_TRUE(PutMany(c, "second-" + std::string(200, 'k'), 4000, long_session, 64));
  standby = cl.StartNewStandby();
  ASSERT_TRUE(cl.StandbyCaughtUp());
  EXPECT_TRUE(WaitUntil([&] { return SnapshotMappings(cl.primary.pid()) == 1; }))
      << SnapshotMappings(cl.primary.pid()) << " snapshot mappings";
}

// Each agent's key reaches the standby with the agent (in the snapshot of a standby started
// after the agent registered, and as a record for one registered after), so right after the
// standby is promoted, before the agents registered with it (stalled by SIGSTOP), registrations
// of their names and incarnations with another key are refused; the agents then go on.
TEST(Standby, APromotedStandbyKnowsEachAgentsKey) {
  namespace fb = kvagent::master_proto;
  KvmasterProcess primary({"--agent-ttl-ms", "60000"});
  ASSERT_TRUE(primary.started());
  auto agent_args = [&](const std::string& name) {
    return Concat(primary.AgentArgs(), {"--data-listen", "127.0.0.1:0", "--agent-name", name});
  };
  AgentProcess a(agent_args("node-snapshot"));
  auto ca = Connect(a);
  ASSERT_TRUE(a.started() && ca);
  ASSERT_TRUE(AllOk(Put(*ca, {"from-a"}, {Pattern("from-a", 4096)}, {"s"})));
  TempDir dir;
  const std::string status = dir.path() + "/status";
  auto standby = KvmasterProcess::StandbyOf(
      primary,
      {"--state-dir", dir.path() + "/state", "--status-file", status, "--agent-ttl-ms", "60000"});
  AgentProcess b(agent_args("node-record"));
  auto cb = Connect(b);
  ASSERT_TRUE(b.started() && cb);
  ASSERT_TRUE(AllOk(Put(*cb, {"from-b"}, {Pattern("from-b", 4096)}, {"s"})));
  const uint64_t seq = CounterOf(ca->Stat(), "master.replication_last_seq");
  ASSERT_TRUE(seq > 0 && WaitUntil([&] { return AppliedSeq(status) == seq; }));

  a.Signal(SIGSTOP);
  b.Signal(SIGSTOP);
  primary.Kill();
  standby->Signal(SIGUSR1);
  ASSERT_TRUE(standby->WaitServing());
  for (const auto& [name, client] :
       {std::pair<std::string, Client*>{"node-snapshot", ca.get()}, {"node-record", cb.get()}}) {
    flatbuffers::FlatBufferBuilder forged;
    forged.Finish(fb::CreateRequest(
        forged, 1, fb::Body::RegisterAgent,
        fb::CreateRegisterAgent(forged, forged.CreateString(name), client->agent_incarnation())
            .Union(),
        /*agent_key=*/1));
    const auto reply = CallMaster(standby->rpc(), forged);
    ASSERT_TRUE(reply.has_value()) << name;
    const fb::Reply* r = flatbuffers::GetRoot<fb::Reply>(reply->data());
    EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams)) << name;
    EXPECT_NE(std::string(r->message() ? r->message()->c_str() : "").find("agent key"),
              std::string::npos)
        << name;
  }
  EXPECT_EQ(MasterStat(standby->rpc(), "agent_key_refusals"), 2u);
  a.Signal(SIGCONT);
  b.Signal(SIGCONT);
  ASSERT_TRUE(
      WaitUntil([&] { return ServedBy(*ca, 2) && ServedBy(*cb, 2); }, std::chrono::seconds(30)));
  EXPECT_EQ(Get(*ca, "from-b", 4096), Pattern("from-b", 4096));
  EXPECT_EQ(Get(*cb, "from-a", 4096), Pattern("from-a", 4096));
}

}  // namespace
}  // namespace kvagent::testing

// Acting for another agent at kvmaster: a process that reaches kvmaster's RPC (a member of the
// cluster, or anyone where there is no cluster secret) and knows a running agent's name, id and
// incarnation (the incarnation travels to every reader in PlacementReply.pools) sends the calls
// only that agent may make. Each one is refused, because it does not carry the agent key the
// agent's own registration bound (master.fbs RegisterAgent), and the agent goes on serving.
// Before the key, kvmaster took each of them: the registration returned the agent's id, the
// heartbeat acknowledged its fences (freeing space a write still in flight may land in), the
// mount moved its pool to another endpoint, the writes and reports acted in its name. The key
// is kept in the agent's run dir and logged by kvmaster with the agent, so it holds across
// restarts of either.
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "integrity_support.h"
#include "kvagent/client.h"
#include "kvagent/common/framed_connection.h"
#include "pipeline_support.h"
#include "rpc_test_util.h"
#include "security_support.h"
#include "zmq_test_client.h"

namespace kvagent::testing {
namespace {

namespace fb = kvagent::master_proto;
using master::testing::Bytes;
using master::testing::MasterClient;

// A request of `type` whose body `make` builds, carrying `agent_key`.
template <typename MakeBody>
Bytes Keyed(fb::Body type, uint64_t agent_key, MakeBody make) {
  flatbuffers::FlatBufferBuilder b;
  const flatbuffers::Offset<void> body = make(b).Union();
  b.Finish(fb::CreateRequest(b, 1, type, body, agent_key));
  return Bytes(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

// Every call that names an agent, as another process would send it for agent `id` (incarnation
// `incarnation`, pool `pool`, a stored `key` of version `version`), with `agent_key`.
std::vector<std::pair<std::string, Bytes>> ActingFor(uint32_t id, uint64_t incarnation,
                                                     uint32_t pool, const std::string& key,
                                                     uint64_t version, uint64_t agent_key) {
  using FBB = flatbuffers::FlatBufferBuilder;
  const std::vector<std::string> keys = {key};
  auto start = [&](FBB& b) {
    return fb::CreateWriteStart(b, id, b.CreateVectorOfStrings({"forged"}),
                                b.CreateVector(std::vector<uint64_t>{4096}));
  };
  auto finish = [&](FBB& b) {
    return fb::CreateWriteFinish(b, id, b.CreateVectorOfStrings(keys),
                                 b.CreateVector(std::vector<uint64_t>{version}));
  };
  return {
      {"RegisterAgent", Keyed(fb::Body::RegisterAgent, agent_key,
                              [&](FBB& b) {
                                return fb::CreateRegisterAgent(b, b.CreateString("node-a"),
                                                               incarnation);
                              })},
      {"Heartbeat", Keyed(fb::Body::Heartbeat, agent_key,
                          [&](FBB& b) { return fb::CreateHeartbeat(b, id, ~uint64_t{0}); })},
      {"MountPool", Keyed(fb::Body::MountPool, agent_key,
                          [&](FBB& b) {
                            return fb::CreateMountPool(b, id, 0, 64u << 20,
                                                       b.CreateVectorOfStrings({"127.0.0.1:1"}));
                          })},
      {"BatchPutStart", Keyed(fb::Body::BatchPutStart, agent_key, start)},
      {"BatchUpsertStart", Keyed(fb::Body::BatchUpsertStart, agent_key, start)},
      {"BatchPutEnd", Keyed(fb::Body::BatchPutEnd, agent_key, finish)},
      {"BatchPutRevoke", Keyed(fb::Body::BatchPutRevoke, agent_key, finish)},
      {"BatchUpsertEnd", Keyed(fb::Body::BatchUpsertEnd, agent_key, finish)},
      {"BatchUpsertRevoke", Keyed(fb::Body::BatchUpsertRevoke, agent_key, finish)},
      {"ReserveWrites", Keyed(fb::Body::ReserveWrites, agent_key,
                              [&](FBB& b) { return fb::CreateReserveWrites(b, id, 4096, 1, 4); })},
      {"BatchPutCommit", Keyed(fb::Body::BatchPutCommit, agent_key,
                               [&](FBB& b) {
                                 auto s = start(b);
                                 auto f = fb::CreateWriteFinish(
                                     b, id, 0, b.CreateVector(std::vector<uint64_t>{1}));
                                 return fb::CreateWriteCommit(b, s, f, 0);
                               })},
      {"ReportBadReplicas", Keyed(fb::Body::ReportBadReplicas, agent_key,
                                  [&](FBB& b) {
                                    return fb::CreateReportBadReplicas(
                                        b, id, b.CreateVectorOfStrings(keys),
                                        b.CreateVector(std::vector<uint64_t>{version}),
                                        b.CreateVector(std::vector<uint32_t>{0}),
                                        b.CreateVector(std::vector<uint32_t>{pool}));
                                  })},
  };
}

TEST(AgentKey, CallsForARunningAgentFromAnotherProcessAreRefusedAndTheAgentGoesOn) {
  TempDir logs;
  KvmasterProcess master({"--tick-ms", "20", "--log-dir", logs.path()}, /*framed=*/true);
  ASSERT_TRUE(master.WaitServing());
  LoggedAgent agent(
      Concat(master.AgentArgs(), {"--agent-name", "node-a", "--master-ready-wait-ms", "10000"}));
  ASSERT_TRUE(agent.started()) << agent.Log();
  ClientOptions options;
  options.run_dir = agent.run_dir();
  options.arena_bytes = 4 << 20;
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Client& c = **client;
  std::vector<std::string> keys;
  std::vector<std::string> bytes;
  for (int i = 0; i < 20; ++i) {
    keys.push_back("owned-" + std::to_string(i));
    bytes.push_back(std::string(4096, static_cast<char>('a' + i)));
  }
  auto put = [&](size_t from, size_t to) {
    std::vector<Value> values;
    for (size_t i = from; i < to; ++i) values.emplace_back(std::string_view(bytes[i]));
    const Reply r = c.Put(std::span(keys).subspan(from, to - from), values);
    for (const KeyResult& k : r.keys) {
      if (k.code != ErrorCode::kOk) return k.message;
    }
    return r.keys.size() == to - from ? std::string() : "no reply";
  };
  ASSERT_EQ(put(0, 10), "");

  // What a reader learns of the agent: its id, incarnation and pool (BatchGet's pools).
  MasterClient other(master.rpc());
  std::string storage;
  const fb::Reply* got =
      other.Call(master::testing::KeysMsg(fb::Body::BatchGet, {keys[0]}), &storage);
  ASSERT_TRUE(got != nullptr && got->body_as_PlacementReply() != nullptr);
  const fb::PlacementReply* placed = got->body_as_PlacementReply();
  ASSERT_TRUE(placed->pools() != nullptr && placed->pools()->size() == 1);
  const uint32_t id = placed->pools()->Get(0)->agent_id();
  const uint64_t incarnation = placed->pools()->Get(0)->incarnation();
  const uint32_t pool = placed->pools()->Get(0)->pool_id();
  const uint64_t version = placed->write_ids()->Get(0);

  uint64_t refused = 0;
  for (uint64_t guess : {uint64_t{0}, uint64_t{1}, incarnation}) {
    for (const auto& [name, request] : ActingFor(id, incarnation, pool, keys[0], version, guess)) {
      const fb::Reply* r = other.Call(request, &storage);
      ASSERT_NE(r, nullptr) << name;
      EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams)) << name;
      const std::string message = r->message() ? r->message()->str() : "";
      EXPECT_NE(message.find("without"), std::string::npos) << name << ": " << message;
      EXPECT_NE(message.find("agent key"), std::string::npos) << name << ": " << message;
      ++refused;
    }
  }
  // The same over the framed transport, where the agent itself is.
  auto framed = FramedConnection::Connect(master.framed_rpc(), size_t{1} << 20, std::nullopt);
  ASSERT_TRUE(framed.ok()) << framed.status().ToString();
  const Bytes heartbeat = ActingFor(id, incarnation, pool, keys[0], version, 0)[1].second;
  auto answer =
      framed->Call(std::span(heartbeat.data(), heartbeat.size()), std::chrono::seconds(10));
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  const fb::Reply* over_framed = master::testing::ParseReply(answer->data(), answer->size());
  ASSERT_NE(over_framed, nullptr);
  EXPECT_EQ(over_framed->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
  ++refused;
  const fb::Reply* stats = other.Call(master::testing::StatsMsg(), &storage);
  ASSERT_NE(stats, nullptr);
  EXPECT_EQ(master::testing::StatValue(stats, "agent_key_refusals"), refused);
  // kvmaster said why once for the agent, and once where the calls came from.
  std::stringstream said;
  said << std::ifstream(logs.path() + "/kvmaster.WARNING").rdbuf();
  auto count = [&](const std::string& text) {
    size_t n = 0;
    for (size_t at = said.str().find(text); at != std::string::npos;
         at = said.str().find(text, at + 1)) {
      ++n;
    }
    return n;
  };
  EXPECT_EQ(count("only the agent process that registered may act for it"), 1u) << said.str();
  EXPECT_EQ(count("without its agent key from 127.0.0.1"), 2u) << said.str();
  EXPECT_EQ(count(" (ZMQ) (further ones"), 1u) << said.str();
  EXPECT_EQ(count(" (framed transport) (further ones"), 1u) << said.str();

  // The agent holds its pool, its objects and its name: every value reads back, and it stores
  // more (its own calls carry its key).
  ASSERT_EQ(put(10, 20), "");
  std::vector<ArenaBuffer> buffers;
  std::vector<const ArenaBuffer*> targets;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto b = c.Allocate(4096);
    ASSERT_TRUE(b.ok());
    buffers.push_back(std::move(*b));
  }
  for (const ArenaBuffer& b : buffers) targets.push_back(&b);
  const Reply read = c.Get(keys, targets);
  ASSERT_EQ(read.keys.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(read.keys[i].code, ErrorCode::kOk) << keys[i] << ": " << read.keys[i].message;
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(buffers[i].data()), 4096), bytes[i]);
  }
  EXPECT_TRUE(agent.Running());
}

// The text of kvmaster's log file `file` in `dir` (--log-dir).
std::string LogText(const std::string& dir, const std::string& file) {
  std::stringstream said;
  said << std::ifstream(dir + "/" + file).rdbuf();
  return said.str();
}

// The agent's key binding outlives restarts: kvmaster logs it with the agent, so right after a
// kvmaster restart (the agent stalled by SIGSTOP, so it has not registered again) another
// process can neither register as the agent nor act for it; the agent's own restart on its run
// dir keeps its key and is taken as a restart at once; and an agent whose run dir (its key) was
// lost takes its name over once the old registration is silent past the TTL. Before, the
// bindings lived in kvmaster's memory: after its restart the first registration of the name and
// incarnation, whoever sent it, was taken.
TEST(AgentKey, TheBindingOutlivesRestartsOfKvmasterAndOfTheAgent) {
  TempDir state, logs;
  KvmasterProcess master({"--tick-ms", "20", "--state-dir", state.path(), "--agent-ttl-ms", "3000",
                          "--agent-dead-ms", "120000", "--log-dir", logs.path()});
  ASSERT_TRUE(master.started());
  NodeAgent agent(Concat(master.AgentArgs(), {"--agent-name", "node-a", "--heartbeat-ms", "100"}));
  ASSERT_TRUE(agent.started());
  auto client = agent.Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(client->Stat(), "agent.master_link.ready") == 1; }));
  std::vector<std::string> keys;
  for (int i = 0; i < 10; ++i) {
    keys.push_back("kept-" + std::to_string(i));
    const KeyResult r = PutValue(*client, keys.back(), Pattern(keys.back(), 4096));
    ASSERT_EQ(r.code, ErrorCode::kOk) << r.message;
  }
  MasterClient reader(master.rpc());
  std::string storage;
  const fb::Reply* got =
      reader.Call(master::testing::KeysMsg(fb::Body::BatchGet, {keys[0]}), &storage);
  ASSERT_TRUE(got != nullptr && got->body_as_PlacementReply() != nullptr);
  const fb::PoolInfo* info = got->body_as_PlacementReply()->pools()->Get(0);
  const uint32_t id = info->agent_id();
  const uint64_t incarnation = info->incarnation();
  const uint32_t pool = info->pool_id();

  // kvmaster restarts while the agent stalls: the agent is restored from the log, with its key.
  agent.Signal(SIGSTOP);
  ASSERT_TRUE(master.Restart());
  {
    MasterClient other(master.rpc());
    auto forged = ActingFor(id, incarnation, pool, keys[0], 1, 1);
    for (const std::string name : {"RegisterAgent", "Heartbeat", "MountPool"}) {
      const auto call = std::find_if(forged.begin(), forged.end(),
                                     [&](const auto& f) { return f.first == name; });
      const fb::Reply* r = other.Call(call->second, &storage);
      ASSERT_NE(r, nullptr) << name;
      EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams)) << name;
      const std::string message = r->message() ? r->message()->str() : "";
      EXPECT_NE(message.find("agent key"), std::string::npos) << name << ": " << message;
    }
    // A new incarnation under the name, with another key, while the agent is within its TTL.
    const Bytes takeover =
        Keyed(fb::Body::RegisterAgent, 1, [&](flatbuffers::FlatBufferBuilder& b) {
          return fb::CreateRegisterAgent(b, b.CreateString("node-a"), incarnation + 2);
        });
    const fb::Reply* r = other.Call(takeover, &storage);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kInvalidParams));
    EXPECT_NE(
        std::string(r->message() ? r->message()->c_str() : "").find("held by a running agent"),
        std::string::npos);
  }
  EXPECT_EQ(MasterStat(master.rpc(), "agent_key_refusals"), 3u);
  EXPECT_EQ(MasterStat(master.rpc(), "name_conflicts"), 1u);
  agent.Signal(SIGCONT);
  ASSERT_TRUE(WaitUntil([&] {
    return MasterStat(master.rpc(), "pools") == 1 &&
           CounterOf(client->Stat(), "agent.master_link.ready") == 1;
  }));
  for (const std::string& k : keys) {
    const Read r = GetValue(*client, k, 4096);
    ASSERT_EQ(r.code, ErrorCode::kOk) << k << ": " << r.message;
    EXPECT_EQ(r.bytes, Pattern(k, 4096)) << k;
  }

  // The agent restarts on its run dir: the same key, so kvmaster takes the new incarnation for
  // its restart, with no refusal.
  client.reset();
  ASSERT_TRUE(agent.Restart());
  client = agent.Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(client->Stat(), "agent.master_link.ready") == 1; }));
  EXPECT_EQ(MasterStat(master.rpc(), "name_conflicts"), 1u);
  EXPECT_EQ(MasterStat(master.rpc(), "agents"), 1u);
  EXPECT_NE(LogText(logs.path(), "kvmaster.INFO").find("agent node-a restarted (incarnation"),
            std::string::npos);
  const KeyResult after = PutValue(*client, "after-restart", Pattern("after-restart", 4096));
  ASSERT_EQ(after.code, ErrorCode::kOk) << after.message;

  // Its run dir lost (a reboot): a new key, which takes the name once the old registration is
  // silent past the TTL.
  client.reset();
  agent.Kill();
  ASSERT_TRUE(std::filesystem::remove(agent.run_dir() + "/agent.key"));
  ASSERT_TRUE(agent.Start());
  client = agent.Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(client->Stat(), "agent.master_link.ready") == 1; },
                        std::chrono::seconds(30)));
  EXPECT_EQ(MasterStat(master.rpc(), "agents"), 1u);
  EXPECT_NE(LogText(logs.path(), "kvmaster.WARNING").find("takes the name over from incarnation"),
            std::string::npos);
  const KeyResult last = PutValue(*client, "after-reboot", Pattern("after-reboot", 4096));
  ASSERT_EQ(last.code, ErrorCode::kOk) << last.message;
}

}  // namespace
}  // namespace kvagent::testing

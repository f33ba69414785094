// Acting for another agent at kvmaster: a process that reaches kvmaster's RPC (a member of the
// cluster, or anyone where there is no cluster secret) and knows a running agent's name, id and
// incarnation (the incarnation travels to every reader in PlacementReply.pools) sends the calls
// only that agent may make. Each one is refused, because it does not carry the agent key the
// agent's own registration bound (master.fbs RegisterAgent), and the agent goes on serving.
// Before the key, kvmaster took each of them: the registration returned the agent's id, the
// heartbeat acknowledged its fences (freeing space a write still in flight may land in), the
// mount moved its pool to another endpoint, the writes and reports acted in its name.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

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

}  // namespace
}  // namespace kvagent::testing

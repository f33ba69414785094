// The request pipeline of a kvagent linked to a real kvmaster process: the round trip, a
// master that dies with calls in flight and comes back, a master that is not there at start,
// a peer whose data port dies while it holds replicas, and a get that has to read another
// replica than the first.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "master_stats.h"
#include "master_transports.h"
#include "pipeline_support.h"

namespace kvagent::testing {
namespace {

// An agent of `master`, its data plane on loopback (what peers reach it on in these tests).
Args RemoteAgentArgs(const KvmasterProcess& master, Args extra = {}) {
  return Concat(Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0"}), extra);
}

Reply PutOne(Client& c, const std::string& key, const std::string& value,
             const std::string& session = "", uint8_t replicas = 1) {
  std::vector<std::string> keys = {key}, sessions = {session};
  std::vector<Value> values = {Value(std::string_view(value))};
  CallOptions o;
  if (!session.empty()) o.session_ids = sessions;
  o.write.replica_count = replicas;
  return c.Put(keys, values, o);
}

std::string GetOne(Client& c, const std::string& key, size_t capacity, ErrorCode* code = nullptr) {
  auto buffer = c.Allocate(capacity);
  if (!buffer.ok()) return "";
  std::vector<std::string> keys = {key};
  std::vector<const ArenaBuffer*> targets = {&*buffer};
  Reply r = c.Get(keys, targets);
  if (code != nullptr) *code = r.keys.empty() ? r.status.code() : r.keys[0].code;
  if (r.keys.empty() || r.keys[0].code != ErrorCode::kOk) return "";
  return std::string(reinterpret_cast<const char*>(buffer->data()), r.keys[0].length);
}

bool Exists(Client& c, const std::string& key) {
  std::vector<std::string> keys = {key};
  Reply r = c.Exist(keys);
  return r.ok() && r.keys.size() == 1 && r.keys[0].exists;
}

// A kvmaster, one agent of it and a client of that agent (members start in this order); with
// `framed`, the agent speaks the master's framed transport (--master-transport framed).
struct OneAgentCluster {
  explicit OneAgentCluster(bool framed = false) : master({}, framed) {}
  KvmasterProcess master;
  AgentProcess agent{RemoteAgentArgs(master)};
  std::unique_ptr<Client> client = Connect(agent);
  bool started() const { return master.started() && agent.started() && client != nullptr; }
};

// The tests below run with each transport between the agent and kvmaster: ZMQ (--listen) and
// the framed one (--framed-listen, --master-transport framed).
using RemoteTransports = kvagent::testing::MasterTransports;
INSTANTIATE_TEST_SUITE_P(Transports, RemoteTransports, kvagent::testing::kMasterTransports,
                         kvagent::testing::MasterTransportName);

TEST_P(RemoteTransports, EveryOpRoundTripsThroughAKvmaster) {
  OneAgentCluster cluster(framed());
  ASSERT_TRUE(cluster.started());
  Client* c = cluster.client.get();
  const std::string big = Pattern("big", 1 << 20);
  ASSERT_EQ(PutOne(*c, "big", big, "sess-α").keys.at(0).code, ErrorCode::kOk);
  ASSERT_EQ(PutOne(*c, "small", "bytes").keys.at(0).code, ErrorCode::kOk);
  EXPECT_EQ(PutOne(*c, "small", "other").keys.at(0).code, ErrorCode::kObjectAlreadyExists);
  EXPECT_TRUE(GetOne(*c, "big", 1 << 20) == big);
  EXPECT_EQ(GetOne(*c, "small", 64), "bytes");
  EXPECT_TRUE(Exists(*c, "big"));
  ListOptions lo;
  lo.prefix = "b";
  Reply listed = c->List(lo);
  ASSERT_TRUE(listed.ok()) << listed.status.ToString();
  ASSERT_EQ(listed.listed.size(), 1u);
  EXPECT_EQ(listed.listed[0].key, "big");
  EXPECT_EQ(listed.listed[0].session_id, "sess-α");
  std::vector<std::string> keys = {"small"};
  CallOptions force;
  force.force = true;  // the get above holds a read lease
  EXPECT_EQ(c->Remove(keys).keys.at(0).code, ErrorCode::kObjectHasLease);
  EXPECT_EQ(c->Remove(keys, force).keys.at(0).code, ErrorCode::kOk);
  EXPECT_FALSE(Exists(*c, "small"));
  Reply st = c->Stat();
  std::string link;
  EXPECT_EQ(CounterOf(st, "agent.master_link", &link), 1u);
  EXPECT_NE(link.find(framed() ? cluster.master.framed_rpc() : cluster.master.rpc()),
            std::string::npos)
      << link;
  EXPECT_EQ(CounterOf(st, "master.keys"), 1u);
  EXPECT_EQ(c->RemoveAll(force).removed_count, 1u);
}

TEST_P(RemoteTransports, TheAgentRelaysTheMastersEventsWithEachWritersSession) {
  KvmasterProcess master({}, framed());
  ASSERT_TRUE(master.started());
  AgentProcess agent(RemoteAgentArgs(master));
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_EQ(PutOne(*c, "r1", "a", "sess-1").keys.at(0).code, ErrorCode::kOk);
  ASSERT_EQ(PutOne(*c, "r2", "b", "sesión-2").keys.at(0).code, ErrorCode::kOk);
  const SeenEvents seen = CollectStored(agent.run_dir(), {"r1", "r2"});
  EXPECT_TRUE(seen.started_with_clear);
  ASSERT_EQ(seen.stored.size(), 2u);
  EXPECT_EQ(seen.stored.at("r1").session_id, "sess-1");
  EXPECT_EQ(seen.stored.at("r2").session_id, "sesión-2");
  // kvctl stat shows the relay: live, and it has published (its own seq moved on). The relay
  // publishes the re-announce's last batch a moment before it reports itself live, so a Stat
  // right after the events arrived may still say "syncing": wait (bounded) for the phase.
  std::string phase;
  Reply stat;
  EXPECT_TRUE(WaitUntil([&] {
    stat = c->Stat();
    CounterOf(stat, "agent.relay.phase", &phase);
    return phase == "live";
  })) << "relay phase "
      << phase;
  // At least the batch that carried AllBlocksCleared and the stores (one batch may hold all).
  EXPECT_GE(CounterOf(stat, "agent.relay.next_seq"), 1u);
}

TEST(Remote, AnAgentThatJoinsLaterAnnouncesStoredBlocksWithTheirWritersMetadata) {
  KvmasterProcess master;
  ASSERT_TRUE(master.started());
  AgentProcess writer(RemoteAgentArgs(master));
  ASSERT_TRUE(writer.started());
  auto c = Connect(writer);
  ASSERT_TRUE(c);
  std::vector<std::string> keys = {"block-a"}, sessions = {"sess-meta"};
  const std::string value = "kv";
  std::vector<Value> values = {Value(std::string_view(value))};
  std::vector<BlockMetadata> blocks(1);
  blocks[0].block_hashes = {1111, 2222};
  blocks[0].has_parent = true;
  blocks[0].parent_block_hash = 999;
  blocks[0].block_size = 2;
  blocks[0].token_ids = {1, 2, 3, 4};
  CallOptions o;
  o.session_ids = sessions;
  o.blocks = blocks;
  ASSERT_EQ(c->Put(keys, values, o).keys.at(0).code, ErrorCode::kOk);
  // The late agent never saw the live event: its relay announces the store's content, which it
  // lists through its master link.
  AgentProcess late(RemoteAgentArgs(master));
  ASSERT_TRUE(late.started());
  const SeenEvents seen = CollectStored(late.run_dir(), {"block-a"});
  EXPECT_TRUE(seen.started_with_clear);
  ASSERT_EQ(seen.stored.count("block-a"), 1u);
  const events::BlockStored& e = seen.stored.at("block-a");
  EXPECT_EQ(e.block_hashes, (std::vector<events::BlockHash>{events::BlockHash::Unsigned(1111),
                                                            events::BlockHash::Unsigned(2222)}));
  ASSERT_TRUE(e.parent_block_hash.has_value());
  EXPECT_EQ(e.parent_block_hash->bits, 999u);
  EXPECT_EQ(e.token_ids, (std::vector<uint32_t>{1, 2, 3, 4}));
  EXPECT_EQ(e.block_size, 2u);
  EXPECT_EQ(e.session_id, "sess-meta");
}

TEST_P(RemoteTransports, KvmasterKilledWithCallsInFlightFailsThemAndTheAgentComesBackWithIt) {
  TempDir state;
  KvmasterProcess master({"--state-dir", state.path()}, framed());
  ASSERT_TRUE(master.started());
  AgentProcess agent(
      RemoteAgentArgs(master, {"--heartbeat-ms", "100", "--master-timeout-ms", "3000"}));
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  const std::string before = Pattern("before", 100000);
  ASSERT_EQ(PutOne(*c, "before", before).keys.at(0).code, ErrorCode::kOk);

  // Calls in flight at the master when it dies: it is stopped, so they wait there.
  master.Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntil([&] { return IsStopped(master.pid()); }));
  std::vector<std::vector<std::string>> keys = {{"during-0"}, {"during-1"}, {"during-2"}};
  const std::string value = "v";
  std::vector<Value> values = {Value(std::string_view(value))};
  std::vector<PendingCall> calls;
  for (auto& k : keys) calls.push_back(c->SubmitPut(k, values));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let them reach the master
  const auto killed_at = std::chrono::steady_clock::now();
  master.Kill();
  for (auto& call : calls) {
    Reply r = call.Wait();
    EXPECT_EQ(r.status.code(), ErrorCode::kMasterUnavailable) << r.status.ToString();
    ASSERT_EQ(r.keys.size(), 1u);
    EXPECT_EQ(r.keys[0].code, ErrorCode::kMasterUnavailable);
    EXPECT_NE(r.keys[0].message.find("retry"), std::string::npos) << r.keys[0].message;
  }
  std::printf("in-flight calls failed %lld ms after the SIGKILL\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - killed_at)
                                         .count()));
  // While it is down, calls fail at once instead of waiting.
  EXPECT_EQ(PutOne(*c, "while-down", "v").status.code(), ErrorCode::kMasterUnavailable);

  ASSERT_TRUE(master.Restart());
  // The link reconnects with backoff; each attempt below fails fast until it is back.
  EXPECT_TRUE(WaitUntil([&] { return PutOne(*c, "after", "v").keys.at(0).code == ErrorCode::kOk; },
                        std::chrono::seconds(60)));
  // Re-registered with the same name and incarnation: the restored replica in our pool is ours
  // again and readable.
  EXPECT_TRUE(GetOne(*c, "before", 100000) == before);
  Reply st = c->Stat();
  EXPECT_GE(CounterOf(st, "agent.master_link.registrations"), 2u);
  EXPECT_GE(CounterOf(st, "agent.master_link.failed_in_flight"), 1u);  // batched: calls <= requests
}

TEST(Remote, AgentExpiredByItsMasterRegistersAgainAtItsNextHeartbeat) {
  KvmasterProcess master({"--agent-ttl-ms", "300", "--agent-dead-ms", "600", "--tick-ms", "20"});
  ASSERT_TRUE(master.started());
  AgentProcess agent(
      RemoteAgentArgs(master, {"--heartbeat-ms", "50", "--master-timeout-ms", "5000"}));
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_EQ(PutOne(*c, "k", "v").keys.at(0).code, ErrorCode::kOk);
  // Silent for longer than the dead timeout: the master drops the agent (and its pool).
  agent.Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntil([&] { return IsStopped(agent.pid()); }));
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "expired_agents") >= 1; }));
  agent.Signal(SIGCONT);
  // The next heartbeat answers known=false; the agent registers and mounts again.
  EXPECT_TRUE(
      WaitUntil([&] { return CounterOf(c->Stat(), "agent.master_link.registrations") >= 2; }));
  EXPECT_TRUE(WaitUntil([&] { return PutOne(*c, "k2", "v2").keys.at(0).code == ErrorCode::kOk; }));
  EXPECT_EQ(GetOne(*c, "k2", 8), "v2");
  const Reply st = c->Stat();
  EXPECT_EQ(CounterOf(st, "master.agents"), 1u);
  EXPECT_GE(CounterOf(st, "master.expired_agents"), 1u);
}

TEST_P(RemoteTransports, AgentStartedBeforeItsKvmasterServesDegradedUntilTheMasterComes) {
  KvmasterProcess master({}, framed());
  ASSERT_TRUE(master.started());
  master.Kill();  // its address is now known and nobody listens there
  AgentProcess agent(RemoteAgentArgs(master, {"--master-ready-wait-ms", "0"}));
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  Reply down = PutOne(*c, "k", "v");
  EXPECT_EQ(down.status.code(), ErrorCode::kMasterUnavailable);
  EXPECT_NE(down.status.message().find("not reachable"), std::string::npos)
      << down.status.message();
  ASSERT_TRUE(master.Restart());
  EXPECT_TRUE(WaitUntil([&] { return PutOne(*c, "k", "v").keys.at(0).code == ErrorCode::kOk; },
                        std::chrono::seconds(60)));
  EXPECT_EQ(GetOne(*c, "k", 8), "v");
}

// Scenario 7 of the integrity issue: an agent died and its master has not noticed yet; puts
// asking for two replicas keep succeeding with the replica that was written.
TEST(Remote, ReplicasOnAPeerWhoseDataPortDiedAreDroppedAndThePutsSucceedWithTheRest) {
  KvmasterProcess master({"--agent-ttl-ms", "60000"});
  ASSERT_TRUE(master.started());
  AgentProcess writer(RemoteAgentArgs(master, {"--data-peer-timeout-ms", "2000"}));
  ASSERT_TRUE(writer.started());
  // The peer's pool is 1 MiB (the smallest pool a master mounts), which also caps the
  // master's part size at 1 MiB. A 1 MiB value is one part that needs the whole pool: once a
  // small value took some of it, large values get their second replica nowhere (best effort)
  // and small ones get it on the peer.
  AgentProcess peer(RemoteAgentArgs(master, {"--pool-size", "1MiB", "--pool-huge-pages=false"}));
  ASSERT_TRUE(peer.started());
  auto c = Connect(writer);
  ASSERT_TRUE(c);
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "master.pools") == 2; }));
  peer.Kill();  // its data port is gone; the master still lists its pool

  const std::vector<std::string> keys = {"small-0", "large-1", "small-2", "large-3"};
  const std::vector<std::string> sessions = {"s0", "s1", "s2", "s3"};
  std::vector<std::string> bytes;
  std::vector<Value> values;
  for (const auto& k : keys) bytes.push_back(Pattern(k, k[0] == 's' ? 4096 : 1 << 20));
  for (const auto& b : bytes) values.emplace_back(std::string_view(b));
  CallOptions o;
  o.session_ids = sessions;
  o.write.replica_count = 2;
  Reply r = c->Put(keys, values, o);
  ASSERT_TRUE(r.ok()) << r.status.ToString();
  ASSERT_EQ(r.keys.size(), 4u);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(r.keys[i].code, ErrorCode::kOk) << keys[i] << ": " << r.keys[i].message;
    EXPECT_EQ(r.keys[i].replicas, 1u) << keys[i];  // the peer's replica could not be written
    EXPECT_TRUE(GetOne(*c, keys[i], keys[i][0] == 's' ? 4096 : 1 << 20) == bytes[i]) << keys[i];
  }
  std::map<std::string, std::string> tags;
  for (const auto& k : c->List().listed) tags[k.key] = k.session_id;
  EXPECT_EQ(tags, (std::map<std::string, std::string>{
                      {"small-0", "s0"}, {"large-1", "s1"}, {"small-2", "s2"}, {"large-3", "s3"}}));
  Reply st = c->Stat();
  EXPECT_EQ(CounterOf(st, "agent.degraded_puts"), 4u);
  EXPECT_EQ(CounterOf(st, "agent.revoked_keys"), 0u);
  EXPECT_EQ(CounterOf(st, "master.writes_in_flight"), 0u);
}

TEST(Remote, APutWhoseDeadlinePassedWhileTheMasterStalledIsRevokedNotCommitted) {
  OneAgentCluster cluster;
  ASSERT_TRUE(cluster.started());
  Client* c = cluster.client.get();
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "master.pools") == 1; }));

  cluster.master.Signal(SIGSTOP);  // the agent's BatchPutStart waits in the master's socket
  ASSERT_TRUE(WaitUntil([&] { return IsStopped(cluster.master.pid()); }));
  std::vector<std::string> keys = {"slow"}, sessions = {"s-slow"};
  const std::string value = Pattern("slow", 4096);
  std::vector<Value> values = {Value(std::string_view(value))};
  CallOptions o;
  o.session_ids = sessions;
  o.timeout = std::chrono::milliseconds(200);
  EXPECT_EQ(c->Put(keys, values, o).status.code(), ErrorCode::kTimeout);
  cluster.master.Signal(SIGCONT);

  // The placements arrive after the deadline: the agent revokes instead of copying and ending.
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.expired_keys") == 1; }));
  Reply st = c->Stat();
  EXPECT_EQ(CounterOf(st, "agent.revoked_keys"), 1u);
  EXPECT_EQ(CounterOf(st, "master.writes_in_flight"), 0u);
  EXPECT_FALSE(Exists(*c, "slow"));
  // The same put again, in time, stores it.
  o.timeout = std::chrono::milliseconds(0);
  Reply again = c->Put(keys, values, o);
  ASSERT_EQ(again.keys.size(), 1u);
  EXPECT_EQ(again.keys[0].code, ErrorCode::kOk) << again.keys[0].message;
}

TEST(Remote, AGetWhosePeerReplicaIsDeadReadsTheNextReplicaAndFailsOnlyWhenNoneAnswers) {
  KvmasterProcess master({"--agent-ttl-ms", "60000"});
  ASSERT_TRUE(master.started());
  // Two agents, so a value with two replicas has one on each (the writer's own pool first).
  AgentProcess writer(RemoteAgentArgs(master));
  ASSERT_TRUE(writer.started());
  AgentProcess holder(RemoteAgentArgs(master));
  ASSERT_TRUE(holder.started());
  {
    auto w = Connect(writer);
    ASSERT_TRUE(w);
    ASSERT_TRUE(WaitUntil([&] { return CounterOf(w->Stat(), "master.pools") == 2; }));
    Reply put = PutOne(*w, "twice", Pattern("twice", 8192), "s-twice", /*replicas=*/2);
    ASSERT_TRUE(put.ok() && put.keys[0].code == ErrorCode::kOk) << put.keys[0].message;
  }
  // A reader that joins afterwards holds no replica; the writer's data port dies, but with a
  // 60 s TTL the master still lists the writer's replica (first, as it was placed first).
  AgentProcess reader(RemoteAgentArgs(master, {"--data-peer-timeout-ms", "2000"}));
  ASSERT_TRUE(reader.started());
  auto c = Connect(reader);
  ASSERT_TRUE(c);
  writer.Kill();

  ErrorCode code = ErrorCode::kInternal;
  EXPECT_EQ(GetOne(*c, "twice", 8192, &code), Pattern("twice", 8192));
  EXPECT_EQ(code, ErrorCode::kOk);
  Reply st = c->Stat();
  EXPECT_EQ(CounterOf(st, "agent.replica_fallbacks"), 1u);
  EXPECT_EQ(CounterOf(st, "agent.transfer_failures"), 0u);

  holder.Kill();  // now no replica answers
  EXPECT_EQ(GetOne(*c, "twice", 8192, &code), "");
  EXPECT_EQ(code, ErrorCode::kTransferFailed);
  st = c->Stat();
  EXPECT_EQ(CounterOf(st, "agent.replica_fallbacks"), 2u);
  EXPECT_EQ(CounterOf(st, "agent.transfer_failures"), 1u);
}

}  // namespace
}  // namespace kvagent::testing

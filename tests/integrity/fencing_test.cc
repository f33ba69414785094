// Writes that must never land where they no longer belong: a write held by the network past its
// failure (scenario 2 of the integrity issue), and two masters serving at once after a failover
// with the primary still alive (scenario 3). Each data-plane write names its pool, its master's
// epoch and its write; the pool refuses what was fenced or placed by another master.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <thread>

#include "integrity_support.h"
#include "tcp_proxy.h"

namespace kvagent::testing {
namespace {

// kvmaster and two agents: a peer that listens on 127.0.0.1 and advertises 127.0.0.2, where
// `path` forwards to it (the network between the agents), and a second agent started with
// `flags` (its data-plane flags), which reaches the peer through `path`.
struct PeerBehindAPath {
  explicit PeerBehindAPath(const Args& flags) {
    if (!master.started()) return;
    peer.emplace(
        Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0", "--data-advertise-host",
                                    "127.0.0.2", "--heartbeat-ms", "200"}));
    if (!peer->started() || !(cp = peer->Connect())) return;
    std::string endpoint;
    CounterOf(cp->Stat(), "agent.data_endpoint", &endpoint);
    const uint16_t port = PortOf(endpoint);
    path.emplace("127.0.0.2", port, port);
    if (!path->ok()) return;
    other.emplace(Concat(master.AgentArgs(), Concat({"--data-listen", "127.0.0.1:0"}, flags)));
    if (!other->started() || !(co = other->Connect())) return;
    ready = WaitUntil([&] { return MasterStat(master.rpc(), "pools") == 2; });
  }
  KvmasterProcess master{std::vector<std::string>{"--agent-ttl-ms", "60000"}};
  std::optional<NodeAgent> peer;
  std::unique_ptr<Client> cp;  // the peer's client
  std::optional<TcpProxy> path;
  std::optional<NodeAgent> other;
  std::unique_ptr<Client> co;  // the other agent's client
  bool ready = false;
};

// A put with two replicas whose write to the peer is held by the network until it timed out:
// the put commits with the writer's replica, the peer's replica is fenced, its space goes to a
// new value; when the held bytes finally arrive the peer refuses them, and the new value reads
// back with its own bytes (on the old code it read back OK with the failed put's bytes).
TEST(Fencing, AWriteHeldByTheNetworkPastItsFailureNeverLandsOnTheNextValue) {
  PeerBehindAPath nodes({"--data-peer-timeout-ms", "1000"});  // the other agent writes
  ASSERT_TRUE(nodes.ready);
  KvmasterProcess& master = nodes.master;
  Client* cp = nodes.cp.get();
  Client* cw = nodes.co.get();
  TcpProxy& path = *nodes.path;

  const std::string first = Pattern("first", 64 << 10);
  path.Hold();
  const KeyResult put = PutValue(*cw, "first", first, 2);
  EXPECT_EQ(put.code, ErrorCode::kOk) << put.message;
  EXPECT_EQ(put.replicas, 1u);           // the peer's replica timed out
  ASSERT_GT(path.kept(), first.size());  // the held write (header and payload)
  // The peer fences the failed write; then its space is free again.
  ASSERT_TRUE(WaitUntil([&] {
    auto st = MasterStats(master.rpc());
    return st && (*st)["pending_fences"] == 0 && (*st)["fenced_bytes"] == 0;
  }));
  const std::string second = Pattern("second", 64 << 10);
  ASSERT_EQ(PutValue(*cp, "second", second, 1).code, ErrorCode::kOk);
  // It took the very range the failed replica had: the peer's pool held nothing else.
  const auto second_at = PlacementsOf(master.rpc(), "second");
  ASSERT_EQ(second_at.size(), 1u);
  EXPECT_EQ(second_at[0].offset, 0u);

  auto served = [&](const char* what) {
    return CounterOf(cp->Stat(), std::string("agent.data.served_") + what);
  };
  const uint64_t fenced_before = served("fenced");
  const uint64_t handled_before = served("writes") + served("rejected");
  path.Release();  // the held bytes reach the peer at last
  ASSERT_TRUE(WaitUntil([&] { return path.kept() == 0; }));
  ASSERT_TRUE(WaitUntil([&] { return served("writes") + served("rejected") > handled_before; }));
  EXPECT_GT(served("fenced"), fenced_before);
  const Read r = GetValue(*cp, "second", 64 << 10);
  EXPECT_EQ(r.code, ErrorCode::kOk) << r.message;
  EXPECT_TRUE(r.bytes == second) << "the held write of 'first' landed on 'second'";
  const Read f = GetValue(*cw, "first", 64 << 10);
  EXPECT_TRUE(f.code == ErrorCode::kOk && f.bytes == first);
}

// A get whose bytes a peer sends late: the network holds the reader's request to the peer past
// the call's deadline. The caller must never have its buffer written after its call returned,
// whatever the call answered: it may reuse the buffer for its next get at once, and a late write
// then puts this value's bytes under the other key's OK. Before the call word, the call returned
// TIMEOUT at its deadline and the peer's bytes landed in the buffer a second later.
TEST(Fencing, ABufferIsNeverWrittenAfterItsGetReturnedEvenWhenThePeersBytesComeLate) {
  PeerBehindAPath nodes({"--data-peer-timeout-ms", "10000"});  // the other agent reads
  ASSERT_TRUE(nodes.ready);

  const size_t size = 64 << 10;
  const std::string value = Pattern("late", size);
  ASSERT_EQ(PutValue(*nodes.cp, "late", value, 1).code, ErrorCode::kOk);
  ASSERT_EQ(PlacementsOf(nodes.master.rpc(), "late").size(), 1u);  // on the peer only

  auto buffer = nodes.co->Allocate(size);
  ASSERT_TRUE(buffer.ok());
  std::memset(buffer->data(), 0, size);
  const std::vector<std::string> keys = {"late"};
  const std::vector<const ArenaBuffer*> targets = {&*buffer};
  CallOptions o;
  o.timeout = std::chrono::milliseconds(300);
  nodes.path->Hold();
  PendingCall call = nodes.co->SubmitGet(keys, targets, o);
  // The reader's request reaches the peer a second after the deadline; its bytes follow.
  std::thread heal([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1300));
    nodes.path->Release();
  });
  const Reply r = call.Wait();
  ASSERT_EQ(r.keys.size(), 1u);
  if (r.keys[0].code == ErrorCode::kOk) {  // an OK get has the whole value
    EXPECT_TRUE(std::memcmp(buffer->data(), value.data(), size) == 0);
  }
  const std::string mark(size, '\xEE');
  std::memcpy(buffer->data(), mark.data(), size);  // the caller's next use of its buffer
  heal.join();
  // The reader is done with the peer's answer (or gave up on it) before the buffer is judged.
  ASSERT_TRUE(WaitUntil([&] {
    return CounterOf(nodes.co->Stat(), "agent.bytes_from_peers") >= size ||
           CounterOf(nodes.co->Stat(), "agent.transfer_failures") > 0;
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(std::memcmp(buffer->data(), mark.data(), size) == 0)
      << "the peer's bytes landed in the buffer after the get returned "
      << ErrorCodeName(r.keys.empty() ? r.status.code() : r.keys[0].code);
  // It answered the value, or TIMEOUT without it.
  EXPECT_TRUE(r.keys[0].code == ErrorCode::kOk || r.keys[0].code == ErrorCode::kTimeout)
      << ErrorCodeName(r.keys[0].code) << ": " << r.keys[0].message;
  // Read again, untouched by the network now: the value is whole.
  const Read again = GetValue(*nodes.co, "late", size);
  EXPECT_EQ(again.code, ErrorCode::kOk) << again.message;
  EXPECT_TRUE(again.bytes == value);
}

// A standby promoted while the primary was stopped for 2.5 s; the primary comes back; the
// master address of one agent (the pool both masters know) moves to the new master, as a
// virtual IP would. Both masters then serve and place writes: no get, through either, may
// answer OK with bytes written through the other (on the old code, 500 of 500 did).
TEST(Fencing, TwoMastersServingAtOnceNeverMixTheirWritersBytes) {
  TempDir s1, s2;
  KvmasterProcess m1({"--state-dir", s1.path(), "--agent-ttl-ms", "60000"});
  ASSERT_TRUE(m1.started());
  auto m2 = KvmasterProcess::FollowerOf(m1, {"--state-dir", s2.path(), "--agent-ttl-ms", "60000",
                                             "--status-file", s2.path() + "/status"});
  // The shared pool reaches its master through a "virtual IP" (a proxy that can move).
  TcpProxy master_vip("127.0.0.2", 0, PortOf(m1.rpc()));
  ASSERT_TRUE(master_vip.ok());
  const uint16_t vip = master_vip.port();
  auto agent_args = [](const std::string& rpc, const KvmasterProcess& events) {
    return Args{"--master",
                rpc,
                "--master-events",
                events.events(),
                "--master-events-replay",
                events.replay(),
                "--data-listen",
                "127.0.0.1:0",
                "--data-peer-timeout-ms",
                "2000",
                "--master-timeout-ms",
                "1000",
                "--master-ready-wait-ms",
                "0"};
  };
  NodeAgent pool(agent_args("tcp://127.0.0.2:" + std::to_string(vip), m1));
  // The writers' own pools are tiny (the smallest a master mounts): most of their values live
  // in the shared pool, where both masters place them (and where a reader finds them).
  const Args tiny = {"--pool-size", "1MiB", "--pool-huge-pages=false"};
  NodeAgent a(Concat(agent_args(m1.rpc(), m1), tiny));
  ASSERT_TRUE(pool.started() && a.started());
  auto ca = a.Connect();
  ASSERT_TRUE(ca);
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(m1.rpc(), "pools") == 2; }));
  std::map<std::string, std::string> written;  // key -> bytes, by whoever was told OK
  auto put = [&](Client& c, const std::string& key) {
    const std::string value = Pattern(key, 16 << 10);
    const KeyResult r = PutValue(c, key, value, 2);
    if (r.code == ErrorCode::kOk) written[key] = value;
    return r;
  };
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(put(*ca, "before-" + std::to_string(i)).code, ErrorCode::kOk);
  }
  // The standby has everything.
  const uint64_t last = MasterStat(m1.rpc(), "replication_last_seq");
  ASSERT_TRUE(WaitUntil([&] {
    std::ifstream in(s2.path() + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("applied_seq=", 0) == 0 && std::stoull(line.substr(12)) >= last) return true;
    }
    return false;
  }));

  m1.Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntil([&] { return IsStopped(m1.pid()); }));
  m2->Signal(SIGUSR1);
  ASSERT_TRUE(m2->WaitServing());
  master_vip.Retarget(PortOf(m2->rpc()));  // the pool's master address now reaches m2
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  m1.Signal(SIGCONT);
  // The pool registers with m2 (same incarnation: m2 knows it from the primary's log).
  ASSERT_TRUE(WaitUntil(
      [&] { return CounterOf(pool.Connect()->Stat(), "agent.master_link.registrations") >= 2; }));
  NodeAgent b(Concat(agent_args(m2->rpc(), *m2), tiny));
  ASSERT_TRUE(b.started());
  auto cb = b.Connect();
  ASSERT_TRUE(cb);
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(cb->Stat(), "agent.master_link.ready") == 1; }));

  // Both sides write 500 values with two replicas each, at the same time.
  std::map<std::string, std::string> written_b;
  auto side_b = std::async(std::launch::async, [&] {
    for (int i = 0; i < 500; ++i) {
      const std::string key = "b-" + std::to_string(i), value = Pattern(key, 16 << 10);
      if (PutValue(*cb, key, value, 2).code == ErrorCode::kOk) written_b[key] = value;
    }
  });
  for (int i = 0; i < 500; ++i) put(*ca, "a-" + std::to_string(i));
  side_b.get();
  written.insert(written_b.begin(), written_b.end());
  EXPECT_GT(written_b.size(), 400u);  // through the master the pool is registered with

  // Every acknowledged value, read through both sides: OK only with its own bytes.
  int ok_wrong = 0, ok_right = 0;
  for (Client* c : {ca.get(), cb.get()}) {
    for (const auto& [key, value] : written) {
      const Read r = GetValue(*c, key, 16 << 10);
      if (r.code != ErrorCode::kOk) continue;
      (r.bytes == value ? ok_right : ok_wrong) += 1;
    }
  }
  EXPECT_EQ(ok_wrong, 0);
  EXPECT_GT(ok_right, 500);
  // The pool refused what the master it left placed in it.
  EXPECT_GT(CounterOf(pool.Connect()->Stat(), "agent.data.served_fenced"), 0u);
}

}  // namespace
}  // namespace kvagent::testing

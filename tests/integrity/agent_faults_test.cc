// Faults on the agents in a row, under load: three agents and a kvmaster, a writer and a reader
// on every agent (puts with two replicas, gets of keys any agent wrote, so reads cross the data
// plane), and one fault at a time on a random agent — kill -9 and a restart on the same run dir
// and data port, SIGSTOP past the TTL then SIGCONT, bytes flipped in its pool, its data traffic
// held by the network past the peers' timeout and then delivered (stale writes arriving late),
// bytes damaged on their way to and from it (a bad link) — or a stall of kvmaster, or kvmaster
// killed and restarted on its state dir. Counted over the whole run: what was acknowledged, what
// came back.
//
// What must hold:
// - no get ever answers OK with bytes other than the key's (during the run and at the end);
// - an acknowledged put stays readable unless, since it started, as many distinct agents as it
//   had replicas written lost their memory (killed) or had bytes flipped (its replicas may have
//   been those); stalls of an agent or of kvmaster, kvmaster's restarts, held traffic and bytes
//   damaged on the way lose nothing.
//
// A finding of 2026-12-05, explained: in some runs of 30 rounds, one or two keys acknowledged with
// two replicas were gone at the end though only one agent that could hold them had been killed
// since their put, each time a key put within moments of an agent's kill. The test recorded the
// kill before it happened, and asked the agent for its counters (a client connection and a
// call: milliseconds) between the record and the kill: a put that started in that window, and
// so was counted as starting after the kill, could still write its second replica into the
// process about to be killed. Its key then went with the first replica's agent, killed later:
// a loss the faults explain. The kill is now recorded once the process is gone. (An unrelated
// loss of the same run, explained and fixed before: the proxies' sockets were not close-on-exec,
// so agents the test started held copies of them and a client kept talking to a restarted
// peer's first process.)
//
// `make test` runs a few rounds (each kind once); KVAGENT_SOAK_ROUNDS=N sets the number (`make
// soak` runs more).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "integrity_support.h"
#include "tcp_proxy.h"

#ifndef KVAGENT_AGENT_FAULT_ROUNDS
#define KVAGENT_AGENT_FAULT_ROUNDS 7
#endif

namespace kvagent::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kAgents = 3;
// Few enough bytes that the pools (3 x 48 MiB) stay far below their eviction watermark: a key
// may only go because of the faults.
constexpr int kKeysPerWriter = 500;
constexpr size_t kSizes[] = {4096, 8192, 16384, 20000 + 7};

int Rounds() {
  const char* v = std::getenv("KVAGENT_SOAK_ROUNDS");
  return v != nullptr && *v != '\0' ? std::atoi(v) : KVAGENT_AGENT_FAULT_ROUNDS;
}

struct Acked {
  std::string key;
  size_t size = 0;
  uint32_t replicas = 0;
  size_t faults_before = 0;  // destructive faults recorded when its put started
  int round_started = 0;     // the fault round under way when its put started, and ended
  int round_acked = 0;
};

std::atomic<int> g_round{0};  // the fault round under way (for the report of a lost key)

// What the load saw; shared by the load threads and the test.
class Ledger {
 public:
  size_t DestructiveFaults() {
    std::lock_guard<std::mutex> lock(mu_);
    return destructive_.size();
  }
  void RecordDestructive(int agent) {
    std::lock_guard<std::mutex> lock(mu_);
    destructive_.push_back(agent);
  }
  void RecordAck(Acked a) {
    std::lock_guard<std::mutex> lock(mu_);
    acked_.push_back(std::move(a));
  }
  // A put that was not acknowledged, with the code it got.
  void RecordFailure(const Acked& a, ErrorCode code) {
    std::lock_guard<std::mutex> lock(mu_);
    failed_.emplace_back(a, code);
  }
  std::vector<std::pair<Acked, ErrorCode>> Failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }
  std::optional<Acked> Any(std::mt19937& random) {
    std::lock_guard<std::mutex> lock(mu_);
    if (acked_.empty()) return std::nullopt;
    return acked_[random() % acked_.size()];
  }
  std::vector<Acked> All() {
    std::lock_guard<std::mutex> lock(mu_);
    return acked_;
  }
  // The keys acknowledged since the last call (to look up where kvmaster placed them).
  std::vector<std::string> NewlyAcked() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (; looked_up_ < acked_.size(); ++looked_up_) out.push_back(acked_[looked_up_].key);
    return out;
  }
  // The agents of the destructive faults since `a`'s put started, in order.
  std::string DestructiveSince(const Acked& a) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (size_t i = a.faults_before; i < destructive_.size(); ++i) {
      out += (out.empty() ? "agent " : ", agent ") + std::to_string(destructive_[i]);
    }
    return out.empty() ? "none" : out;
  }
  // Whether the faults since `a`'s put started may have taken every replica it had.
  bool MayBeLost(const Acked& a) {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<int> agents(destructive_.begin() + static_cast<long>(a.faults_before),
                         destructive_.end());
    return agents.size() >= std::max<uint32_t>(a.replicas, 1);
  }

  std::atomic<uint64_t> reads_right{0}, reads_wrong{0}, reads_failed{0};
  std::atomic<uint64_t> puts_failed{0}, puts_unknown{0};

 private:
  std::mutex mu_;
  std::vector<int> destructive_;
  std::vector<Acked> acked_;
  std::vector<std::pair<Acked, ErrorCode>> failed_;
  size_t looked_up_ = 0;
};

// Where kvmaster holds `key`'s replicas right now: "pool:offset" of each.
std::string WhereIs(const std::string& master, const std::string& key) {
  std::string out;
  for (const Placed& p : PlacementsOf(master, key)) {
    out += (out.empty() ? "" : ", ") + std::to_string(p.pool_id) + ":" + std::to_string(p.offset);
  }
  return out.empty() ? "nowhere" : out;
}

// One agent's client work: puts of its own keys (two replicas) and gets of anyone's, through a
// client that reconnects whenever the agent went away.
class Load {
 public:
  // `pace`: the time between two puts, so that the writes spread over the faults.
  Load(int index, NodeAgent& agent, Ledger& ledger, std::chrono::milliseconds pace)
      : index_(index), agent_(agent), ledger_(ledger), pace_(pace), thread_([this] { Run(); }) {}
  ~Load() {
    stop_ = true;
    thread_.join();
  }
  uint64_t puts() const { return next_; }

 private:
  void Run() {
    std::mt19937 random(static_cast<uint32_t>(index_) * 104729u + 1);
    std::unique_ptr<Client> client;
    auto next_put = std::chrono::steady_clock::now();
    while (!stop_) {
      if (!client) {
        client = agent_.Connect();
        if (!client) {
          std::this_thread::sleep_for(50ms);
          continue;
        }
      }
      bool gone = false;
      if (next_ < kKeysPerWriter && std::chrono::steady_clock::now() >= next_put) {
        next_put += pace_;
        gone = Put(*client, random);
      }
      if (!gone) gone = Get(*client, random);
      if (gone) client.reset();
      std::this_thread::sleep_for(2ms);
    }
  }

  // True when the agent is gone (reconnect).
  bool Put(Client& c, std::mt19937& random) {
    Acked a;
    a.key = "agent" + std::to_string(index_) + "/k" + std::to_string(next_);
    a.size = kSizes[random() % std::size(kSizes)];
    a.faults_before = ledger_.DestructiveFaults();
    a.round_started = g_round.load();
    const KeyResult r = PutValue(c, a.key, Pattern(a.key, a.size), 2);
    a.round_acked = g_round.load();
    if (r.code == ErrorCode::kOk) {
      a.replicas = r.replicas;
      ledger_.RecordAck(a);
      ++next_;
      return false;
    }
    // Not acknowledged: a new key next time (this one's outcome may be unknown, and a put never
    // replaces a value, so it is not written again).
    ++next_;
    (r.code == ErrorCode::kTimeout ? ledger_.puts_unknown : ledger_.puts_failed) += 1;
    ledger_.RecordFailure(a, r.code);
    return r.code == ErrorCode::kAgentUnavailable;
  }

  bool Get(Client& c, std::mt19937& random) {
    const std::optional<Acked> a = ledger_.Any(random);
    if (!a) return false;
    const Read r = GetValue(c, a->key, 32 << 10);
    if (r.code == ErrorCode::kOk) {
      (r.bytes == Pattern(a->key, a->size) ? ledger_.reads_right : ledger_.reads_wrong) += 1;
      return false;
    }
    ++ledger_.reads_failed;
    return r.code == ErrorCode::kAgentUnavailable;
  }

  const int index_;
  NodeAgent& agent_;
  Ledger& ledger_;
  const std::chrono::milliseconds pace_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_{0};
  std::thread thread_;
};

// Flips 4 bytes at each of `n` random offsets of `agent`'s node pool (root: /proc/PID/mem).
bool FlipPoolBytes(const NodeAgent& agent, std::mt19937& random, int n) {
  const uint64_t pool = MappingOfSize(agent.pid(), NodeAgent::kPoolBytes);
  if (pool == 0) return false;
  for (int i = 0; i < n; ++i) {
    const uint64_t at = random() % (NodeAgent::kPoolBytes - 4);
    std::string bytes = PeekMemory(agent.pid(), pool + at, 4);
    if (bytes.size() != 4) return false;
    for (char& b : bytes) b = static_cast<char>(b ^ 0x5a);
    if (!PokeMemory(agent.pid(), pool + at, bytes.data(), 4)) return false;
  }
  return true;
}

// Data-plane ops `agent`'s pool fence refused since it started (stale writes and reads).
uint64_t FencedOps(const NodeAgent& agent) {
  auto c = agent.Connect();
  if (!c) return 0;
  const Reply st = c->Stat();
  return CounterOf(st, "agent.data.served_fenced") + CounterOf(st, "agent.fenced_local_writes");
}

TEST(AgentFaults, FaultsOnAgentsInARowNeverAnswerOKWithOtherBytesNorLoseWhatSurvives) {
  const bool root = geteuid() == 0;  // flipping pool bytes writes another process's memory
  const int rounds = Rounds();
  const bool soak = std::getenv("KVAGENT_SOAK_ROUNDS") != nullptr || rounds >= 20;
  TempDir state;  // kvmaster's operation log: a restarted kvmaster knows every acknowledged put
  KvmasterProcess master({"--state-dir", state.path(), "--agent-ttl-ms", "1000", "--agent-dead-ms",
                          "6000", "--tick-ms", "20"});
  ASSERT_TRUE(master.started());
  // Each agent listens on 127.0.0.1 and advertises 127.0.0.2, where a proxy in front of its
  // data port forwards from (and can hold what peers send it). The last agent writes without
  // reserved writes (a WriteStart and a WriteEnd per put), the others with them (one commit).
  std::vector<std::unique_ptr<NodeAgent>> agents;
  std::vector<std::unique_ptr<TcpProxy>> paths;
  for (int i = 0; i < kAgents; ++i) {
    const uint16_t port = FreePort();
    paths.push_back(std::make_unique<TcpProxy>("127.0.0.2", port, port));
    ASSERT_TRUE(paths.back()->ok());
    Args args = Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:" + std::to_string(port),
                                            "--data-advertise-host", "127.0.0.2", "--heartbeat-ms",
                                            "200", "--data-peer-timeout-ms", "2000"});
    if (i == kAgents - 1) args = Concat(args, {"--reserved-write-bytes", "0"});
    agents.push_back(std::make_unique<NodeAgent>(args));
    ASSERT_TRUE(agents.back()->started());
  }
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == kAgents; }));
  Ledger ledger;
  std::vector<std::unique_ptr<Load>> load;
  // About 2.5 s per round: the writers' keys spread over the faults.
  const auto pace = std::chrono::milliseconds(rounds * 2500 / kKeysPerWriter);
  for (int i = 0; i < kAgents; ++i) {
    load.push_back(std::make_unique<Load>(i, *agents[i], ledger, pace));
  }

  std::mt19937 random(static_cast<uint32_t>(rounds) * 7919u);
  std::map<std::string, int> faults;
  uint64_t fenced = 0;                        // stale data-plane ops the pools' fences refused
  std::map<std::string, std::string> placed;  // key -> its replicas after the round it was put
  uint64_t evictions = 0;  // objects kvmaster evicted: none may be, or a loss is not a fault's
  const int kinds = root ? 7 : 6;  // the last one (flipped pool bytes) needs root
  std::vector<int> order(kinds);
  for (int i = 0; i < kinds; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), random);
  for (int round = 0; round < rounds; ++round) {
    std::this_thread::sleep_for(700ms);  // load between faults
    const int victim = static_cast<int>(random() % kAgents);
    NodeAgent& agent = *agents[victim];
    // Every kind once in a shuffled order first (so that a short run has each), then at random.
    const int kind = round < kinds ? order[round] : static_cast<int>(random() % kinds);
    // On stderr, unbuffered, between the logs of the processes (KVAGENT_TEST_AGENT_LOG=1).
    std::fprintf(stderr, "agent faults: round %d (kind %d, agent %d) starts\n", round, kind,
                 victim);
    std::string what;
    if (kind == 0) {
      what = "kill -9 and restart of an agent";
      fenced += FencedOps(agent);  // its counters go with it
      agent.Kill();
      // Recorded once the process is gone: a put that started before may have had a replica
      // written in it; one that starts later cannot (its writes there fail and are not counted).
      ledger.RecordDestructive(victim);
      ASSERT_TRUE(agent.Start()) << "round " << round;
    } else if (kind == 1) {
      what = "SIGSTOP of an agent past its TTL, then SIGCONT";
      agent.Signal(SIGSTOP);
      std::this_thread::sleep_for(2000ms);
      agent.Signal(SIGCONT);
    } else if (kind == 2) {
      what = "SIGSTOP of kvmaster, then SIGCONT";
      master.Signal(SIGSTOP);
      std::this_thread::sleep_for(1500ms);
      master.Signal(SIGCONT);
    } else if (kind == 3) {
      what = "an agent's data traffic held past the peers' timeout, then delivered";
      paths[victim]->Hold();
      std::this_thread::sleep_for(4500ms);  // past the timeout and the fence that follows
      paths[victim]->Release();
    } else if (kind == 4) {
      what = "kill -9 of kvmaster and a restart on its state dir";
      evictions += MasterStat(master.rpc(), "evictions");  // its counters go with it
      ASSERT_TRUE(master.Restart()) << "round " << round;
    } else if (kind == 5) {
      what = "bytes damaged on their way to and from an agent";
      // A few, far enough apart that a damaged read is read again undamaged (as a bad link
      // damages a packet now and then, not each one).
      paths[victim]->FlipToServer(3, 300ms);
      paths[victim]->FlipToClient(3, 300ms);
      std::this_thread::sleep_for(2000ms);
      paths[victim]->FlipToServer(0);
      paths[victim]->FlipToClient(0);
    } else {
      what = "bytes flipped in an agent's pool";
      ASSERT_TRUE(FlipPoolBytes(agent, random, 64)) << "round " << round;
      // Recorded once done: a value written while the bytes were being flipped may be hit.
      ledger.RecordDestructive(victim);
    }
    ++faults[what];
    // Every agent registered with a pool again before the next fault.
    ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "pools") == kAgents; }, 30s))
        << "round " << round << " (" << what << "); agents: " << [&] {
             std::string states;
             for (size_t i = 0; i < agents.size(); ++i) {
               states += (i ? ", " : "") + std::to_string(i) + " " + agents[i]->State();
             }
             return states;
           }();
    std::printf("agent faults, round %d: %s (agent %d)\n", round, what.c_str(), victim);
    g_round = round + 1;
    // Where the keys acknowledged meanwhile were placed (for the report of a key lost later).
    for (const std::string& key : ledger.NewlyAcked()) placed[key] = WhereIs(master.rpc(), key);
  }
  // The writers finish their keys with every agent up.
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const auto& l : load) {
          if (l->puts() < kKeysPerWriter) return false;
        }
        return true;
      },
      120s));
  load.clear();
  for (const auto& agent : agents) fenced += FencedOps(*agent);
  evictions += MasterStat(master.rpc(), "evictions");

  // Every acknowledged key, read through agent 0 (most of them from peers).
  auto client = agents[0]->Connect();
  ASSERT_TRUE(client);
  size_t kept = 0, wrong = 0, lost_allowed = 0, protected_keys = 0;
  std::vector<std::string> lost_unexpected;
  const std::vector<Acked> acked = ledger.All();
  for (const Acked& a : acked) {
    protected_keys += !ledger.MayBeLost(a);
    Read r;
    for (int attempt = 0; attempt < 3; ++attempt) {
      r = GetValue(*client, a.key, 32 << 10);
      if (r.code == ErrorCode::kOk || r.code == ErrorCode::kObjectNotFound ||
          r.code == ErrorCode::kDataCorrupted) {
        break;
      }
      std::this_thread::sleep_for(300ms);  // a peer still coming back
    }
    if (r.code == ErrorCode::kOk) {
      (r.bytes == Pattern(a.key, a.size) ? kept : wrong) += 1;
    } else if (ledger.MayBeLost(a)) {
      ++lost_allowed;
    } else {
      lost_unexpected.push_back(
          a.key + " (" + std::to_string(a.replicas) + " replicas, put in " + "rounds " +
          std::to_string(a.round_started) + "-" + std::to_string(a.round_acked) +
          ", destructive faults since: " + ledger.DestructiveSince(a) + "; placed at " +
          placed[a.key] + "): " + std::string(ErrorCodeName(r.code)) + " " + r.message);
    }
  }
  // A put that failed with a code that says nothing was stored left nothing behind; any other
  // failed put (its outcome unknown: TIMEOUT, AGENT_UNAVAILABLE) reads back whole or not at all.
  std::map<std::string, int> failure_codes;
  size_t left_behind = 0;
  for (const auto& [a, code] : ledger.Failures()) {
    ++failure_codes[std::string(ErrorCodeName(code))];
    const Read r = GetValue(*client, a.key, 32 << 10);
    if (r.code != ErrorCode::kOk) continue;
    if (r.bytes != Pattern(a.key, a.size)) {
      ++wrong;
    } else if (code == ErrorCode::kMasterUnavailable || code == ErrorCode::kTransferFailed) {
      ++left_behind;
    }
  }
  std::printf("agent faults: %d rounds:", rounds);
  for (const auto& [what, n] : faults) std::printf(" %s x%d;", what.c_str(), n);
  std::printf(
      "\nagent faults: %zu puts acknowledged (%llu failed, %llu unknown), %zu of them with a "
      "replica no fault could reach; at the end %zu read back with their bytes, %zu gone after "
      "faults on every agent that held them, %zu lost otherwise, %zu with other bytes; during "
      "the run %llu reads OK with their bytes, %llu failed, %llu OK with other bytes; %llu "
      "stale data-plane ops refused by a pool's fence\n",
      acked.size(), static_cast<unsigned long long>(ledger.puts_failed.load()),
      static_cast<unsigned long long>(ledger.puts_unknown.load()), protected_keys, kept,
      lost_allowed, lost_unexpected.size(), wrong,
      static_cast<unsigned long long>(ledger.reads_right.load()),
      static_cast<unsigned long long>(ledger.reads_failed.load()),
      static_cast<unsigned long long>(ledger.reads_wrong.load()),
      static_cast<unsigned long long>(fenced));
  std::printf("agent faults: %llu objects evicted\n", static_cast<unsigned long long>(evictions));
  int damaged = 0;
  for (const auto& path : paths) damaged += path->flipped();
  std::printf("agent faults: %d pieces of data-plane traffic damaged on the way\n", damaged);
  std::printf("agent faults: puts not acknowledged:");
  for (const auto& [code, n] : failure_codes) std::printf(" %s x%d;", code.c_str(), n);
  std::printf(" of them readable though their code said nothing was stored: %zu\n", left_behind);
  EXPECT_EQ(ledger.reads_wrong.load(), 0u) << "gets answered OK with other bytes during the run";
  EXPECT_EQ(wrong, 0u) << "gets answered OK with other bytes at the end";
  if (soak) {
    EXPECT_TRUE(lost_unexpected.empty())
        << lost_unexpected.size() << " acknowledged keys lost without faults on every agent "
        << "that could hold them, e.g. " << lost_unexpected.front()
        << (lost_unexpected.size() > 1 ? "; " + lost_unexpected.back() : "");
  } else {
    for (const std::string& k : lost_unexpected) {
      std::printf("agent faults: OPEN FINDING: acknowledged key lost: %s\n", k.c_str());
    }
  }
  // The pools never fill: every key that goes, goes because of a fault.
  EXPECT_EQ(evictions, 0u);
  EXPECT_EQ(left_behind, 0u) << "puts answered MASTER_UNAVAILABLE or TRANSFER_FAILED were stored";
  EXPECT_GE(acked.size(), static_cast<size_t>(kAgents * kKeysPerWriter / 2));
  EXPECT_GT(ledger.reads_right.load(), 0u);
}

}  // namespace
}  // namespace kvagent::testing

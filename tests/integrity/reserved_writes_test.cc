// Puts through reserved writes (one master round trip: the agent copies into writes the master
// reserved ahead, then commits them with one message) under the faults that can reorder, repeat
// or strand a commit: the master killed and restarted on the same ports with reservations held,
// and the master stopped while commits are in flight, so the agent's link times out and sends
// them again. Every put answered OK must read back with its own bytes; none may be lost.
#include <gtest/gtest.h>
#include <signal.h>

#include <future>
#include <map>

#include "integrity_support.h"

namespace kvagent::testing {
namespace {

// What a run of puts left: how each was answered, and what reads back.
struct Outcome {
  size_t ok = 0, failed = 0, wrong = 0, lost = 0, failed_but_stored = 0, timed_out = 0;
};

Outcome Check(Client& c, const std::map<std::string, ErrorCode>& answers, size_t size) {
  Outcome o;
  for (const auto& [key, code] : answers) {
    const bool stored = KeyExists(c, key);
    if (code == ErrorCode::kOk) {
      ++o.ok;
      const Read r = GetValue(c, key, size);
      if (r.code != ErrorCode::kOk) {
        ++o.lost;
      } else if (r.bytes != Pattern(key, size)) {
        ++o.wrong;
      }
    } else if (code == ErrorCode::kTimeout) {
      ++o.timed_out;  // "may be stored": either way is right
    } else {
      ++o.failed;
      if (stored) {
        ++o.failed_but_stored;
        if (o.failed_but_stored <= 3) {
          ADD_FAILURE() << key << " was answered " << ErrorCodeName(code) << " but is stored";
        }
      }
    }
  }
  return o;
}

TEST(ReservedWrites, PutsOfARepeatedSizeTakeOneMasterRoundTripAndReadBack) {
  KvmasterProcess master({"--agent-ttl-ms", "60000"});
  ASSERT_TRUE(master.started());
  NodeAgent agent(Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0"}));
  auto c = agent.Connect();
  ASSERT_TRUE(c);
  std::map<std::string, ErrorCode> answers;
  for (int i = 0; i < 300; ++i) {
    const std::string key = "r" + std::to_string(i);
    answers[key] = PutValue(*c, key, Pattern(key, 4096)).code;
  }
  const Outcome o = Check(*c, answers, 4096);
  EXPECT_EQ(o.ok, 300u);
  EXPECT_EQ(o.wrong + o.lost, 0u);
  const Reply st = c->Stat();
  // The first puts of the size took two round trips and left the wish; the rest took one.
  EXPECT_GE(CounterOf(st, "agent.reserved_puts"), 290u);
  EXPECT_EQ(CounterOf(st, "master.reserved_commits"), CounterOf(st, "agent.reserved_puts"));
  EXPECT_EQ(CounterOf(st, "master.keys"), 300u);
  EXPECT_EQ(CounterOf(st, "master.writes_in_flight"), 0u);
}

// kill -9 of the master with reservations held, a new master on the same ports and state dir:
// the agent's reserved writes name a master that is gone. Puts in flight fail or time out, the
// next ones go through the new master; nothing acknowledged is lost or reads other bytes.
TEST(ReservedWrites, AMasterKilledWithReservationsHeldLosesNothingAcknowledged) {
  TempDir state;
  KvmasterProcess master({"--state-dir", state.path(), "--agent-ttl-ms", "60000"});
  ASSERT_TRUE(master.started());
  NodeAgent agent(
      Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0", "--master-timeout-ms", "1000"}));
  auto c = agent.Connect();
  ASSERT_TRUE(c);
  std::atomic<bool> stop{false};
  std::atomic<size_t> acknowledged{0};
  std::atomic<bool> writer_done{false};
  std::map<std::string, ErrorCode> answers;
  // At most 24 MiB of values: the 48 MiB pool never evicts, so every key answered OK must stay.
  // Paced (>= 6 s for all) so that the puts outlast the rounds on a loaded machine.
  auto writer = std::async(std::launch::async, [&] {
    for (int i = 0; !stop && i < 6000; ++i) {
      const std::string key = "k" + std::to_string(i);
      const ErrorCode code = PutValue(*c, key, Pattern(key, 4096)).code;
      answers[key] = code;
      if (code == ErrorCode::kOk) ++acknowledged;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    writer_done = true;
  });
  for (int round = 0; round < 3; ++round) {
    // Each master is killed while the agent holds writes it reserved (the link reconnects and
    // the stock is refilled at the pace the machine allows).
    ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.reserved_writes") > 0; }))
        << "round " << round << ": no reserved writes held";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    master.Kill();
    ASSERT_TRUE(master.Restart());
  }
  // The last master takes puts until 150 more are acknowledged (at the machine's pace: an
  // ASan build on a loaded machine acknowledged only 32 in a fixed 600 ms).
  const size_t before_last = acknowledged;
  WaitUntil([&] { return writer_done || acknowledged >= before_last + 150; },
            std::chrono::seconds(60));
  stop = true;
  writer.get();
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.master_link.ready") == 1; }));
  const Outcome o = Check(*c, answers, 4096);
  EXPECT_GT(o.ok, 100u);
  EXPECT_EQ(o.wrong, 0u) << "puts answered OK read back other bytes";
  EXPECT_EQ(o.lost, 0u) << "puts answered OK are not stored";
  EXPECT_EQ(o.failed_but_stored, 0u) << "puts that failed are stored";
  const Reply st = c->Stat();
  EXPECT_GT(CounterOf(st, "agent.reserved_puts"), 0u);
  EXPECT_EQ(CounterOf(st, "master.evictions"), 0u)
      << "bytes_used " << CounterOf(st, "master.bytes_used") << ", reserved "
      << CounterOf(st, "master.reserved_bytes") << ", fenced "
      << CounterOf(st, "master.fenced_bytes") << ", keys " << CounterOf(st, "master.keys");
}

// The master stops while commits are in flight; the agent's link times out, reconnects once the
// master runs again, and sends the commits again: the master sees each commit twice (the first
// copy still in its socket). Each key is stored once, answered once, and reads back.
TEST(ReservedWrites, CommitsSentAgainAfterAMasterStallAreStoredOnce) {
  KvmasterProcess master({"--agent-ttl-ms", "60000"});
  ASSERT_TRUE(master.started());
  // The writer puts without pause until the stalls are over (7 k puts/s on the 2-vCPU VM: a cap
  // of 6,000 puts ran out before the first stall), so that commits are in flight when the
  // master stops; the pool holds all it can put in that time.
  NodeAgent agent(Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0", "--master-timeout-ms",
                                              "400", "--pool-size", "1GiB"}));
  auto c = agent.Connect();
  ASSERT_TRUE(c);
  for (int i = 0; i < 40; ++i) {  // warm up: reservations of the size
    ASSERT_EQ(PutValue(*c, "warm" + std::to_string(i), Pattern("w", 4096)).code, ErrorCode::kOk);
  }
  ASSERT_GT(CounterOf(c->Stat(), "agent.reserved_writes"), 0u);
  std::atomic<bool> stop{false};
  std::map<std::string, ErrorCode> answers;
  auto writer = std::async(std::launch::async, [&] {
    for (int i = 0; !stop && i < 120000; ++i) {  // at most 480 MiB: no eviction
      const std::string key = "s" + std::to_string(i);
      answers[key] = PutValue(*c, key, Pattern(key, 4096)).code;
    }
  });
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    master.Signal(SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // past the link timeout
    master.Signal(SIGCONT);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  writer.get();
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.master_link.ready") == 1; }));
  const Outcome o = Check(*c, answers, 4096);
  EXPECT_GT(o.ok, 50u);
  EXPECT_EQ(o.wrong + o.lost + o.failed_but_stored, 0u);
  EXPECT_GT(CounterOf(c->Stat(), "agent.master_link.retried_calls"), 0u)
      << "no commit was sent again: the stall did not hit one";
  // Every key the master holds was announced once: its key count is the writes that stuck.
  size_t stored = 0;
  for (const auto& [key, code] : answers) stored += KeyExists(*c, key) ? 1 : 0;
  EXPECT_EQ(CounterOf(c->Stat(), "master.keys"), stored + 40);
  EXPECT_EQ(CounterOf(c->Stat(), "master.writes_in_flight"), 0u);
  EXPECT_EQ(CounterOf(c->Stat(), "master.evictions"), 0u);
}

}  // namespace
}  // namespace kvagent::testing

// kvmaster compacts its operation log in a child process while it goes on serving: puts
// acknowledged while the child writes are in the new log, and a kvmaster killed mid-compaction
// (its child stopped, as a slow disk would hold it) restarts on its ports with every
// acknowledged put.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <future>
#include <map>

#include "integrity_support.h"

namespace kvagent::testing {
namespace {

bool Alive(pid_t pid) { return ProcessState(pid) != '?' && ProcessState(pid) != 'Z'; }

// Puts 4 KiB values without pause on its own thread, noting each outcome, until stopped.
class Writer {
 public:
  explicit Writer(Client& c) {
    done_ = std::async(std::launch::async, [this, &c] {
      for (int i = 0; !stop_; ++i) {
        const std::string key = "c" + std::to_string(i);
        const ErrorCode code = PutValue(c, key, Pattern(key, 4096)).code;
        outcome_[key] = code;
        if (code == ErrorCode::kOk) ++oks_;
      }
    });
  }
  ~Writer() { Stop(); }
  void Stop() {
    stop_ = true;
    if (done_.valid()) done_.get();
  }
  // Waits until `n` more puts were acknowledged (within 30 s).
  bool StoreMore(size_t n) {
    const size_t before = oks_;
    return WaitUntil([&] { return oks_ >= before + n; }, std::chrono::seconds(30));
  }
  const std::map<std::string, ErrorCode>& outcome() const { return outcome_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<size_t> oks_{0};
  std::map<std::string, ErrorCode> outcome_;
  std::future<void> done_;
};

TEST(Compaction, PutsAcknowledgedWhileTheChildWritesOrAsKvmasterDiesMidwayAreNeverLost) {
  TempDir state;
  KvmasterProcess master({"--state-dir", state.path(), "--agent-ttl-ms", "60000",
                          "--compact-log-bytes", "64KiB", "--tick-ms", "5"});
  ASSERT_TRUE(master.started());
  NodeAgent agent(Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:0", "--master-timeout-ms",
                                              "1000", "--pool-size", "1GiB"}));
  auto c = agent.Connect();
  ASSERT_TRUE(c);
  Writer writer(*c);
  // Catches the compaction's child as it starts and stops it: the state it copied ages while
  // puts go on into the old log.
  // 1. A compaction held while 200 puts are acknowledged, then let go: the new log must hold
  //    them (the child's snapshot has none of them).
  ASSERT_TRUE(writer.StoreMore(100));
  const uint64_t compactions = MasterStat(master.rpc(), "log_compactions");
  const pid_t held = StopAStateWriter(master.pid());
  ASSERT_NE(held, 0) << "no compaction started";
  ASSERT_TRUE(writer.StoreMore(200));
  ASSERT_EQ(::kill(held, SIGCONT), 0);
  ASSERT_TRUE(WaitUntil([&] { return MasterStat(master.rpc(), "log_compactions") > compactions; }));
  ASSERT_TRUE(writer.StoreMore(50));
  master.Kill();  // SIGKILL: only what is in the log comes back
  ASSERT_TRUE(master.Restart());

  // 2. kvmaster killed while its child is stopped mid-compaction: the child dies with it, holds
  //    no port (the restart binds the same ones), and the old log is whole.
  ASSERT_TRUE(writer.StoreMore(100));
  const pid_t orphan = StopAStateWriter(master.pid());
  ASSERT_NE(orphan, 0) << "no compaction started after the restart";
  ASSERT_TRUE(writer.StoreMore(100));
  master.Kill();
  EXPECT_TRUE(WaitUntil([&] { return !Alive(orphan); })) << "the compaction outlived kvmaster";
  ASSERT_TRUE(master.Restart());
  ASSERT_TRUE(writer.StoreMore(50));
  writer.Stop();

  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.master_link.ready") == 1; }));
  size_t ok = 0, lost = 0;
  for (const auto& [key, code] : writer.outcome()) {
    if (code != ErrorCode::kOk) continue;
    ++ok;
    const Read r = GetValue(*c, key, 4096);
    if (r.code != ErrorCode::kOk || r.bytes != Pattern(key, 4096)) ++lost;
  }
  EXPECT_GT(ok, 500u);
  EXPECT_EQ(lost, 0u) << "puts answered OK but not stored (of " << ok << ")";
}

}  // namespace
}  // namespace kvagent::testing

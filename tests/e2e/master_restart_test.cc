// kvmaster restarted while client processes are busy (not paused) through a kvagent linked to
// it: every call answers — OK, or MASTER_UNAVAILABLE while the master is away; never another
// code, wrong bytes or a hang (a hang would end as the SDK's TIMEOUT, which counts as wrong) —
// the agent reconnects, and later calls of the same processes succeed. Objects stored before
// the restart are readable after it (the master restores them from its state dir). A put whose
// End was on its way when the master went waits for the master to come back and then learns
// whether it was committed (OK), so a client may see no MASTER_UNAVAILABLE at all in a round.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "e2e_support.h"

namespace kvagent::testing {
namespace {

struct Restart {
  const char* name;
  int signal;       // how the old kvmaster goes
  bool hung_first;  // SIGSTOPped first, so the busy clients' calls wait in flight at it
};
void PrintTo(const Restart& r, std::ostream* os) { *os << r.name; }

class MasterRestart : public ::testing::TestWithParam<Restart> {};

// A churn client's good rounds so far (it answers a "status" line with "good N"); lines it
// printed meanwhile ("unavailable", "recovered") are skipped.
uint64_t GoodRounds(ClientProcess& c) {
  c.WriteLine("status");
  for (int i = 0; i < 100; ++i) {
    const std::string line = c.ReadLine();
    if (line.rfind("good ", 0) == 0) return std::stoull(line.substr(5));
    if (line.empty()) break;
  }
  return 0;
}

TEST_P(MasterRestart, BusyClientsSeeOnlyOkOrMasterUnavailableAndSucceedAgainAfterward) {
  TempDir state;
  Store store(Mode::kRemote, {"--heartbeat-ms", "100", "--master-timeout-ms", "2000"},
              {"--state-dir", state.path()});
  ASSERT_TRUE(store.started());
  ASSERT_EQ(RunClient({"write", store.run_dir(), "before", "50", "65536", "sess-before"}), 0);

  std::vector<std::unique_ptr<ClientProcess>> clients;
  for (const char* size : {"4096", "65536", "1048576"}) {
    clients.push_back(std::make_unique<ClientProcess>(std::vector<std::string>{
        "churn", store.run_dir(), std::string("busy-") + size, size, "--master-may-fail"}));
  }
  for (auto& c : clients) ASSERT_EQ(c->ReadLine(), "ready");
  auto observer = Connect(store.agent());
  ASSERT_TRUE(observer);

  for (int restart = 0; restart < 2; ++restart) {
    if (GetParam().hung_first) {
      store.master().Signal(SIGSTOP);
      ASSERT_TRUE(WaitUntil([&] { return IsStopped(store.master().pid()); }));
      // Within --master-timeout-ms: the calls now reaching it stay in flight until it dies.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    store.master().Signal(GetParam().signal);
    // The agent noticed: its link to the master is down.
    ASSERT_TRUE(WaitUntil([&] {
      return CounterOf(observer->Stat(), "agent.master_link.link_downs") >
             static_cast<uint64_t>(restart);
    }));
    ASSERT_TRUE(store.master().Restart());
    // Every client completes good rounds after the restart.
    std::vector<uint64_t> good_before;
    for (auto& c : clients) good_before.push_back(GoodRounds(*c));
    for (size_t i = 0; i < clients.size(); ++i) {
      EXPECT_TRUE(WaitUntil([&] { return GoodRounds(*clients[i]) > good_before[i]; },
                            std::chrono::seconds(60)))
          << "client " << i << " got no good round after the restart";
    }
  }
  for (auto& c : clients) c->CloseInput();
  for (auto& c : clients) EXPECT_EQ(c->Wait(), 0) << "a call gave an answer it must not give";

  EXPECT_EQ(RunClient({"check", store.run_dir(), "before", "50", "65536"}), 0);
  const Reply st = observer->Stat();
  EXPECT_GE(CounterOf(st, "agent.master_link.registrations"), 3u);
  if (GetParam().hung_first) {
    // Calls in flight at the hung master: WriteStarts fail, Ends wait and are sent again.
    EXPECT_GE(CounterOf(st, "agent.master_link.failed_in_flight") +
                  CounterOf(st, "agent.master_link.retried_calls"),
              2u);
  }
}

INSTANTIATE_TEST_SUITE_P(E2E, MasterRestart,
                         ::testing::Values(Restart{"HungThenSigkill", SIGKILL, true},
                                           Restart{"Sigterm", SIGTERM, false}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvagent::testing

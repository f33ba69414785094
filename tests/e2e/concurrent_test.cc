// Four SDK client processes putting at the same time through one kvagent (standalone, and with
// a kvmaster process): every key each stored reads back, from other processes, with exactly its
// bytes, and the store lists exactly those keys, each with its writer's session.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "e2e_support.h"

namespace kvagent::testing {
namespace {

struct Writer {
  std::string prefix;
  uint64_t count;
  size_t size;  // values of ValueSize(i, size) bytes
  uint64_t batch;
  std::string session;
};

// ~80 MB in all: no eviction in a 256 MiB pool. 1 MiB values span four 256 KiB parts.
const std::vector<Writer> kWriters = {
    {"w0", 400, 4096, 1, "engine-0"},
    {"w1", 200, 65536, 8, "引擎-1"},
    {"w2", 60, 1 << 20, 4, "moteur-ø"},
    {"w3", 1000, 300, 64, ""},
};

class Concurrent : public ::testing::TestWithParam<Mode> {};

TEST_P(Concurrent, FourClientProcessesPuttingAtOnceReadEveryKeyBackWithItsBytes) {
  Store store(GetParam(),
              GetParam() == Mode::kStandalone
                  ? Args{"--pool-size", "256MiB", "--max-part-bytes", "256KiB"}
                  : Args{"--pool-size", "256MiB"},
              {"--max-part-bytes", "262144"});
  ASSERT_TRUE(store.started());
  std::vector<std::unique_ptr<ClientProcess>> writers;
  for (const Writer& w : kWriters) {
    writers.push_back(std::make_unique<ClientProcess>(
        std::vector<std::string>{"write", store.run_dir(), w.prefix, std::to_string(w.count),
                                 std::to_string(w.size), w.session, std::to_string(w.batch)}));
  }
  for (size_t i = 0; i < writers.size(); ++i) {
    EXPECT_EQ(writers[i]->ReadLine(std::chrono::seconds(120)),
              "stored " + std::to_string(kWriters[i].count))
        << kWriters[i].prefix;
    EXPECT_EQ(writers[i]->Wait(), 0) << kWriters[i].prefix;
  }
  // Each writer's keys are read back by a process that did not write them.
  for (const Writer& w : kWriters) {
    EXPECT_EQ(RunClient({"check", store.run_dir(), w.prefix, std::to_string(w.count),
                         std::to_string(w.size)}),
              0)
        << w.prefix;
  }
  auto c = Connect(store.agent());
  ASSERT_TRUE(c);
  std::map<std::string, std::string> want;
  for (const Writer& w : kWriters) {
    for (uint64_t i = 0; i < w.count; ++i) want[w.prefix + "-" + std::to_string(i)] = w.session;
  }
  EXPECT_TRUE(ListedSessions(*c) == want) << "the store lists other keys or sessions";
  const Reply st = c->Stat();
  EXPECT_EQ(CounterOf(st, "master.evictions"), 0u);  // nothing made room: every key had to stay
  EXPECT_EQ(CounterOf(st, "master.writes_in_flight"), 0u);
}

INSTANTIATE_TEST_SUITE_P(E2E, Concurrent, ::testing::Values(Mode::kStandalone, Mode::kRemote),
                         ModeName);

}  // namespace
}  // namespace kvagent::testing

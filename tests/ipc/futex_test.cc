// FutexWaitMany at and past the kernel's limit of words per call.
#include "kvagent/ipc/futex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <vector>

namespace kvagent::ipc {
namespace {

std::vector<FutexWaiter> WaitersOn(std::vector<std::atomic<uint32_t>>& words) {
  std::vector<FutexWaiter> waiters;
  for (auto& w : words) waiters.push_back({&w, 0, FutexScope::kPrivate});
  return waiters;
}

// Every word up to the limit is watched: one that changed, even the last, ends the wait at once.
TEST(FutexWaitMany, WatchesEveryWordUpToTheLimit) {
  std::vector<std::atomic<uint32_t>> words(kMaxFutexWaiters);
  words.back().store(1);  // no longer the expected 0
  const WaitResult r = FutexWaitMany(WaitersOn(words), std::chrono::seconds(30));
  if (r == WaitResult::kUnsupported) GTEST_SKIP() << "futex_waitv needs Linux >= 5.16";
  EXPECT_EQ(r, WaitResult::kChanged);
}

// Past the limit the call refuses at once instead of watching only the first 128 words (which
// slept through the change of the 129th until the timeout).
TEST(FutexWaitMany, MoreWordsThanTheLimitIsAnErrorNotAWaitOnSomeOfThem) {
  std::vector<std::atomic<uint32_t>> words(kMaxFutexWaiters + 1);
  words.back().store(1);
  EXPECT_EQ(FutexWaitMany(WaitersOn(words), std::chrono::seconds(2)), WaitResult::kTooManyWaiters);
}

}  // namespace
}  // namespace kvagent::ipc

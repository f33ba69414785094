#include "kvagent/ipc/cpu_yield.h"

#include <gtest/gtest.h>

#include <thread>

namespace kvagent::ipc {
namespace {

using Clock = YieldPolicy::Clock;
using std::chrono::microseconds;

TEST(YieldPolicy, AShortYieldOrOneThatBroughtTheWorkChangesNothing) {
  YieldPolicy p;
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(p.MayYield(t0));
  p.Yielded(t0, t0 + microseconds(30), /*done=*/false);   // the thread waited for ran a step
  p.Yielded(t0, t0 + microseconds(5000), /*done=*/true);  // it did the whole work meanwhile
  EXPECT_TRUE(p.MayYield(t0 + microseconds(5001)));
  EXPECT_EQ(p.pauses(), 0u);
}

TEST(YieldPolicy, ACostlyYieldWithoutTheWorkPausesYieldsForAWhile) {
  YieldPolicy p;
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point after = t0 + YieldPolicy::kCostly;
  p.Yielded(t0, after, /*done=*/false);  // another program's thread ran a whole slice
  EXPECT_EQ(p.pauses(), 1u);
  EXPECT_FALSE(p.MayYield(after));
  EXPECT_FALSE(p.MayYield(after + YieldPolicy::kPause - microseconds(1)));
  EXPECT_TRUE(p.MayYield(after + YieldPolicy::kPause));  // then it tries again
}

TEST(YieldPolicy, EachThreadJudgesItsOwnCpu) {
  const Clock::time_point now = Clock::now();
  ThisThreadsYieldPolicy().Yielded(now - YieldPolicy::kCostly, now, /*done=*/false);
  int asked = 0;
  EXPECT_FALSE(YieldCpu([&] { return ++asked > 0; }));  // paused: no yield, nothing asked
  EXPECT_EQ(asked, 0);
  bool other_yielded = false;
  std::thread([&] { other_yielded = YieldCpu([] { return false; }); }).join();
  EXPECT_TRUE(other_yielded);
}

}  // namespace
}  // namespace kvagent::ipc

#include "kvagent/ipc/cpu_yield.h"

#include <gtest/gtest.h>

#include <thread>

namespace kvagent::ipc {
namespace {

using Clock = YieldPolicy::Clock;
using std::chrono::microseconds;

TEST(YieldPolicy, ShortYieldsAndARareLongOneChangeNothing) {
  YieldPolicy p;
  Clock::time_point t = Clock::now();
  for (int i = 0; i < 1000; ++i) {
    // A yield to the thread waited for, and now and then one that took a tick's work.
    p.Yielded(i % 50 == 0 ? std::chrono::milliseconds(5) : microseconds(20), t);
    t += microseconds(100);
    ASSERT_TRUE(p.MayYield(t)) << i;
  }
  EXPECT_EQ(p.pauses(), 0u);
}

TEST(YieldPolicy, ARunOfCostlyYieldsPausesYieldsForAWhile) {
  YieldPolicy p;
  Clock::time_point t = Clock::now();
  int yields = 0;
  while (p.MayYield(t) && yields < 100) {
    t += microseconds(150);  // another program's thread ran
    p.Yielded(microseconds(150), t);
    ++yields;
  }
  EXPECT_EQ(yields, 9);
  EXPECT_EQ(p.pauses(), 1u);
  EXPECT_FALSE(p.MayYield(t + YieldPolicy::kPause - microseconds(1)));
  EXPECT_TRUE(p.MayYield(t + YieldPolicy::kPause));       // then it tries again
  p.Yielded(microseconds(150), t + YieldPolicy::kPause);  // one costly yield is not a run
  EXPECT_TRUE(p.MayYield(t + YieldPolicy::kPause));
}

TEST(YieldPolicy, EachThreadJudgesItsOwnCpu) {
  Clock::time_point t = Clock::now();
  for (int i = 0; i < 9; ++i) ThisThreadsYieldPolicy().Yielded(microseconds(150), t);
  ASSERT_EQ(ThisThreadsYieldPolicy().pauses(), 1u);
  EXPECT_FALSE(YieldCpu());  // paused
  bool other_yielded = false;
  std::thread([&] { other_yielded = YieldCpu(); }).join();
  EXPECT_TRUE(other_yielded);
}

}  // namespace
}  // namespace kvagent::ipc

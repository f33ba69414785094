// ScratchPool and ScratchLease (agent/src/scratch_pool.h): containers lent to one batch come
// back cleared with their capacity, large ones and those past the spare limit are freed, and a
// lease without a pool leaves its members alone.
#include "scratch_pool.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

namespace kvagent::agent {
namespace {

using Scratch = std::tuple<std::vector<int>, std::vector<std::string>>;

struct FakeBatch {
  explicit FakeBatch(ScratchPool<Scratch>* pool) : lease(pool, std::tie(numbers, names)) {}
  std::vector<int> numbers;
  std::vector<std::string> names;
  ScratchLease<Scratch> lease;  // last, as in a batch
};

TEST(ScratchPool, ALeaseGivesItsMembersBackClearedAndTheNextBatchGetsTheirCapacity) {
  ScratchPool<Scratch> pool;
  {
    FakeBatch first(&pool);
    EXPECT_TRUE(first.numbers.empty());
    first.numbers.assign(100, 7);
    first.names.assign(3, "left over");
  }
  EXPECT_EQ(pool.spare(), 1u);
  FakeBatch second(&pool);
  EXPECT_EQ(pool.spare(), 0u);
  EXPECT_TRUE(second.numbers.empty()) << "nothing of the first batch is left";
  EXPECT_TRUE(second.names.empty());
  EXPECT_GE(second.numbers.capacity(), 100u) << "its buffer is kept";
}

TEST(ScratchPool, ContainersGrownPastTheLimitAreFreedNotKept) {
  ScratchPool<Scratch> pool;
  {
    FakeBatch big(&pool);
    big.numbers.assign(4096, 1);
  }
  EXPECT_EQ(pool.spare(), 0u);
}

TEST(ScratchPool, AtMostSixteenSetsAreKept) {
  ScratchPool<Scratch> pool;
  {
    std::vector<std::unique_ptr<FakeBatch>> many;
    for (int i = 0; i < 20; ++i) many.push_back(std::make_unique<FakeBatch>(&pool));
  }
  EXPECT_EQ(pool.spare(), 16u);
}

TEST(ScratchPool, ALeaseWithoutAPoolLeavesTheMembersAsTheyAre) {
  FakeBatch alone(nullptr);
  alone.numbers.push_back(1);
  EXPECT_EQ(alone.numbers.size(), 1u);
}

}  // namespace
}  // namespace kvagent::agent

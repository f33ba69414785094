#include "kvagent/master/pool_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace kvagent::master {
namespace {

TEST(PoolAllocator, OffsetsAndLengthsAreAlignedTo64Bytes) {
  PoolAllocator a(1 << 20);
  auto x = a.Allocate(1);
  auto y = a.Allocate(65);
  auto z = a.Allocate(64);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x % 64, 0u);
  EXPECT_EQ(*y % 64, 0u);
  EXPECT_EQ(*z % 64, 0u);
  EXPECT_EQ(a.used(), 64u + 128u + 64u);
}

TEST(PoolAllocator, FreeingCoalescesWithBothNeighbours) {
  PoolAllocator a(64 * 10);
  auto p0 = a.Allocate(64 * 3);
  auto p1 = a.Allocate(64 * 3);
  auto p2 = a.Allocate(64 * 4);
  ASSERT_TRUE(p0 && p1 && p2);
  EXPECT_EQ(a.free_bytes(), 0u);
  a.Free(*p0, 64 * 3);
  a.Free(*p2, 64 * 4);
  EXPECT_EQ(a.free_block_count(), 2u);
  EXPECT_EQ(a.largest_free(), 64u * 4);
  a.Free(*p1, 64 * 3);  // joins both sides
  EXPECT_EQ(a.free_block_count(), 1u);
  EXPECT_EQ(a.largest_free(), 64u * 10);
}

TEST(PoolAllocator, BestFitKeepsTheLargeBlockWhole) {
  PoolAllocator a(64 * 100);
  auto a0 = a.Allocate(64 * 10);
  auto hole_small = a.Allocate(64 * 2);
  auto a1 = a.Allocate(64 * 10);
  ASSERT_TRUE(a0 && hole_small && a1);
  a.Free(*hole_small, 64 * 2);  // a 2-line hole before a 78-line tail
  auto fit = a.Allocate(64 * 2);
  ASSERT_TRUE(fit);
  EXPECT_EQ(*fit, *hole_small);  // the hole, not the tail
  EXPECT_EQ(a.largest_free(), 64u * 78);
}

TEST(PoolAllocator, ExhaustionReturnsNulloptAndChangesNothing) {
  PoolAllocator a(64 * 4);
  ASSERT_TRUE(a.Allocate(64 * 3));
  EXPECT_FALSE(a.Allocate(64 * 2));
  EXPECT_EQ(a.free_bytes(), 64u);
  EXPECT_TRUE(a.Allocate(64));
  EXPECT_FALSE(a.Allocate(1));
}

TEST(PoolAllocator, AllocateAtReservesExactRangesAndRefusesOverlaps) {
  PoolAllocator a(64 * 16);
  EXPECT_TRUE(a.AllocateAt(64 * 4, 64 * 2));
  EXPECT_FALSE(a.AllocateAt(64 * 5, 64));    // overlaps
  EXPECT_FALSE(a.AllocateAt(64 * 15, 128));  // past the end
  EXPECT_FALSE(a.AllocateAt(10, 64));        // unaligned
  EXPECT_TRUE(a.AllocateAt(0, 64 * 4));
  EXPECT_EQ(a.used(), 64u * 6);
  auto next = a.Allocate(64);
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, 64u * 6);
}

// Random allocate/free against a reference map of live ranges: no overlap, conservation of
// bytes, and a fully freed pool is one block again.
TEST(PoolAllocator, RandomWorkloadNeverOverlapsAndReturnsToOneBlock) {
  const uint64_t size = 64 * 4096;
  PoolAllocator a(size);
  std::map<uint64_t, uint64_t> live;  // offset -> rounded length
  std::mt19937_64 rng(42);
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t len = 1 + rng() % 2000;
      auto off = a.Allocate(len);
      if (!off) continue;
      const uint64_t r = PoolAllocator::Rounded(len);
      auto next = live.lower_bound(*off);
      if (next != live.end()) {
        ASSERT_GE(next->first, *off + r);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, *off);
      }
      live[*off] = r;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      a.Free(it->first, it->second);
      live.erase(it);
    }
    uint64_t used = 0;
    for (auto& [o, l] : live) used += l;
    ASSERT_EQ(a.used(), used);
  }
  for (auto& [o, l] : live) a.Free(o, l);
  EXPECT_EQ(a.free_block_count(), 1u);
  EXPECT_EQ(a.largest_free(), size);
}

}  // namespace
}  // namespace kvagent::master

// The allocator shared by the client's arena (tests/ipc/arena_allocator_test.cc) and the master's
// pools (tests/master/pool_allocator_test.cc), here with an alignment neither of them uses.
#include "kvagent/common/extent_allocator.h"

#include <gtest/gtest.h>

#include <iterator>
#include <map>
#include <random>
#include <utility>

namespace kvagent {
namespace {

constexpr uint64_t kPage = 4096;

TEST(ExtentAllocator, SizeAndLengthsRoundToTheAlignment) {
  ExtentAllocator a(10 * kPage + 100, kPage);
  EXPECT_EQ(a.size(), 10 * kPage);
  EXPECT_EQ(a.Rounded(0), kPage);
  EXPECT_EQ(a.Rounded(1), kPage);
  EXPECT_EQ(a.Rounded(kPage), kPage);
  EXPECT_EQ(a.Rounded(kPage + 1), 2 * kPage);
  auto x = a.Allocate(1);
  auto y = a.Allocate(kPage + 1);
  ASSERT_TRUE(x && y);
  EXPECT_EQ(*x % kPage, 0u);
  EXPECT_EQ(*y % kPage, 0u);
  EXPECT_EQ(a.used(), 3 * kPage);
  EXPECT_EQ(a.free_bytes(), 7 * kPage);
}

TEST(ExtentAllocator, BestFitTakesTheSmallestExtentThatFitsAtItsLowestOffset) {
  ExtentAllocator a(20 * kPage, kPage);
  auto p0 = a.Allocate(3 * kPage);
  auto p1 = a.Allocate(kPage);
  auto p2 = a.Allocate(2 * kPage);
  auto p3 = a.Allocate(kPage);
  auto p4 = a.Allocate(2 * kPage);
  auto p5 = a.Allocate(kPage);
  ASSERT_TRUE(p0 && p1 && p2 && p3 && p4 && p5);
  a.Free(*p0, 3 * kPage);  // holes of 3, 2 and 2 pages before a 10-page tail
  a.Free(*p2, 2 * kPage);
  a.Free(*p4, 2 * kPage);
  auto fit = a.Allocate(2 * kPage);
  ASSERT_TRUE(fit);
  EXPECT_EQ(*fit, *p2);  // a 2-page hole, the lower one; not the 3-page hole or the tail
  EXPECT_EQ(a.largest_free(), 10 * kPage);
  EXPECT_EQ(a.free_extent_count(), 3u);
}

TEST(ExtentAllocator, AllocateAtRefusesMisalignedOverlappingAndOutOfRangeRanges) {
  ExtentAllocator a(8 * kPage, kPage);
  EXPECT_FALSE(a.AllocateAt(64, kPage));  // aligned for 64 B, not for pages
  EXPECT_TRUE(a.AllocateAt(2 * kPage, kPage));
  EXPECT_FALSE(a.AllocateAt(2 * kPage, 1));
  EXPECT_FALSE(a.AllocateAt(7 * kPage, 2 * kPage));
  EXPECT_FALSE(a.AllocateAt(9 * kPage, 1));
  EXPECT_EQ(a.used(), kPage);
  EXPECT_EQ(a.free_extent_count(), 2u);  // [0, 2) and [3, 8)
}

TEST(ExtentAllocator, MovingKeepsTheFreeSpace) {
  ExtentAllocator a(4 * kPage, kPage);
  auto x = a.Allocate(kPage);
  ASSERT_TRUE(x);
  ExtentAllocator b = std::move(a);
  EXPECT_EQ(b.free_bytes(), 3 * kPage);
  b.Free(*x, kPage);
  EXPECT_EQ(b.free_extent_count(), 1u);
  EXPECT_EQ(b.largest_free(), 4 * kPage);
}

// Random allocate/free against a map of live ranges: never an overlap, bytes conserved, and a
// fully freed allocator is one extent again.
TEST(ExtentAllocator, RandomWorkloadNeverOverlapsAndReturnsToOneExtent) {
  const uint64_t size = 512 * kPage;
  ExtentAllocator a(size, kPage);
  std::map<uint64_t, uint64_t> live;  // offset -> rounded length
  std::mt19937_64 rng(7);
  uint64_t used = 0;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t length = 1 + rng() % (8 * kPage);
      auto offset = a.Allocate(length);
      if (!offset) {
        EXPECT_LT(a.largest_free(), a.Rounded(length));
        continue;
      }
      auto next = live.lower_bound(*offset);
      if (next != live.end()) {
        ASSERT_LE(*offset + a.Rounded(length), next->first);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, *offset);
      }
      live.emplace(*offset, a.Rounded(length));
      used += a.Rounded(length);
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      a.Free(it->first, it->second);
      used -= it->second;
      live.erase(it);
    }
    ASSERT_EQ(a.used(), used);
  }
  for (const auto& [offset, length] : live) a.Free(offset, length);
  EXPECT_EQ(a.free_bytes(), size);
  EXPECT_EQ(a.free_extent_count(), 1u);
}

}  // namespace
}  // namespace kvagent

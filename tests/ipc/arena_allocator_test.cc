#include "kvagent/ipc/arena_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace kvagent::ipc {
namespace {

TEST(ArenaAllocator, AllocationsAreAlignedDisjointAndInsideTheArena) {
  ArenaAllocator arena(1 << 20);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint64_t size : {1u, 63u, 64u, 65u, 1000u, 4096u}) {
    auto offset = arena.Allocate(size);
    ASSERT_TRUE(offset.ok()) << offset.status().ToString();
    EXPECT_EQ(*offset % 64, 0u);
    EXPECT_LE(*offset + size, arena.arena_bytes());
    ranges.emplace_back(*offset, size);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first);
  }
}

TEST(ArenaAllocator, ExhaustionIsNoSpaceWithTheLargestFreeExtentInTheMessage) {
  ArenaAllocator arena(4096);
  auto a = arena.Allocate(4096);
  ASSERT_TRUE(a.ok());
  auto b = arena.Allocate(1);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), ErrorCode::kNoSpace);
  EXPECT_NE(b.status().message().find("largest extent 0"), std::string::npos);
  EXPECT_EQ(arena.Allocate(0).status().code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(arena.Allocate(1 << 20).status().code(), ErrorCode::kNoSpace);
}

TEST(ArenaAllocator, FreeingInAnyOrderCoalescesBackToOneExtent) {
  ArenaAllocator arena(1 << 20);
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 256; ++i) {
    auto offset = arena.Allocate(4096);
    ASSERT_TRUE(offset.ok());
    offsets.push_back(*offset);
  }
  EXPECT_EQ(arena.free_bytes(), 0u);
  std::shuffle(offsets.begin(), offsets.end(), std::mt19937(3));
  for (uint64_t offset : offsets) arena.Free(offset);
  EXPECT_EQ(arena.free_extents(), 1u);
  EXPECT_EQ(arena.largest_free_extent(), 1u << 20);
  EXPECT_EQ(arena.allocated_ranges(), 0u);
}

TEST(ArenaAllocator, BestFitKeepsTheLargeExtentForLargeValues) {
  ArenaAllocator arena(64 * 1024);
  auto small_hole = arena.Allocate(1024);
  auto keep = arena.Allocate(1024);
  ASSERT_TRUE(small_hole.ok() && keep.ok());
  arena.Free(*small_hole);  // a 1 KiB hole at the start, 62 KiB free at the end
  auto fits_hole = arena.Allocate(512);
  ASSERT_TRUE(fits_hole.ok());
  EXPECT_EQ(*fits_hole, *small_hole);  // went into the hole, not the big extent
  EXPECT_EQ(arena.largest_free_extent(), 62u * 1024);
}

}  // namespace
}  // namespace kvagent::ipc

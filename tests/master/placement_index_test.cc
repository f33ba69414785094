// master/src/placement_index.h: the pool a further replica goes to is the one a scan of every
// live pool picks (most free bytes that fits, on an agent not used yet, the lower id among
// equals), through allocations and frees in any order; and a search looks at O(log pools) nodes.
#include "placement_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

#include "metadata_store.h"

namespace kvagent::master {
namespace {

struct PoolSet {
  std::deque<Pool> pools;  // stable addresses
  std::vector<Pool*> live;
  PlacementIndex index;

  PoolSet(size_t n, std::mt19937_64& rng) {
    for (size_t i = 0; i < n; ++i) {
      const uint64_t size = (uint64_t{1} << 20) * (1 + rng() % 8);
      pools.push_back(Pool{
          static_cast<PoolId>(i + 1), static_cast<AgentId>(1 + i / 2), 0, {}, PoolAllocator(size)});
      live.push_back(&pools.back());
    }
    index.Reset(live);
  }
};

// What TryAllocate's scan of every live pool picked.
Pool* Scan(const std::vector<Pool*>& live, const std::vector<AgentId>& used, uint64_t need) {
  Pool* best = nullptr;
  for (Pool* s : live) {
    if (std::find(used.begin(), used.end(), s->agent) != used.end()) continue;
    if (s->allocator.largest_free() < need) continue;
    if (best == nullptr || s->allocator.free_bytes() > best->allocator.free_bytes()) best = s;
  }
  return best;
}

TEST(PlacementIndex, PicksWhatAScanOfEveryPoolPicksThroughAllocationsAndFrees) {
  std::mt19937_64 rng(7);
  for (size_t n : {1, 2, 3, 5, 17, 64, 100}) {
    PoolSet c(n, rng);
    struct Held {
      Pool* pool;
      uint64_t offset, length;
    };
    std::vector<Held> held;
    for (int step = 0; step < 3000; ++step) {
      if (!held.empty() && rng() % 3 == 0) {  // a free somewhere
        const size_t i = rng() % held.size();
        held[i].pool->allocator.Free(held[i].offset, held[i].length);
        c.index.Touched(held[i].pool->slot);
        held[i] = held.back();
        held.pop_back();
        continue;
      }
      std::vector<AgentId> used;
      for (int u = 0; u < static_cast<int>(rng() % 3); ++u) used.push_back(1 + rng() % (n / 2 + 1));
      const uint64_t length = 64 * (1 + rng() % 8192);
      const uint64_t need = PoolAllocator::Rounded(length);
      Pool* want = Scan(c.live, used, need);
      Pool* got = c.index.Best([&](const Pool& s) {
        return std::find(used.begin(), used.end(), s.agent) == used.end() &&
               s.allocator.largest_free() >= need;
      });
      ASSERT_EQ(got, want) << "pools " << n << " step " << step;
      if (got == nullptr) continue;
      auto off = got->allocator.Allocate(length);
      c.index.Touched(got->slot);
      ASSERT_TRUE(off.has_value());
      held.push_back({got, *off, length});
    }
  }
}

TEST(PlacementIndex, ASearchLooksAtLogarithmicallyManyNodes) {
  // 16x the pools: a scan looks at 16x the pools; the index at a few more nodes (one level of
  // the tree per doubling), with one agent already used and every pool touched in between.
  auto visits = [](size_t n) {
    std::mt19937_64 rng(11);
    PoolSet c(n, rng);
    const uint64_t before = c.index.nodes_visited();
    for (int i = 0; i < 1000; ++i) {
      Pool* first = c.index.Best([](const Pool&) { return true; });
      const AgentId used = first->agent;
      Pool* second = c.index.Best([&](const Pool& s) { return s.agent != used; });
      EXPECT_NE(second, nullptr);
      auto a = first->allocator.Allocate(4096);
      auto b = second->allocator.Allocate(4096);
      c.index.Touched(first->slot);
      c.index.Touched(second->slot);
      if (a && b) continue;
      ADD_FAILURE() << "pools full";
      break;
    }
    return static_cast<double>(c.index.nodes_visited() - before);
  };
  const double small = visits(64), large = visits(1024);
  std::printf(
      "placement index: 2000 searches over 64 pools visit %.0f nodes, over 1024 pools %.0f\n",
      small, large);
  EXPECT_LT(large / small, 2.0);  // a scan: 16x
}

}  // namespace
}  // namespace kvagent::master

// EntrySlabs (master/src/entry_slabs.h): every entry constructed and destroyed exactly once,
// no two live entries sharing memory, the free slot of the lowest address handed out first (so
// entries made after a removal in any order lie in order again), a throwing constructor leaving
// nothing behind.
#include "entry_slabs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvagent::master {
namespace {

int live = 0;

struct Counted {
  explicit Counted(std::string v, bool fail = false) : value(std::move(v)) {
    if (fail) throw std::runtime_error("constructor failed");
    ++live;
  }
  ~Counted() { --live; }
  std::string value;
};

TEST(EntrySlabs, EntriesLiveApartAndAreDestroyedOnce) {
  live = 0;
  {
    EntrySlabs<Counted> slabs;
    std::vector<Counted*> entries;
    const int n = 3 * static_cast<int>(EntrySlabs<Counted>::PerSlab()) + 5;  // several slabs
    for (int i = 0; i < n; ++i) {
      entries.push_back(slabs.New("value-" + std::to_string(i) + std::string(40, 'x')));
    }
    EXPECT_EQ(live, n);
    EXPECT_EQ(std::set<Counted*>(entries.begin(), entries.end()).size(), entries.size());
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(entries[i]->value, "value-" + std::to_string(i) + std::string(40, 'x'));
    }
    for (Counted* e : entries) slabs.Delete(e);
    EXPECT_EQ(live, 0);
  }
  EXPECT_EQ(live, 0);
}

#if !defined(__SANITIZE_ADDRESS__)  // sanitizer builds allocate each entry on its own
TEST(EntrySlabs, TheFreeSlotOfTheLowestAddressComesFirst) {
  EntrySlabs<Counted> slabs;
  Counted* a = slabs.New("a");
  Counted* b = slabs.New("b");
  Counted* c = slabs.New("c");
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  slabs.Delete(c);
  slabs.Delete(a);
  Counted* d = slabs.New("d");
  Counted* e = slabs.New("e");
  EXPECT_EQ(d, a);
  EXPECT_EQ(e, c);
  EXPECT_EQ(d->value, "d");
  for (Counted* x : {b, d, e}) slabs.Delete(x);
}

TEST(EntrySlabs, EntriesMadeAfterRemovalsInAnyOrderLieInOrderAgain) {
  EntrySlabs<Counted> slabs;
  const size_t n = 4 * EntrySlabs<Counted>::PerSlab() + 17;
  std::vector<Counted*> entries;
  for (size_t i = 0; i < n; ++i) entries.push_back(slabs.New(std::to_string(i)));
  std::shuffle(entries.begin(), entries.end(), std::mt19937(7));
  for (Counted* e : entries) slabs.Delete(e);  // as a RemoveAll does: in hash order
  std::vector<Counted*> again;
  for (size_t i = 0; i < n; ++i) again.push_back(slabs.New(std::to_string(i)));
  // Within each slab, one after another; the slabs in address order.
  EXPECT_TRUE(std::is_sorted(again.begin(), again.end()));
  size_t adjacent = 0;
  for (size_t i = 1; i < n; ++i) adjacent += again[i] == again[i - 1] + 1;
  EXPECT_GE(adjacent, n - 5);
  for (Counted* e : again) slabs.Delete(e);
}
#endif

TEST(EntrySlabs, AThrowingConstructorLeavesNothingBehind) {
  live = 0;
  EntrySlabs<Counted> slabs;
  Counted* before = slabs.New("before");
  EXPECT_THROW(slabs.New("fails", true), std::runtime_error);
  EXPECT_EQ(live, 1);
  Counted* after = slabs.New("after");
  EXPECT_EQ(after->value, "after");
  EXPECT_NE(after, before);
  slabs.Delete(before);
  slabs.Delete(after);
  EXPECT_EQ(live, 0);
}

}  // namespace
}  // namespace kvagent::master

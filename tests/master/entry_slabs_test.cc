// EntrySlabs (master/src/entry_slabs.h): every entry constructed and destroyed exactly once,
// freed memory handed out again, no two live entries sharing memory, a throwing constructor
// leaving nothing behind.
#include "entry_slabs.h"

#include <gtest/gtest.h>

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
    const int n = 3 * EntrySlabs<Counted>::kPerSlab + 5;  // several slabs
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
TEST(EntrySlabs, FreedMemoryIsHandedOutAgainLastFreedFirst) {
  EntrySlabs<Counted> slabs;
  Counted* a = slabs.New("a");
  Counted* b = slabs.New("b");
  slabs.Delete(a);
  slabs.Delete(b);
  Counted* c = slabs.New("c");
  Counted* d = slabs.New("d");
  EXPECT_EQ(c, b);
  EXPECT_EQ(d, a);
  EXPECT_EQ(c->value, "c");
  EXPECT_EQ(d->value, "d");
  slabs.Delete(c);
  slabs.Delete(d);
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

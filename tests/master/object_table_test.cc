// ObjectTable (master/src/object_table.h): lookups, tombstones, growth, and hash-order scans
// that stay exact while the table changes between pages.
#include "object_table.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "metadata_store.h"

namespace kvagent::master {
namespace {

TEST(ObjectTable, FindsWhatWasInsertedAndNothingElse) {
  ObjectTable t;
  for (int i = 0; i < 10000; ++i) {
    auto [e, fresh] = t.FindOrInsert("key-" + std::to_string(i));
    ASSERT_TRUE(fresh);
    e->second.size = i;
  }
  EXPECT_EQ(t.size(), 10000u);
  EXPECT_LE(t.size() * 8, t.capacity() * 7);
  for (int i = 0; i < 10000; ++i) {
    ObjectEntry* e = t.Find("key-" + std::to_string(i));
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->second.size, static_cast<uint64_t>(i));
    EXPECT_FALSE(t.FindOrInsert("key-" + std::to_string(i)).second);
  }
  EXPECT_EQ(t.Find("key-10000"), nullptr);
}

TEST(ObjectTable, KeysLongerThanTheInlineBufferSurviveEveryGrowth) {
  // Growth rehashes in groups, reading each key through its heap buffer.
  ObjectTable t;
  const std::string prefix(40, 'p');
  for (int i = 0; i < 20000; ++i) {
    auto [e, fresh] = t.FindOrInsert(prefix + std::to_string(i));
    ASSERT_TRUE(fresh);
    e->second.size = i;
  }
  for (int i = 0; i < 20000; ++i) {
    ObjectEntry* e = t.Find(prefix + std::to_string(i));
    ASSERT_NE(e, nullptr) << i;
    EXPECT_EQ(e->second.size, static_cast<uint64_t>(i));
  }
  EXPECT_EQ(t.size(), 20000u);
}

TEST(ObjectTable, ErasedKeysAreGoneAndTheirSlotsReused) {
  ObjectTable t;
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 1000; ++i) (void)t.FindOrInsert("k" + std::to_string(i));
    for (int i = 0; i < 1000; i += 2) t.Erase(t.Find("k" + std::to_string(i)));
    for (int i = 0; i < 1000; ++i) {
      EXPECT_EQ(t.Find("k" + std::to_string(i)) != nullptr, i % 2 == 1);
    }
    for (int i = 1; i < 1000; i += 2) t.Erase(t.Find("k" + std::to_string(i)));
    ASSERT_EQ(t.size(), 0u);
  }
  EXPECT_LE(t.capacity(), 4096u);  // churn does not grow the table
}

// No insert pays for the whole table: the one that grows it starts a move, and each later
// insert visits at most `move_step` old slots. Meanwhile every key is found, found-or-inserted
// without a duplicate, erasable, and visited by ForEach exactly once, wherever it sits.
void ExpectGrowthSpreadOverInserts(size_t move_step) {
  ObjectTable t(move_step);
  int next = 0;
  auto insert = [&] {
    auto [e, fresh] = t.FindOrInsert("key-" + std::to_string(next));
    ASSERT_TRUE(fresh);
    e->second.size = next++;
  };
  while (t.capacity() < (size_t{1} << 16)) insert();
  ASSERT_GT(t.slots_left_to_move(), 0u) << "the growth that just happened moved nothing yet";
  EXPECT_GE(t.slots_left_to_move() + move_step, t.capacity() / 2);
  int erased = 0, checks = 0;
  while (t.slots_left_to_move() > 0) {
    const size_t before = t.slots_left_to_move();
    insert();
    EXPECT_LE(before - t.slots_left_to_move(), move_step);
    if (next % 7 == 0) {  // erase a key wherever it is, now and then
      const std::string k = "key-" + std::to_string(next / 2);
      ASSERT_NE(t.Find(k), nullptr) << k;
      t.Erase(t.Find(k));
      ++erased;
    }
    if (next % 61 == 0) {  // mid-move: everything reachable, nothing twice
      ++checks;
      size_t visited = 0;
      t.ForEach([&](ObjectEntry&) { ++visited; });
      ASSERT_EQ(visited, t.size());
      for (int i = next % 5; i < next; i += 5) {
        ObjectEntry* e = t.Find("key-" + std::to_string(i));
        if (e == nullptr) continue;  // erased above
        EXPECT_EQ(e->second.size, static_cast<uint64_t>(i));
        EXPECT_EQ(t.FindOrInsert("key-" + std::to_string(i)).first, e);
      }
    }
  }
  EXPECT_EQ(t.size(), static_cast<size_t>(next - erased));
  int found = 0;
  for (int i = 0; i < next; ++i) found += t.Find("key-" + std::to_string(i)) != nullptr;
  EXPECT_EQ(found, next - erased);
  EXPECT_GT(erased, 0);
  EXPECT_GT(checks, 0);
}

TEST(ObjectTable, GrowthMovesAFewEntriesPerInsertAndEveryKeyStaysReachableMeanwhile) {
  ExpectGrowthSpreadOverInserts(8);
  ExpectGrowthSpreadOverInserts(ObjectTable::kMoveStep);
}

TEST(ObjectTable, AScanReturnsEveryKeyPresentThroughoutExactlyOnceWhileTheTableChanges) {
  ObjectTable t(/*move_step=*/4);  // moves that last many pages
  for (int i = 0; i < 1000; ++i) (void)t.FindOrInsert("stable-" + std::to_string(i));
  std::map<std::string, int> seen;
  uint64_t cursor = 0;
  int page = 0;
  int pages_during_a_move = 0;
  do {
    std::vector<ObjectEntry*> out;
    pages_during_a_move += t.slots_left_to_move() > 0;
    cursor = t.Scan(cursor, 16, &out);
    for (ObjectEntry* e : out) ++seen[e->first];
    // Between pages the table grows (twice over the scan) and loses other keys.
    for (int i = 0; i < 12; ++i) (void)t.FindOrInsert("new-" + std::to_string(page * 12 + i));
    for (int i = 0; i < 4; ++i) t.Erase(t.Find("new-" + std::to_string(page * 12 + 3 * i)));
    ++page;
  } while (cursor != 0 && page < 10000);
  ASSERT_EQ(cursor, 0u) << "the scan must finish";
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(seen["stable-" + std::to_string(i)], 1) << i;
  }
  for (const auto& [key, n] : seen) EXPECT_EQ(n, 1) << key;  // no key twice
  EXPECT_GT(t.capacity(), 2048u);                            // it did grow during the scan
  EXPECT_GT(pages_during_a_move, 10);  // and pages were read while entries moved over
}

}  // namespace
}  // namespace kvagent::master

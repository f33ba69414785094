// A follower's snapshot built by a child process (ReadReplication with `background`): the same
// records the loop would build at that moment, served to followers while they can continue from
// it, and a newer one once they cannot.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "master_test_util.h"

namespace kvagent::master {
namespace {

// Waits (within a minute) until no snapshot is being built.
bool Built(MasterService& svc) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (svc.SnapshotBuilding()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(BackgroundSnapshot, IsTheStateOfItsMomentAndServesFollowersWhileTheyCanContinueFromIt) {
  MasterOptions o;
  o.replication_log_bytes = 1 << 20;
  testing::Cluster c(o, 2);
  for (int i = 0; i < 100; ++i) c.Put(c.agents[i % 2], {"k" + std::to_string(i)}, 64, {"s"});
  const uint64_t other_epoch = c.svc->epoch() + 1;  // a new follower's: a snapshot
  ReplicationPage on_loop;
  ASSERT_TRUE(c.svc->ReadReplication(0, other_epoch, 1 << 20, &on_loop).ok());
  ASSERT_TRUE(on_loop.snapshot);

  ReplicationPage page;
  ASSERT_TRUE(c.svc->ReadReplication(0, other_epoch, 1 << 20, &page, true).ok());
  EXPECT_TRUE(page.pending);
  EXPECT_TRUE(page.bytes().empty());
  // Changes while the child writes are not in its snapshot; the follower gets them after it.
  c.Put(c.agents[0], {"during"}, 64, {"d"});
  ASSERT_TRUE(Built(*c.svc));
  ASSERT_TRUE(c.svc->ReadReplication(0, other_epoch, 1 << 20, &page, true).ok());
  EXPECT_FALSE(page.pending);
  EXPECT_TRUE(page.snapshot);
  EXPECT_EQ(page.last_seq, on_loop.last_seq);
  EXPECT_EQ(page.bytes(), on_loop.bytes());
  ReplicationPage after;
  ASSERT_TRUE(c.svc->ReadReplication(page.last_seq, c.svc->epoch(), 1 << 20, &after).ok());
  EXPECT_FALSE(after.snapshot);
  EXPECT_NE(after.bytes().find("during"), std::string::npos);

  // A second follower gets the same snapshot at once while the log still covers it.
  ReplicationPage second;
  ASSERT_TRUE(c.svc->ReadReplication(0, other_epoch, 1 << 20, &second, true).ok());
  EXPECT_FALSE(second.pending);
  EXPECT_EQ(second.last_seq, on_loop.last_seq);

  // Once the log moved past it (1 MiB of records), a follower could not continue from it: a
  // newer one is built.
  const std::string big_session(200, 'x');
  for (int i = 0; i < 6000; ++i)
    c.Put(c.agents[0], {"more-" + std::to_string(i)}, 64, {big_session});
  ReplicationPage third;
  ASSERT_TRUE(c.svc->ReadReplication(0, other_epoch, 1 << 20, &third, true).ok());
  EXPECT_TRUE(third.pending);
  ASSERT_TRUE(Built(*c.svc));
  ASSERT_TRUE(c.svc->ReadReplication(0, other_epoch, 1 << 20, &third, true).ok());
  EXPECT_FALSE(third.pending);
  EXPECT_GT(third.last_seq, on_loop.last_seq);
  EXPECT_NE(third.bytes().find("more-5999"), std::string::npos);
}

}  // namespace
}  // namespace kvagent::master

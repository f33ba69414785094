#include "kvagent/ipc/segment.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <random>

namespace kvagent::ipc {
namespace {

// A name no other concurrently running test uses: our pid plus a random epoch.
uint64_t RandomEpoch() { return std::random_device{}() | (uint64_t{std::random_device{}()} << 32); }

TEST(SegmentLayout, RejectsRingsThatAreNotPowersOfTwo) {
  EXPECT_FALSE(SegmentLayout::Compute(5000, 4096, 0).ok());
  EXPECT_FALSE(SegmentLayout::Compute(4096, 2048, 0).ok());
  auto layout = SegmentLayout::Compute(4096, 8192, 100);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->arena_bytes, 4096u);  // rounded to a page
  EXPECT_EQ(layout->total_bytes, layout->arena + 4096);
}

TEST(Segment, ClientOpensWhatTheAgentCreatedAndTheNameCanGoAtOnce) {
  const uint64_t epoch = RandomEpoch();
  const std::string name = SegmentName(getpid(), epoch, 1);
  auto layout = SegmentLayout::Compute(4096, 4096, 1 << 16);
  ASSERT_TRUE(layout.ok());
  auto created = Segment::Create(name, *layout, epoch, 1, SegmentOwner{});
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto opened = Segment::Open(name, layout->total_bytes);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(opened->header().client_id, 1u);
  EXPECT_EQ(opened->header().agent_epoch, epoch);
  EXPECT_EQ(opened->layout(), *layout);
  EXPECT_EQ(CountSegments(getpid()), 1);
  EXPECT_TRUE(Segment::Unlink(name));
  EXPECT_EQ(CountSegments(getpid()), 0);
  // Both mappings still share memory after the name is gone.
  created->arena()[100] = 42;
  EXPECT_EQ(opened->arena()[100], 42);
  EXPECT_FALSE(Segment::Open(name, layout->total_bytes).ok());
}

TEST(Segment, OpenRejectsAWrongSizeOrAScribbledHeader) {
  const uint64_t epoch = RandomEpoch();
  const std::string name = SegmentName(getpid(), epoch, 2);
  auto layout = SegmentLayout::Compute(4096, 4096, 4096);
  ASSERT_TRUE(layout.ok());
  auto created = Segment::Create(name, *layout, epoch, 2, SegmentOwner{});
  ASSERT_TRUE(created.ok());
  EXPECT_FALSE(Segment::Open(name, layout->total_bytes + 4096).ok());
  created->header().layout.arena_bytes = 1ULL << 40;
  EXPECT_FALSE(Segment::Open(name, layout->total_bytes).ok());
  created->header().layout = *layout;
  created->header().magic = 0;
  EXPECT_FALSE(Segment::Open(name, layout->total_bytes).ok());
  Segment::Unlink(name);
}

TEST(Segment, StaleNamesOfOurPidFromAnotherEpochAreRemoved) {
  const uint64_t epoch = RandomEpoch();
  auto layout = SegmentLayout::Compute(4096, 4096, 0);
  ASSERT_TRUE(layout.ok());
  auto old_one = Segment::Create(SegmentName(getpid(), epoch, 7), *layout, epoch, 7, {});
  auto current = Segment::Create(SegmentName(getpid(), epoch + 1, 8), *layout, epoch + 1, 8, {});
  ASSERT_TRUE(old_one.ok() && current.ok());
  EXPECT_EQ(RemoveStaleSegments(getpid(), epoch + 1), 1);
  EXPECT_EQ(CountSegments(getpid()), 1);
  Segment::Unlink(SegmentName(getpid(), epoch + 1, 8));
  EXPECT_EQ(CountSegments(getpid()), 0);
}

TEST(Segment, NamesOfADeadPidAreRemovedAndThoseOfAnyLiveProcessKept) {
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const pid_t live = getppid();  // alive, and not named kvagent: still counts as live
  const uint64_t epoch = RandomEpoch();
  auto layout = SegmentLayout::Compute(4096, 4096, 0);
  ASSERT_TRUE(layout.ok());
  auto of_dead = Segment::Create(SegmentName(dead, epoch, 1), *layout, epoch, 1, {});
  auto of_live = Segment::Create(SegmentName(live, epoch, 2), *layout, epoch, 2, {});
  ASSERT_TRUE(of_dead.ok() && of_live.ok());
  EXPECT_GE(RemoveStaleSegments(getpid(), epoch + 1), 1);
  EXPECT_EQ(CountSegments(dead), 0);
  EXPECT_EQ(CountSegments(live), 1);
  Segment::Unlink(SegmentName(live, epoch, 2));
}

}  // namespace
}  // namespace kvagent::ipc

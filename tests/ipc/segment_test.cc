#include "kvagent/ipc/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>

namespace kvagent::ipc {
namespace {

TEST(SegmentLayout, RejectsRingsThatAreNotPowersOfTwo) {
  EXPECT_FALSE(SegmentLayout::Compute(5000, 4096, 0).ok());
  EXPECT_FALSE(SegmentLayout::Compute(4096, 2048, 0).ok());
  auto layout = SegmentLayout::Compute(4096, 8192, 100);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->arena_bytes, 4096u);  // rounded to a page
  EXPECT_EQ(layout->total_bytes, layout->arena + 4096);
}

// What the agent does: create; what it passes to the client: a duplicate of the fd.
int PassedFd(const Segment& created) { return ::fcntl(created.fd(), F_DUPFD_CLOEXEC, 0); }

TEST(Segment, ClientMapsTheDescriptorTheAgentPassedAndSeesTheSameMemory) {
  auto layout = SegmentLayout::Compute(4096, 4096, 1 << 16);
  ASSERT_TRUE(layout.ok());
  auto created = Segment::Create(*layout, 42, 1);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto opened = Segment::Open(PassedFd(*created), layout->total_bytes);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  created->CloseFd();  // the agent keeps only its mapping
  EXPECT_EQ(created->fd(), -1);
  EXPECT_EQ(opened->header().agent_incarnation, 42u);
  EXPECT_EQ(opened->header().client_id, 1u);
  EXPECT_EQ(opened->layout(), *layout);
  opened->arena()[10] = 0x5a;  // both mappings share the pages
  EXPECT_EQ(created->arena()[10], 0x5a);
}

TEST(Segment, TheClientCannotShrinkOrGrowItsSegment) {
  auto layout = SegmentLayout::Compute(4096, 4096, 1 << 16);
  ASSERT_TRUE(layout.ok());
  auto created = Segment::Create(*layout, 1, 1);
  ASSERT_TRUE(created.ok());
  const int fd = PassedFd(*created);
  ASSERT_GE(fd, 0);
  // A hostile client truncating its segment would make the agent die of SIGBUS on its next
  // access; the seals refuse, and cannot be removed.
  EXPECT_NE(::ftruncate(fd, 4096), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(fd, static_cast<off_t>(layout->total_bytes) * 2), 0);
  EXPECT_NE(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), layout->total_bytes);
  created->arena().back() = 1;  // still all there
  ::close(fd);
}

TEST(Segment, EveryPageIsAllocatedUpFront) {
  auto layout = SegmentLayout::Compute(4096, 4096, 8 << 20);
  ASSERT_TRUE(layout.ok());
  auto created = Segment::Create(*layout, 1, 1);
  ASSERT_TRUE(created.ok());
  struct stat st {};
  ASSERT_EQ(::fstat(created->fd(), &st), 0);
  // Allocated blocks cover the whole size before anyone touched a page: no memory shortage
  // can surface later as SIGBUS.
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, layout->total_bytes);
}

TEST(Segment, OpenRefusesAWrongSizeAnUnsealedFileAndABadHeader) {
  auto layout = SegmentLayout::Compute(4096, 4096, 1 << 16);
  ASSERT_TRUE(layout.ok());
  auto created = Segment::Create(*layout, 1, 2);
  ASSERT_TRUE(created.ok());
  EXPECT_FALSE(Segment::Open(PassedFd(*created), layout->total_bytes + 4096).ok());
  EXPECT_FALSE(Segment::Open(-1, layout->total_bytes).ok());
  // Not sealed: not a segment from an agent of this version.
  const int plain = ::memfd_create("plain", MFD_CLOEXEC);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(::ftruncate(plain, static_cast<off_t>(layout->total_bytes)), 0);
  auto unsealed = Segment::Open(plain, layout->total_bytes);
  ASSERT_FALSE(unsealed.ok());
  EXPECT_NE(unsealed.status().message().find("not sealed"), std::string::npos);
  created->header().magic = 0;
  EXPECT_FALSE(Segment::Open(PassedFd(*created), layout->total_bytes).ok());
  created->header().magic = kSegmentMagic;
  created->header().layout.arena_bytes += 4096;  // inconsistent with the size
  EXPECT_FALSE(Segment::Open(PassedFd(*created), layout->total_bytes).ok());
}

}  // namespace
}  // namespace kvagent::ipc

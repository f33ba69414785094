#include "kvagent/common/process_fds.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>

namespace kvagent {
namespace {

TEST(ProcessFds, OpenFdCountFollowsOpenAndClose) {
  const int64_t before = OpenFdCount();
  ASSERT_GT(before, 2);  // at least stdin, stdout, stderr
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(OpenFdCount(), before + 1);
  close(fd);
  EXPECT_EQ(OpenFdCount(), before);
}

// In a child process: its limits and descriptors are its own.
int InChild(int (*body)()) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

TEST(ProcessFds, RaiseFdLimitLiftsTheSoftLimitToTheHardOne) {
  EXPECT_EQ(InChild([] {
              rlimit limit{};
              if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1;
              limit.rlim_max = std::min<rlim_t>(limit.rlim_max, 4096);
              limit.rlim_cur = 64;
              if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return 2;
              const FdLimit raised = RaiseFdLimit();
              if (raised.soft_before != 64 || raised.hard != limit.rlim_max) return 3;
              if (raised.soft != limit.rlim_max || FdSoftLimit() != limit.rlim_max) return 4;
              const std::string said = DescribeFdLimit(raised);
              if (said.find("raised from 64") == std::string::npos) return 5;
              return 0;
            }),
            0);
}

TEST(ProcessFds, AProcessWithNoDescriptorLeftCountsAsFull) {
  EXPECT_EQ(InChild([] {
              const int64_t open = OpenFdCount();
              rlimit limit{};
              if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1;
              limit.rlim_cur = static_cast<rlim_t>(open);  // every descriptor taken
              if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return 2;
              return OpenFdCount() == open ? 0 : 3;
            }),
            0);
}

TEST(ProcessFds, UseIsJudgedOnceAtNinetyAndAgainUnderEightyPercent) {
  bool warned = false;
  EXPECT_EQ(JudgeFdUse(899, 1000, &warned), FdUseWord::kNone);
  EXPECT_EQ(JudgeFdUse(900, 1000, &warned), FdUseWord::kWarn);
  EXPECT_TRUE(warned);
  EXPECT_EQ(JudgeFdUse(1000, 1000, &warned), FdUseWord::kNone);  // once
  EXPECT_EQ(JudgeFdUse(850, 1000, &warned), FdUseWord::kNone);   // not yet back
  EXPECT_EQ(JudgeFdUse(799, 1000, &warned), FdUseWord::kRecovered);
  EXPECT_FALSE(warned);
  EXPECT_EQ(JudgeFdUse(700, 1000, &warned), FdUseWord::kNone);
  EXPECT_EQ(JudgeFdUse(950, 1000, &warned), FdUseWord::kWarn);  // and again
  EXPECT_EQ(JudgeFdUse(-1, 1000, &warned), FdUseWord::kNone);   // unreadable
  EXPECT_EQ(JudgeFdUse(5, 0, &warned), FdUseWord::kNone);
}

TEST(ProcessFds, MetricsNameTheOpenDescriptorsAndTheLimit) {
  metrics::Exposition out;
  AppendFdMetrics(&out);
  const std::string text = out.Text();
  EXPECT_NE(text.find("# TYPE process_open_fds gauge\nprocess_open_fds "), std::string::npos);
  EXPECT_NE(text.find("# TYPE process_max_fds gauge\nprocess_max_fds "), std::string::npos);
}

}  // namespace
}  // namespace kvagent

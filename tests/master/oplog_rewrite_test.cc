// OpLog's background rewrite (the running master's compaction): a child process writes the
// snapshot while the log takes records; nothing flushed meanwhile is lost, and a child that
// fails, is killed or outlives its use leaves the old log whole.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kvagent/master/oplog.h"
#include "master_test_util.h"
#include "record_bytes.h"

namespace kvagent::master {
namespace {

using WriteAll = std::function<void(const std::function<void(std::string_view)>&)>;

class OpLogRewriteTest : public ::testing::Test {
 protected:
  std::vector<std::string> ReadAll() { return testing::ReadLogRecords(dir_); }
  // Calls FinishRewrite until the child is done (within a minute); its outcome.
  static Status Finish(OpLog& log) {
    Status st;
    const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (!log.FinishRewrite(&st)) {
      if (std::chrono::steady_clock::now() > until) return Internal("the rewrite never ended");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return st;
  }
  bool TmpExists() const { return std::filesystem::exists(dir_ + "/master.oplog.tmp"); }
  TempDir state_;
  const std::string dir_ = state_.path();
};

WriteAll Records(std::vector<std::string> records) {
  return [records = std::move(records)](const std::function<void(std::string_view)>& append) {
    for (const std::string& r : records) append(r);
  };
}

TEST_F(OpLogRewriteTest, RecordsFlushedWhileTheChildWritesFollowItsSnapshot) {
  auto log = std::move(OpLog::Open(dir_).value());
  for (int i = 0; i < 100; ++i) log->Append("history-" + std::to_string(i));
  ASSERT_TRUE(log->Flush().ok());
  ASSERT_TRUE(log->StartRewrite(Records({"snap-a", "snap-b"})).ok());
  EXPECT_TRUE(log->rewriting());
  // Records the log takes meanwhile, flushed in three writes (one before the child can be done,
  // others perhaps after: FinishRewrite alone installs the file).
  log->Append("after-1");
  ASSERT_TRUE(log->Flush().ok());
  log->Append("after-2");
  log->Append(std::string(300000, 'x'));
  ASSERT_TRUE(log->Flush().ok());
  ASSERT_TRUE(Finish(*log).ok());
  EXPECT_FALSE(log->rewriting());
  EXPECT_FALSE(TmpExists());
  log->Append("after-install");
  ASSERT_TRUE(log->Flush().ok());
  log.reset();
  const std::vector<std::string> records = ReadAll();
  ASSERT_EQ(records.size(), 6u);
  EXPECT_EQ(records[0], "snap-a");
  EXPECT_EQ(records[1], "snap-b");
  EXPECT_EQ(records[2], "after-1");
  EXPECT_EQ(records[3], "after-2");
  EXPECT_EQ(records[4], std::string(300000, 'x'));
  EXPECT_EQ(records[5], "after-install");
}

TEST_F(OpLogRewriteTest, AChildKilledMidwayLeavesTheOldLogWholeAndTakingRecords) {
  auto log = std::move(OpLog::Open(dir_).value());
  log->Append("kept-1");
  ASSERT_TRUE(log->Flush().ok());
  ASSERT_TRUE(log->StartRewrite([](const std::function<void(std::string_view)>& append) {
                   for (int i = 0; i < 20000; ++i) append(std::string(100, 's'));
                   ::raise(SIGKILL);  // in the child: as the OOM killer or an operator would
                 })
                  .ok());
  log->Append("kept-2");
  ASSERT_TRUE(log->Flush().ok());
  const Status st = Finish(*log);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("signal 9"), std::string::npos) << st.message();
  EXPECT_FALSE(TmpExists());
  log->Append("kept-3");
  ASSERT_TRUE(log->Flush().ok());
  // A later rewrite works.
  ASSERT_TRUE(log->StartRewrite(Records({"snap"})).ok());
  log->Append("kept-4");
  ASSERT_TRUE(log->Flush().ok());
  ASSERT_TRUE(Finish(*log).ok());
  log.reset();
  EXPECT_EQ(ReadAll(), (std::vector<std::string>{"snap", "kept-4"}));
}

TEST_F(OpLogRewriteTest, ALogClosedWhileItsChildWritesKillsTheChildAndKeepsTheOldLog) {
  {
    auto log = std::move(OpLog::Open(dir_).value());
    log->Append("kept-1");
    ASSERT_TRUE(log->Flush().ok());
    ASSERT_TRUE(log->StartRewrite([](const std::function<void(std::string_view)>& append) {
                     append("never-installed");
                     for (;;) ::pause();  // a child that never ends on its own
                   })
                    .ok());
    log->Append("kept-2");
    ASSERT_TRUE(log->Flush().ok());
  }  // kvmaster stopping: the child is killed and waited for
  EXPECT_FALSE(TmpExists());
  EXPECT_EQ(ReadAll(), (std::vector<std::string>{"kept-1", "kept-2"}));
}

// The child must not keep the parent's sockets open: a kvmaster restarted while an old child
// still wrote could not bind its ports (and the child's copy of a connection would keep it open).
TEST_F(OpLogRewriteTest, TheChildHoldsNoneOfTheParentsDescriptorsButItsFile) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  const int plain = ::open("/dev/null", O_RDONLY);  // no O_CLOEXEC: fork keeps it either way
  ASSERT_GE(plain, 0);
  auto log = std::move(OpLog::Open(dir_).value());
  log->Append("old");
  ASSERT_TRUE(log->Flush().ok());
  ASSERT_TRUE(
      log->StartRewrite([listener, plain](const std::function<void(std::string_view)>& append) {
           // In the child: a descriptor still open fails the rewrite (exit code 100).
           if (::fcntl(listener, F_GETFD) != -1 || ::fcntl(plain, F_GETFD) != -1) {
             ::_exit(100);
           }
           append("snap");
         })
          .ok());
  const Status st = Finish(*log);
  EXPECT_TRUE(st.ok()) << st.ToString();
  log.reset();
  ::close(listener);
  ::close(plain);
  EXPECT_EQ(ReadAll(), std::vector<std::string>{"snap"});
}

TEST_F(OpLogRewriteTest, ARewriteAlreadyRunningIsRefusedAndASynchronousOneReplacesIt) {
  auto log = std::move(OpLog::Open(dir_).value());
  log->Append("old");
  ASSERT_TRUE(log->Flush().ok());
  ASSERT_TRUE(log->StartRewrite([](const std::function<void(std::string_view)>& append) {
                   append("background");
                   for (;;) ::pause();
                 })
                  .ok());
  EXPECT_FALSE(log->StartRewrite(Records({"second"})).ok());
  ASSERT_TRUE(log->Rewrite(Records({"at-once"})).ok());  // gives the background one up
  EXPECT_FALSE(log->rewriting());
  log.reset();
  EXPECT_EQ(ReadAll(), std::vector<std::string>{"at-once"});
}

// On a full state dir the rewrite's file takes room the records need: a reservation the disk
// refuses gives the rewrite up, and the records go on.
TEST(OpLogRewriteFullDiskTest, AReservationTheDiskRefusesGivesTheRewriteUpForItsRoom) {
  if (geteuid() != 0) GTEST_SKIP() << "mounts a small tmpfs: needs root (CI is root)";
  char tmpl[] = "/tmp/kvmaster-rewrite-disk-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  ASSERT_EQ(mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m"), 0);
  {
    auto log = std::move(OpLog::Open(dir).value());
    log->Append("kept");
    ASSERT_TRUE(log->Flush().ok());
    // A child that writes until the disk is full, then waits.
    ASSERT_TRUE(log->StartRewrite([](const std::function<void(std::string_view)>& append) {
                     for (int i = 0; i < 64; ++i) append(std::string(64 << 10, 'f'));
                     for (;;) ::pause();
                   })
                    .ok());
    struct statvfs vfs {};
    for (int i = 0; i < 10000; ++i) {  // until the child filled it (at most ~10 s)
      ASSERT_EQ(::statvfs(dir.c_str(), &vfs), 0);
      if (vfs.f_bavail * vfs.f_frsize < (256u << 10)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_LT(vfs.f_bavail * vfs.f_frsize, 256u << 10);
    EXPECT_TRUE(log->Reserve(300 << 10));
    EXPECT_FALSE(log->rewriting());
    EXPECT_FALSE(std::filesystem::exists(dir + "/master.oplog.tmp"));
    log->Append(std::string(300 << 10, 'r'));
    EXPECT_TRUE(log->Flush().ok());
  }
  const std::vector<std::string> records = testing::ReadLogRecords(dir);
  EXPECT_EQ(records.size(), 2u);
  if (records.size() == 2) {
    EXPECT_EQ(records[0], "kept");
    EXPECT_EQ(records[1].size(), size_t{300} << 10);
  }
  umount2(dir.c_str(), MNT_DETACH);
  std::filesystem::remove_all(dir);
}

// The master's compaction: what changes while the child writes (puts, removes) is in the log
// the restarted master reads.
TEST_F(OpLogRewriteTest, ChangesWhileTheMasterCompactsInTheBackgroundSurviveARestart) {
  MasterOptions o;
  o.state_dir = dir_;
  o.compact_log_bytes = 1;  // compact at the first Tick that finds the log grown
  testing::Cluster c(o, 1);
  for (int i = 0; i < 50; ++i) c.Put(c.agents[0], {"before-" + std::to_string(i)}, 64, {"s"});
  ASSERT_TRUE(c.svc->Flush().ok());
  const uint64_t before = c.svc->Stats().log_compactions;
  c.clock.Advance(10);
  c.svc->Tick();  // forks the child: the state of the 50 puts
  // Meanwhile (no Tick: the new file can only be installed by one).
  c.Put(c.agents[0], {"during"}, 64, {"d"});
  ASSERT_TRUE(c.Remove({"before-7"}).results[0].ok());
  ASSERT_TRUE(c.svc->Flush().ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (c.svc->Stats().log_compactions == before && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    c.svc->Tick();
  }
  ASSERT_GT(c.svc->Stats().log_compactions, before);
  EXPECT_FALSE(TmpExists());
  c.Put(c.agents[0], {"after"}, 64, {"a"});
  ASSERT_TRUE(c.svc->Flush().ok());
  c.Restart();
  EXPECT_EQ(c.svc->SessionOf("before-0"), "s");
  EXPECT_EQ(c.svc->SessionOf("before-7"), std::nullopt);
  EXPECT_EQ(c.svc->SessionOf("during"), "d");
  EXPECT_EQ(c.svc->SessionOf("after"), "a");
  EXPECT_EQ(c.svc->Stats().keys, 51u);
}

}  // namespace
}  // namespace kvagent::master

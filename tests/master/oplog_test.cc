// OpLog: framing, replay, a torn tail after a crash, and the compacting rewrite.
#include "kvagent/master/oplog.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "master_test_util.h"

namespace kvagent::master {
namespace {

class OpLogTest : public ::testing::Test {
 protected:
  OpLogTest() {
    char tmpl[] = "/tmp/kvmaster-oplog-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  ~OpLogTest() override { std::filesystem::remove_all(dir_); }
  std::vector<std::string> ReadAll() {
    auto log = OpLog::Open(dir_);
    EXPECT_TRUE(log.ok());
    std::vector<std::string> out;
    auto n = log.value()->Replay([&](std::string_view p) {
      out.emplace_back(p);
      return Status::Ok();
    });
    EXPECT_TRUE(n.ok());
    return out;
  }
  std::string path() const { return dir_ + "/master.oplog"; }
  std::string dir_;
};

TEST_F(OpLogTest, RecordsComeBackInOrder) {
  {
    auto log = std::move(OpLog::Open(dir_).value());
    log->Append("first");
    log->Append(std::string(100000, 'x'));
    log->Append("");
    ASSERT_TRUE(log->Flush().ok());
  }
  auto records = ReadAll();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0], "first");
  EXPECT_EQ(records[1].size(), 100000u);
  EXPECT_EQ(records[2], "");
}

TEST_F(OpLogTest, ATornTailIsCutOffAndEverythingBeforeItKept) {
  {
    auto log = std::move(OpLog::Open(dir_).value());
    log->Append("kept-1");
    log->Append("kept-2");
    ASSERT_TRUE(log->Flush().ok());
  }
  const auto intact = std::filesystem::file_size(path());
  {
    std::ofstream out(path(), std::ios::app | std::ios::binary);
    out.write("\x40\x00\x00\x00\x12\x34", 6);  // a header cut short by a crash
  }
  auto records = ReadAll();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1], "kept-2");
  EXPECT_EQ(std::filesystem::file_size(path()), intact);  // truncated back
}

TEST_F(OpLogTest, ACorruptRecordEndsTheReplayThere) {
  {
    auto log = std::move(OpLog::Open(dir_).value());
    log->Append("good");
    log->Append("flipped");
    log->Append("after");
    ASSERT_TRUE(log->Flush().ok());
  }
  {
    std::fstream f(path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8 + 4 + 8 + 2);  // inside the payload of the second record
    f.put('X');
  }
  auto records = ReadAll();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0], "good");
}

TEST_F(OpLogTest, TheLogIsCompactedAtStartSoItTracksLiveStateNotHistory) {
  MasterOptions o;
  o.state_dir = dir_;
  testing::Cluster c(o, 1);
  for (int round = 0; round < 20; ++round) {
    c.Put(c.agents[0], {"churn"}, 64, {"s"});
    ASSERT_TRUE(c.Remove({"churn"}).results[0].ok());
  }
  c.Put(c.agents[0], {"kept"}, 64, {"s"});
  ASSERT_TRUE(c.svc->Flush().ok());
  const auto before = std::filesystem::file_size(path());
  c.Restart();
  EXPECT_LT(std::filesystem::file_size(path()), before / 4);
  EXPECT_EQ(c.svc->SessionOf("kept"), "s");
  EXPECT_EQ(c.svc->SessionOf("churn"), std::nullopt);
}

}  // namespace
}  // namespace kvagent::master

// ReplicationLog: numbering, the byte budget, and paging of the records a standby fetches.
#include "replication_log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvagent::master {
namespace {

std::vector<std::string> Payloads(const std::string& framed) {
  std::vector<std::string> out;
  EXPECT_TRUE(ForEachFramedRecord(framed, [&](std::string_view p) { out.emplace_back(p); }));
  return out;
}

TEST(ReplicationLog, AFrameThatRunsPastTheEndIsReported) {
  std::string framed;
  AppendFramedRecord("whole", &framed);
  AppendFramedRecord("cut short", &framed);
  framed.resize(framed.size() - 3);
  std::vector<std::string> seen;
  EXPECT_FALSE(ForEachFramedRecord(framed, [&](std::string_view p) { seen.emplace_back(p); }));
  EXPECT_EQ(seen, std::vector<std::string>{"whole"});
}

TEST(ReplicationLog, RecordsAreNumberedFromOneAndReadBackAfterAnySequenceNumber) {
  ReplicationLog log(1 << 20);
  EXPECT_EQ(log.last_seq(), 0u);
  EXPECT_TRUE(log.Covers(0));
  for (int i = 1; i <= 5; ++i) log.Append("record-" + std::to_string(i));
  EXPECT_EQ(log.last_seq(), 5u);
  std::string out;
  EXPECT_EQ(log.ReadAfter(2, 1 << 20, &out), 5u);
  EXPECT_EQ(Payloads(out), (std::vector<std::string>{"record-3", "record-4", "record-5"}));
  out.clear();
  EXPECT_EQ(log.ReadAfter(5, 1 << 20, &out), 5u);  // nothing new
  EXPECT_TRUE(out.empty());
  EXPECT_FALSE(log.Covers(6));  // ahead of this log: another master's numbers
}

TEST(ReplicationLog, APageStopsAtItsByteLimitButAlwaysCarriesOneRecord) {
  ReplicationLog log(1 << 20);
  for (int i = 0; i < 10; ++i) log.Append(std::string(100, static_cast<char>('a' + i)));
  std::string out;
  EXPECT_EQ(log.ReadAfter(0, 250, &out), 2u);  // 2 x 104 bytes fit in 250, a third does not
  EXPECT_EQ(Payloads(out).size(), 2u);
  out.clear();
  EXPECT_EQ(log.ReadAfter(2, 10, &out), 3u);  // one record even over the limit
  EXPECT_EQ(Payloads(out), std::vector<std::string>{std::string(100, 'c')});
}

TEST(ReplicationLog, OldBlocksGoOverTheBudgetAndTheirSequenceNumbersAreNoLongerCovered) {
  ReplicationLog log(3 << 20);  // three 1 MiB blocks
  const std::string record(100'000, 'x');
  for (int i = 0; i < 100; ++i) log.Append(record);  // about 10 MiB
  EXPECT_EQ(log.last_seq(), 100u);
  EXPECT_FALSE(log.Covers(0));  // the first records are gone: a standby there needs a snapshot
  EXPECT_TRUE(log.Covers(99));
  EXPECT_TRUE(log.Covers(100));
  std::string out;
  EXPECT_EQ(log.ReadAfter(95, 1 << 30, &out), 100u);
  EXPECT_EQ(Payloads(out).size(), 5u);
}

TEST(ReplicationLog, ABudgetOfZeroKeepsNothing) {
  ReplicationLog log(0);
  EXPECT_FALSE(log.enabled());
  log.Append("ignored");
  EXPECT_EQ(log.last_seq(), 0u);
}

}  // namespace
}  // namespace kvagent::master

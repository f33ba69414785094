// OpLog: framing, replay, a torn tail after a crash, and the compacting rewrite.
#include "kvagent/master/oplog.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "master_test_util.h"
#include "record_bytes.h"

namespace kvagent::master {
namespace {

// An agent record as kvmasters before the agent key wrote it (record type 1, ending at the name).
std::string AgentRecord(uint32_t id, uint64_t incarnation, const std::string& name) {
  std::string record;
  RecordWriter w(&record);
  w.U8(1);  // agent
  w.U32(id);
  w.U64(incarnation);
  w.Str(name);
  return record;
}

class OpLogTest : public ::testing::Test {
 protected:
  OpLogTest() {
    char tmpl[] = "/tmp/kvmaster-oplog-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  ~OpLogTest() override { std::filesystem::remove_all(dir_); }
  std::vector<std::string> ReadAll() { return testing::ReadLogRecords(dir_); }
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

// Offset of record `i` (0-based) in a version-2 file of records with the given payload sizes.
uint64_t RecordOffset(const std::vector<size_t>& sizes, size_t i) {
  uint64_t at = 16;  // the file header
  for (size_t j = 0; j < i; ++j) at += OpLog::kFrameBytes + sizes[j];
  return at;
}

void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  const char c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x20));
}

TEST_F(OpLogTest, ADamagedRecordInTheMiddleStopsTheReplayNamingTheFileOffsetAndChoices) {
  {
    auto log = std::move(OpLog::Open(dir_).value());
    log->Append("good");
    log->Append("flipped");
    log->Append("after");
    ASSERT_TRUE(log->Flush().ok());
  }
  const auto size = std::filesystem::file_size(path());
  const uint64_t second = RecordOffset({4, 7, 5}, 1);
  FlipByte(path(), second + OpLog::kFrameBytes + 2);  // inside the second record's payload
  auto log = std::move(OpLog::Open(dir_).value());
  std::vector<std::string> seen;
  auto n = log->Replay([&](std::string_view p) {
    seen.emplace_back(p);
    return Status::Ok();
  });
  ASSERT_FALSE(n.ok());
  const std::string& m = n.status().message();
  EXPECT_NE(m.find(path()), std::string::npos) << m;
  EXPECT_NE(m.find("offset " + std::to_string(second)), std::string::npos) << m;
  EXPECT_NE(m.find("--truncate-damaged-log"), std::string::npos) << m;
  EXPECT_EQ(std::filesystem::file_size(path()), size);  // nothing cut
}

TEST_F(OpLogTest, ADamagedFirstRecordOrLengthFieldIsFoundTooAndNothingIsCut) {
  {
    auto log = std::move(OpLog::Open(dir_).value());
    for (int i = 0; i < 4; ++i) log->Append("record-" + std::to_string(i));
    ASSERT_TRUE(log->Flush().ok());
  }
  const auto size = std::filesystem::file_size(path());
  for (uint64_t where : {RecordOffset({8, 8, 8, 8}, 0) + OpLog::kFrameBytes,  // first payload
                         RecordOffset({8, 8, 8, 8}, 1) + 4}) {                // a length field
    FlipByte(path(), where);
    auto log = std::move(OpLog::Open(dir_).value());
    auto n = log->Replay([](std::string_view) { return Status::Ok(); });
    EXPECT_FALSE(n.ok()) << where;
    EXPECT_EQ(std::filesystem::file_size(path()), size);
    FlipByte(path(), where);  // repair for the next round
  }
}

TEST_F(OpLogTest, WithTruncateDamagedTheRecordsBeforeTheDamageAreKept) {
  {
    auto log = std::move(OpLog::Open(dir_).value());
    log->Append("good");
    log->Append("flipped");
    log->Append("after");
    ASSERT_TRUE(log->Flush().ok());
  }
  const uint64_t second = RecordOffset({4, 7, 5}, 1);
  FlipByte(path(), second + OpLog::kFrameBytes + 2);
  OpLogOptions o;
  o.truncate_damaged = true;
  auto log = std::move(OpLog::Open(dir_, o).value());
  std::vector<std::string> seen;
  auto n = log->Replay([&](std::string_view p) {
    seen.emplace_back(p);
    return Status::Ok();
  });
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], "good");
  EXPECT_EQ(std::filesystem::file_size(path()), second);
}

TEST_F(OpLogTest, ARecordTheApplierRejectsIsDamageToo) {
  {
    auto log = std::move(OpLog::Open(dir_).value());
    log->Append("ok");
    log->Append("bad");
    log->Append("ok");
    ASSERT_TRUE(log->Flush().ok());
  }
  auto log = std::move(OpLog::Open(dir_).value());
  auto n = log->Replay(
      [](std::string_view p) { return p == "bad" ? Internal("unknown record") : Status::Ok(); });
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("unknown record"), std::string::npos);
}

// A version-1 file ([u32 length][u32 FNV-1a][payload] frames, no header), as kvmaster 0.1 wrote.
// The header holds nothing but the format: damage there loses nothing when the records after it
// are intact. With the first record damaged as well the log is refused; it was once read as a
// version-1 log of no record and cut to 0 bytes, without a word.
TEST_F(OpLogTest, ADamagedHeaderIsRepairedAndWithADamagedFirstRecordTooNothingIsCut) {
  {
    auto log = std::move(OpLog::Open(dir_).value());
    for (int i = 0; i < 4; ++i) log->Append("record-" + std::to_string(i));
    ASSERT_TRUE(log->Flush().ok());
  }
  const auto size = std::filesystem::file_size(path());
  for (uint64_t where : {0, 3, 7}) {
    FlipByte(path(), where);
    EXPECT_EQ(ReadAll().size(), 4u) << where;
    EXPECT_EQ(std::filesystem::file_size(path()), size);
    EXPECT_EQ(ReadAll().size(), 4u) << "the header was written anew";
  }
  FlipByte(path(), 3);
  FlipByte(path(), RecordOffset({8, 8, 8, 8}, 0) + OpLog::kFrameBytes);  // first payload
  auto log = std::move(OpLog::Open(dir_).value());
  auto n = log->Replay([](std::string_view) { return Status::Ok(); });
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("damaged at its start"), std::string::npos)
      << n.status().message();
  EXPECT_EQ(std::filesystem::file_size(path()), size);
}

TEST_F(OpLogTest, AVersion1LogIsReadAndItsTornTailCut) {
  auto frame = [](std::string_view payload) {
    uint32_t h = 2166136261u;
    for (unsigned char ch : payload) {
      h ^= ch;
      h *= 16777619u;
    }
    std::string out;
    const uint32_t len = static_cast<uint32_t>(payload.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(len >> (8 * i)));
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(h >> (8 * i)));
    return out + std::string(payload);
  };
  const std::string intact = frame("one") + frame("two");
  {
    std::ofstream out(path(), std::ios::binary);
    out << intact << std::string("\x09\x00\x00", 3);
  }
  auto records = ReadAll();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1], "two");
  EXPECT_EQ(std::filesystem::file_size(path()), intact.size());
}

TEST_F(OpLogTest, AReservationTheDiskCannotGiveIsRefusedUntilTheDiskHasRoom) {
  auto log = std::move(OpLog::Open(dir_).value());
  EXPECT_TRUE(log->Reserve(100));
  log->Append(std::string(100, 'a'));
  EXPECT_FALSE(log->Reserve(uint64_t{1} << 60));  // no file system has an exabyte for us
  EXPECT_FALSE(log->writable());
  EXPECT_NE(log->error().find("state dir"), std::string::npos) << log->error();
  EXPECT_FALSE(log->Reserve(uint64_t{1} << 60));  // asked again only after a pause
  EXPECT_TRUE(log->Probe());
  EXPECT_TRUE(log->Reserve(10));
  log->Append("0123456789");
  ASSERT_TRUE(log->Flush().ok());
  EXPECT_EQ(ReadAll().size(), 2u);
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

// A write that fails for want of space drops what it held (the file as before, nothing left
// buffered): a standby whose state dir is full fetches the same records again each retry, and
// a kept buffer held them once per retry (memory growing while the disk stays full, then every
// copy written when space came back). A first write that failed kept the file's header in the
// buffer, and the next write put a second header in the middle of the log.
class FullDiskOpLogTest : public ::testing::Test {
 protected:
  FullDiskOpLogTest() {
    char tmpl[] = "/tmp/kvmaster-oplog-disk-XXXXXX";
    dir_ = mkdtemp(tmpl);
    mounted_ = geteuid() == 0 && mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=512k") == 0;
  }
  ~FullDiskOpLogTest() override {
    if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
    std::filesystem::remove_all(dir_);
  }
  void Fill() {
    std::ofstream out(dir_ + "/filler", std::ios::binary | std::ios::app);
    const std::string chunk(4096, '\0');
    while (out.write(chunk.data(), chunk.size()) && out.flush()) {
    }
  }
  void Free() { std::filesystem::remove(dir_ + "/filler"); }
  std::vector<std::string> ReadAll() { return testing::ReadLogRecords(dir_); }
  std::string dir_;
  bool mounted_ = false;
};

TEST_F(FullDiskOpLogTest, AFailedWriteKeepsNothingBufferedSoARetryWritesEachRecordOnce) {
  if (!mounted_) GTEST_SKIP() << "mounts a small tmpfs: needs root (CI is root)";
  {
    auto log = std::move(OpLog::Open(dir_).value());
    log->Append("kept");
    ASSERT_TRUE(log->Flush().ok());
    Fill();
    const std::string page(64 << 10, 'p');
    for (int retry = 0; retry < 3; ++retry) {  // the same page, fetched again after each failure
      log->Append(page);
      EXPECT_FALSE(log->Flush().ok());
    }
    Free();
    log->Append(page);
    ASSERT_TRUE(log->Flush().ok());
  }
  const std::vector<std::string> records = ReadAll();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0], "kept");
  EXPECT_EQ(records[1].size(), size_t{64} << 10);
}

TEST_F(FullDiskOpLogTest, AFailedFirstWriteLeavesALogThatOpens) {
  if (!mounted_) GTEST_SKIP() << "mounts a small tmpfs: needs root (CI is root)";
  {
    auto log = std::move(OpLog::Open(dir_).value());
    Fill();
    log->Append(std::string(64 << 10, 'a'));
    EXPECT_FALSE(log->Flush().ok());
    Free();
    log->Append("b");
    ASSERT_TRUE(log->Flush().ok());
  }
  EXPECT_EQ(ReadAll(), std::vector<std::string>{"b"});
}

// Records whose counts promise more entries than the record holds: the master refuses to start
// naming the damage, instead of sizing a vector from the count (up to 2^32 entries).
class RecordCountTest : public OpLogTest {
 protected:
  // Writes an agent record, `record`, and the agent record again (so `record` is not taken for
  // a torn tail), and opens a master on the log.
  Status OpenWith(const std::string& record) {
    {
      auto log = std::move(OpLog::Open(dir_).value());
      const std::string agent = AgentRecord(7, 42, "node-a");
      log->Append(agent);
      log->Append(record);
      log->Append(agent);
      EXPECT_TRUE(log->Flush().ok());
    }
    MasterOptions o;
    o.state_dir = dir_;
    ManualClock clock;
    auto svc = MasterService::Open(o, &clock);
    return svc.ok() ? Status::Ok() : svc.status();
  }
};

// Agent records of builds before the agent key was logged end at the name: the agent comes back
// with no key bound and binds one at its next registration. A record with the key binds it at
// once; one with the incarnation the agent replaced refuses that one; bytes after those (a later
// build's fields) are read past.
TEST_F(OpLogTest, AnAgentRecordWithoutAKeyBindsTheKeyOfTheNextRegistration) {
  {
    auto log = std::move(OpLog::Open(dir_).value());
    std::string keyed = AgentRecord(8, 43, "node-new");
    RecordWriter k(&keyed);
    k.U64(0xabcdef);
    k.U64(41);  // the incarnation it replaced
    k.U8(2);    // and the two before it
    k.U64(40);
    k.U64(39);
    k.U32(0x5555);                                            // a field of a later build
    std::string key_only = AgentRecord(9, 44, "node-keyed");  // the build before `replaced`
    RecordWriter ko(&key_only);
    ko.U64(0x1234);
    log->Append(AgentRecord(7, 42, "node-old"));
    log->Append(keyed);
    log->Append(key_only);
    ASSERT_TRUE(log->Flush().ok());
  }
  // The log holds agent keys: its owner alone reads it, also a file an older kvmaster made.
  ASSERT_EQ(::chmod(path().c_str(), 0644), 0);
  MasterOptions options;
  options.state_dir = dir_;
  ManualClock clock;
  auto svc = std::move(MasterService::Open(options, &clock).value());
  struct stat st {};
  ASSERT_EQ(::stat(path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(svc->CheckAgentKey(7, 12345).ok());
  EXPECT_EQ(svc->RegisterAgent("node-old", 42, 99).value(), 7u);
  EXPECT_EQ(svc->CheckAgentKey(7, 12345).code(), ErrorCode::kInvalidParams);
  EXPECT_TRUE(svc->CheckAgentKey(7, 99).ok());
  EXPECT_EQ(svc->CheckAgentKey(8, 99).code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(svc->RegisterAgent("node-new", 43, 0xabcdef).value(), 8u);
  const auto replaced = svc->RegisterAgent("node-new", 41, 0xabcdef);
  ASSERT_EQ(replaced.status().code(), ErrorCode::kInvalidParams);
  EXPECT_NE(replaced.status().message().find("was replaced by a newer registration of the name "
                                             "(incarnation 43)"),
            std::string::npos)
      << replaced.status().message();
  for (uint64_t earlier : {40, 39}) {
    EXPECT_EQ(svc->RegisterAgent("node-new", earlier, 0xabcdef).status().code(),
              ErrorCode::kInvalidParams)
        << earlier;
  }
  EXPECT_EQ(svc->RegisterAgent("node-keyed", 44, 0x1234).value(), 9u);
  EXPECT_TRUE(svc->RegisterAgent("node-keyed", 45, 0x1234).ok());  // its restart
}

TEST_F(RecordCountTest, APoolRecordCountingMoreEndpointsThanItHoldsIsDamage) {
  std::string record;
  RecordWriter w(&record);
  w.U8(2);  // pool
  w.U32(3);
  w.U32(7);
  w.U32(0);
  w.U64(1 << 20);
  w.U32(0xFFFFFFFF);  // endpoints; none follow
  const Status st = OpenWith(record);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("malformed record of type 2"), std::string::npos) << st.message();
}

TEST_F(RecordCountTest, AnObjectRecordCountingMoreReplicasThanItHoldsIsDamage) {
  testing::ObjectRecordFields f;
  f.replica_count = 0xFFFFFFFF;  // one follows
  const Status st = OpenWith(testing::ObjectRecordBytes(f));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("malformed object record"), std::string::npos) << st.message();
}

// An object record's replicas are ordered by part from part 0 (Object::parts): a part number
// out of that order is damage. Before, a replica of part 2^32 - 16 made the restore size its
// per-part state by it (a 512 MiB bitmap from a 70-byte record; found by fuzz_master_restore).
TEST_F(RecordCountTest, AnObjectRecordWithAPartOutOfOrderIsDamage) {
  for (const uint32_t part : {1u, 0xFFFFFFF0u}) {
    testing::ObjectRecordFields f;
    f.part = part;
    std::filesystem::remove(path());
    const Status st = OpenWith(testing::ObjectRecordBytes(f));
    ASSERT_FALSE(st.ok()) << part;
    EXPECT_NE(
        st.message().find("malformed object record (replica 0 of part " + std::to_string(part)),
        std::string::npos)
        << st.message();
  }
}

// A soft pin's time left is a u64 in the record: any value restores (within the field that
// holds it), without signed overflow (the sanitizer build checks; found by
// fuzz_master_restore).
TEST_F(RecordCountTest, AnObjectRecordWithAnyTimeLeftOnItsSoftPinRestores) {
  for (const uint64_t left : {uint64_t{0}, uint64_t{1} << 40, ~uint64_t{0} >> 1, ~uint64_t{0}}) {
    testing::ObjectRecordFields f;
    f.flags = 2;  // soft pin
    f.soft_pin_left_ms = left;
    std::filesystem::remove(path());
    EXPECT_TRUE(OpenWith(testing::ObjectRecordBytes(f)).ok()) << left;
  }
}

// A snapshot holds committed state only: a write in flight (a put not ended, an upsert that
// rewrites an object) when the log is compacted while running, or when a standby pulls a
// snapshot, must not come back readable after a restart (its bytes may never have arrived).
TEST_F(OpLogTest, ACompactionWhileWritesAreInFlightKeepsThemOut) {
  MasterOptions o;
  o.state_dir = dir_;
  o.compact_log_bytes = 1;  // compact at the first Tick that finds the log grown
  testing::Cluster c(o, 1);
  c.Put(c.agents[0], {"done", "rewritten"}, 64, {"s", "s"});
  c.Start(c.agents[0], {"in-flight"}, {64}, {"s"});
  ASSERT_TRUE(c.last_status.ok());
  c.Start(c.agents[0], {"rewritten"}, {64}, {"s"}, {}, /*upsert=*/true);
  ASSERT_TRUE(c.last_status.ok());
  for (int i = 0; i < 40; ++i) c.Put(c.agents[0], {"grow-" + std::to_string(i)}, 64, {"s"});
  const uint64_t before = c.svc->Stats().log_compactions;
  c.clock.Advance(10);
  // The compaction runs in a child process: Tick starts it, a later Tick installs its file.
  const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  do {
    c.svc->Tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (c.svc->Stats().log_compactions == before && std::chrono::steady_clock::now() < until);
  ASSERT_GT(c.svc->Stats().log_compactions, before);
  c.Restart();
  EXPECT_EQ(c.svc->SessionOf("done"), "s");
  EXPECT_EQ(c.svc->SessionOf("in-flight"), std::nullopt);
  EXPECT_EQ(c.svc->SessionOf("rewritten"), std::nullopt);
  const std::vector<std::string> keys = {"in-flight", "rewritten"};  // the views point into it
  auto k = testing::Views(keys);
  KeyResults exist;
  ASSERT_TRUE(c.svc->BatchExist(k, &exist).ok());
  EXPECT_EQ(exist.exists, (std::vector<uint8_t>{0, 0}));
}

}  // namespace
}  // namespace kvagent::master

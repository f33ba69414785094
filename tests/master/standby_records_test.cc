// A standby keeps only records it could replay. A primary that sends a record this kvmaster
// cannot replay (a newer kvmaster's record, or damage the frame's CRC does not catch) must not
// poison the standby's log: the log would then refuse to start exactly when the standby is
// promoted. The primary here is a real ROUTER that answers the standby's Replicate requests
// with pages the test writes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "kvagent/master/master_service.h"
#include "kvagent/master/oplog.h"
#include "kvagent/master/standby.h"
#include "kvagent/schemas/master_generated.h"
#include "record_bytes.h"
#include "replication_log.h"
#include "temp_dir.h"

namespace kvagent::master {
namespace {

namespace fb = kvagent::master_proto;
using namespace std::chrono_literals;

// An object record whose one replica is of part `part` (only part 0 can come first).
std::string ObjectOfPart(const std::string& key, uint32_t part) {
  testing::ObjectRecordFields f;
  f.key = key;
  f.session = "session";
  f.part = part;
  return testing::ObjectRecordBytes(f);
}

std::string Framed(const std::vector<std::string>& records) {
  std::string out;
  for (const std::string& r : records) AppendFramedRecord(r, &out);
  return out;
}

// A primary that answers every Replicate with the current page: by default a snapshot of
// `records` at epoch 7.
class ScriptedPrimary {
 public:
  ScriptedPrimary() : router_(context_, zmq::socket_type::router) {
    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::rcvtimeo, 20);
    router_.bind("tcp://127.0.0.1:0");
    endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { Run(); });
  }
  ~ScriptedPrimary() {
    stop_ = true;
    thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  // How the records go out: inside the reply, or after it as a part of their own (what
  // kvmaster does for a follower that asks), or as a primary that is broken or hostile would:
  // a part one byte short of what the reply names, or no part at all.
  enum class Records { kInline, kDetached, kDetachedShort, kDetachedMissing };
  void Serve(std::vector<std::string> records, uint64_t last_seq, bool snapshot = true,
             uint64_t epoch = 7, Records how = Records::kInline) {
    std::lock_guard<std::mutex> lock(mu_);
    records_ = Framed(records);
    last_seq_ = last_seq;
    snapshot_ = snapshot;
    epoch_ = epoch;
    how_ = how;
    answered_ = 0;
  }
  uint64_t answered() const { return answered_.load(); }
  // Whether the last Replicate asked for detached records.
  bool asked_detached() const { return asked_detached_.load(); }

 private:
  void Run() {
    while (!stop_) {
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(router_, std::back_inserter(frames))) continue;
      if (frames.size() != 3) continue;
      // FlatBuffers wants its buffer aligned; a ZMQ message's bytes need not be.
      std::vector<uint64_t> aligned((frames[2].size() + 7) / 8 + 1);
      auto* request = reinterpret_cast<uint8_t*>(aligned.data());
      std::memcpy(request, frames[2].data(), frames[2].size());
      flatbuffers::Verifier v(request, frames[2].size());
      if (!v.VerifyBuffer<fb::Request>(nullptr)) continue;
      const fb::Request* req = flatbuffers::GetRoot<fb::Request>(request);
      const uint64_t id = req->request_id();
      asked_detached_ =
          req->body_as_Replicate() != nullptr && req->body_as_Replicate()->detached_records();
      flatbuffers::FlatBufferBuilder b;
      std::string part;
      bool send_part = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        flatbuffers::Offset<fb::ReplicateReply> body;
        if (how_ == Records::kInline) {
          body = fb::CreateReplicateReply(
              b, epoch_, snapshot_, last_seq_,
              b.CreateVector(reinterpret_cast<const uint8_t*>(records_.data()), records_.size()));
        } else {
          body = fb::CreateReplicateReply(b, epoch_, snapshot_, last_seq_, 0, records_.size());
          part = records_;
          if (how_ == Records::kDetachedShort) part.pop_back();
          send_part = how_ != Records::kDetachedMissing;
        }
        b.Finish(fb::CreateReply(b, id, 0, 0, fb::ReplyBody::ReplicateReply, body.Union(), epoch_));
      }
      router_.send(frames[0], zmq::send_flags::sndmore);
      router_.send(zmq::message_t(), zmq::send_flags::sndmore);
      router_.send(zmq::buffer(b.GetBufferPointer(), b.GetSize()),
                   send_part ? zmq::send_flags::sndmore : zmq::send_flags::none);
      if (send_part) router_.send(zmq::buffer(part), zmq::send_flags::none);
      ++answered_;
    }
  }

  zmq::context_t context_{1};
  zmq::socket_t router_;
  std::string endpoint_;
  std::mutex mu_;
  std::string records_;
  uint64_t last_seq_ = 0;
  bool snapshot_ = true;
  uint64_t epoch_ = 7;
  Records how_ = Records::kInline;
  std::atomic<bool> asked_detached_{false};
  std::atomic<uint64_t> answered_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

template <typename F>
bool WaitUntil(F done, std::chrono::milliseconds limit = 10s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

using kvagent::testing::TempDir;

// A standby of `primary` that asks at once and keeps its log in `dir`.
Result<std::unique_ptr<Standby>> StartStandby(const ScriptedPrimary& primary, const TempDir& dir) {
  StandbyOptions o;
  o.primary = primary.endpoint();
  o.state_dir = dir.path();
  o.wait = 0ms;
  o.poll = 5ms;
  return Standby::Start(o);
}

// Opens a master on the log a standby kept in `dir`, as its promotion does: its agent count.
Result<uint64_t> AgentsWhenPromoted(const TempDir& dir) {
  MasterOptions mo;
  mo.state_dir = dir.path();
  ManualClock clock;
  auto promoted = MasterService::Open(mo, &clock);
  if (!promoted.ok()) return promoted.status();
  return static_cast<uint64_t>((*promoted)->Stats().agents);
}

TEST(StandbyRecords, APageWithARecordThisMasterCannotReplayIsNotKeptAndPromotionStillWorks) {
  ScriptedPrimary primary;
  TempDir dir;
  // A page whose second record has a replica of part 5 before any part 0: not replayable.
  primary.Serve({testing::AgentRecordBytes(9, "node-a"), ObjectOfPart("bad", 5),
                 testing::AgentRecordBytes(10, "node-b")},
                3);
  auto standby = StartStandby(primary, dir);
  ASSERT_TRUE(standby.ok()) << standby.status().ToString();
  // Two answers (the standby asks again 1 s after a refused page): neither is kept.
  ASSERT_TRUE(WaitUntil([&] { return primary.answered() >= 2; }));
  EXPECT_FALSE((*standby)->synced());
  EXPECT_EQ((*standby)->applied_seq(), 0u);
  EXPECT_GE((*standby)->refused_pages(), 1u);

  // The primary's pages are sound again: the standby takes them.
  primary.Serve({testing::AgentRecordBytes(9, "node-a"), ObjectOfPart("good", 0)}, 4);
  ASSERT_TRUE(WaitUntil([&] { return (*standby)->applied_seq() == 4; }));
  EXPECT_TRUE((*standby)->synced());
  (*standby)->Stop();

  // Promotion: the log the standby kept opens.
  const auto agents = AgentsWhenPromoted(dir);
  ASSERT_TRUE(agents.ok()) << agents.status().ToString();
  EXPECT_EQ(*agents, 1u);
}

// A page continues the log only within one epoch. A page of another epoch without a snapshot
// (another master's history at the address the standby follows) is refused, not appended onto
// this history, where its placements could overlap the ones the log holds.
TEST(StandbyRecords, APageOfAnotherEpochWithoutASnapshotIsNotAppended) {
  ScriptedPrimary primary;
  TempDir dir;
  primary.Serve({testing::AgentRecordBytes(9, "node-a"), ObjectOfPart("first", 0)}, 2);
  auto standby = StartStandby(primary, dir);
  ASSERT_TRUE(standby.ok()) << standby.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return (*standby)->applied_seq() == 2; }));

  primary.Serve({testing::AgentRecordBytes(10, "node-b")}, 3, /*snapshot=*/false, /*epoch=*/8);
  ASSERT_TRUE(WaitUntil([&] { return primary.answered() >= 2; }));
  EXPECT_EQ((*standby)->applied_seq(), 2u);
  EXPECT_GE((*standby)->refused_pages(), 1u);

  // The new epoch's snapshot replaces the log.
  primary.Serve({testing::AgentRecordBytes(10, "node-b"), testing::AgentRecordBytes(11, "node-c")},
                5, /*snapshot=*/true, /*epoch=*/8);
  ASSERT_TRUE(WaitUntil([&] { return (*standby)->applied_seq() == 5; }));
  (*standby)->Stop();

  const auto agents = AgentsWhenPromoted(dir);
  ASSERT_TRUE(agents.ok()) << agents.status().ToString();
  EXPECT_EQ(*agents, 2u);  // node-b and node-c; node-a's epoch is gone
}

// A standby asks for its records detached (kvmaster sends a snapshot from where it lies, without
// copying it into the reply) and keeps them only when the part that follows the reply is exactly
// the size the reply names: a part cut short, or missing, is no page.
TEST(StandbyRecords, DetachedRecordsAreKeptOnlyWhenTheirPartIsTheSizeTheReplyNames) {
  using Records = ScriptedPrimary::Records;
  ScriptedPrimary primary;
  TempDir dir;
  const std::vector<std::string> page = {testing::AgentRecordBytes(9, "node-a"),
                                         ObjectOfPart("k", 0)};
  for (Records broken : {Records::kDetachedShort, Records::kDetachedMissing}) {
    primary.Serve(page, 2, true, 7, broken);
    auto standby = StartStandby(primary, dir);
    ASSERT_TRUE(standby.ok()) << standby.status().ToString();
    ASSERT_TRUE(WaitUntil([&] { return primary.answered() >= 2; }));
    EXPECT_TRUE(primary.asked_detached());
    EXPECT_FALSE((*standby)->synced());
    EXPECT_EQ((*standby)->applied_seq(), 0u);
    (*standby)->Stop();
  }

  primary.Serve(page, 2, true, 7, Records::kDetached);
  auto standby = StartStandby(primary, dir);
  ASSERT_TRUE(standby.ok()) << standby.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return (*standby)->applied_seq() == 2; }));
  // Then a page after it, detached as well.
  primary.Serve({testing::AgentRecordBytes(10, "node-b")}, 3, /*snapshot=*/false, 7,
                Records::kDetached);
  ASSERT_TRUE(WaitUntil([&] { return (*standby)->applied_seq() == 3; }));
  (*standby)->Stop();
  const auto agents = AgentsWhenPromoted(dir);
  ASSERT_TRUE(agents.ok()) << agents.status().ToString();
  EXPECT_EQ(*agents, 2u);
}

}  // namespace
}  // namespace kvagent::master

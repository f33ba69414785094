// A follower's snapshot built by a child process (ReadReplication with `background`): the same
// records the loop would build at that moment, served to followers while they can continue from
// it, and a newer one once they cannot.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "kvagent/master/master_rpc.h"
#include "master_test_util.h"
#include "rpc_test_util.h"

namespace kvagent::master {
namespace {

namespace fb = kvagent::master_proto;

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

// A follower that asks for its records detached gets a reply without them, and the records as
// MasterRpc::last().detached: the built snapshot itself, not a copy, kept mapped by the owner a
// transport holds after the master has dropped the snapshot. Where the transport cannot send a
// part of their own (may_detach false: the framed one), the reply carries them as before.
TEST(BackgroundSnapshot, ADetachedReplyIsTheSnapshotItselfAndOutlivesTheMastersCopy) {
  MasterOptions o;
  o.replication_log_bytes = 1 << 20;
  testing::Cluster c(o, 1);
  for (int i = 0; i < 100; ++i) c.Put(c.agents[0], {"k" + std::to_string(i)}, 64, {"s"});
  const uint64_t other_epoch = c.svc->epoch() + 1;
  ReplicationPage on_loop;
  ASSERT_TRUE(c.svc->ReadReplication(0, other_epoch, 1 << 20, &on_loop).ok());
  MasterRpc rpc(c.svc.get());
  rpc.set_background_snapshots(true);
  const testing::Bytes ask = testing::ReplicateMsg(0, other_epoch, 0, "f", 1, /*detached=*/true);
  std::vector<uint8_t> bytes;
  auto call = [&](bool may_detach) {
    const auto reply = rpc.Handle(ask, may_detach);
    bytes.assign(reply.begin(), reply.end());
    return testing::ParseReply(bytes.data(), bytes.size());
  };
  ASSERT_TRUE(rpc.Handle(ask, true).size() > 0 && rpc.last().replicate_pending);
  ASSERT_TRUE(Built(*c.svc));

  const fb::Reply* r = call(true);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->status(), 0);
  const fb::ReplicateReply* page = r->body_as_ReplicateReply();
  ASSERT_NE(page, nullptr);
  EXPECT_TRUE(page->snapshot());
  EXPECT_EQ(page->last_seq(), on_loop.last_seq);
  EXPECT_TRUE(page->records() == nullptr || page->records()->size() == 0);
  EXPECT_EQ(page->detached_bytes(), on_loop.bytes().size());
  ASSERT_EQ(rpc.last().detached, on_loop.bytes());
  const std::string_view held = rpc.last().detached;
  const std::shared_ptr<const void> owner = rpc.last().detached_owner;
  ASSERT_NE(owner, nullptr);

  // The same request on a transport that cannot detach: the records inside the reply.
  r = call(false);
  page = r->body_as_ReplicateReply();
  ASSERT_NE(page, nullptr);
  EXPECT_EQ(page->detached_bytes(), 0u);
  ASSERT_NE(page->records(), nullptr);
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(page->records()->data()),
                             page->records()->size()),
            on_loop.bytes());
  EXPECT_TRUE(rpc.last().detached.empty());

  // The log moves past the snapshot: the master drops its copy and builds a newer one. The
  // bytes a transport still holds stay mapped and unchanged.
  const std::string big_session(200, 'x');
  for (int i = 0; i < 6000; ++i)
    c.Put(c.agents[0], {"more-" + std::to_string(i)}, 64, {big_session});
  ASSERT_TRUE(rpc.Handle(ask, true).size() > 0 && rpc.last().replicate_pending);
  ASSERT_TRUE(Built(*c.svc));
  r = call(true);
  ASSERT_EQ(r->status(), 0);
  EXPECT_GT(r->body_as_ReplicateReply()->last_seq(), on_loop.last_seq);
  EXPECT_EQ(held, on_loop.bytes());
}

// Records the loop reads are detached too, moved into memory the transport holds, never
// copied: a snapshot built on the loop, and a page after a follower's position of 64 KiB or
// more. A smaller page (the usual one: the few records made since the last poll) stays inside
// the reply, where copying it costs less than a part of its own.
TEST(BackgroundSnapshot, RecordsReadOnTheLoopAreDetachedWhenASnapshotOrLarge) {
  MasterOptions o;
  o.replication_log_bytes = 4 << 20;
  testing::Cluster c(o, 1);
  c.Put(c.agents[0], {"a"}, 64, {"s-a"});
  MasterRpc rpc(c.svc.get());
  ReplicationPage snapshot;
  ASSERT_TRUE(c.svc->ReadReplication(0, c.svc->epoch() + 1, 1 << 20, &snapshot).ok());
  std::vector<uint8_t> bytes;
  auto ask = [&](uint64_t after_seq, uint64_t epoch) {
    const auto reply = rpc.Handle(testing::ReplicateMsg(after_seq, epoch, 0, "f", 1, true), true);
    bytes.assign(reply.begin(), reply.end());
    return testing::ParseReply(bytes.data(), bytes.size());
  };
  const fb::Reply* r = ask(0, c.svc->epoch() + 1);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->status(), 0);
  EXPECT_TRUE(r->body_as_ReplicateReply()->snapshot());
  EXPECT_EQ(r->body_as_ReplicateReply()->detached_bytes(), snapshot.bytes().size());
  EXPECT_EQ(rpc.last().detached, snapshot.bytes());
  const uint64_t seq = r->body_as_ReplicateReply()->last_seq();

  // One record: inside the reply.
  c.Put(c.agents[0], {"b"}, 64, {"s-b"});
  ReplicationPage next;
  ASSERT_TRUE(c.svc->ReadReplication(seq, c.svc->epoch(), 1 << 20, &next).ok());
  r = ask(seq, c.svc->epoch());
  ASSERT_EQ(r->status(), 0);
  EXPECT_EQ(r->body_as_ReplicateReply()->detached_bytes(), 0u);
  EXPECT_TRUE(rpc.last().detached.empty());
  ASSERT_NE(r->body_as_ReplicateReply()->records(), nullptr);
  EXPECT_EQ(std::string_view(
                reinterpret_cast<const char*>(r->body_as_ReplicateReply()->records()->data()),
                r->body_as_ReplicateReply()->records()->size()),
            next.bytes());

  // A few hundred kilobytes of records: detached.
  const std::string long_session(200, 'x');
  for (int i = 0; i < 1000; ++i)
    c.Put(c.agents[0], {"more-" + std::to_string(i)}, 64, {long_session});
  ReplicationPage large;
  ASSERT_TRUE(c.svc->ReadReplication(seq + 1, c.svc->epoch(), 4 << 20, &large).ok());
  ASSERT_GE(large.bytes().size(), 64u << 10);
  r = ask(seq + 1, c.svc->epoch());
  ASSERT_EQ(r->status(), 0);
  EXPECT_FALSE(r->body_as_ReplicateReply()->snapshot());
  EXPECT_EQ(r->body_as_ReplicateReply()->detached_bytes(), large.bytes().size());
  EXPECT_EQ(rpc.last().detached, large.bytes());

  // Nothing new: an empty page, nothing detached.
  const uint64_t newest = r->body_as_ReplicateReply()->last_seq();
  ask(newest, c.svc->epoch());
  EXPECT_TRUE(rpc.last().replicate_empty);
  EXPECT_TRUE(rpc.last().detached.empty());
}

// A snapshot larger than one reply can carry (inside the reply: FlatBuffers' 2 GiB; detached:
// what a follower's socket takes) is refused with NO_SPACE and a message naming both sizes,
// never sent broken. The limits are lowered here to the test's snapshot.
TEST(BackgroundSnapshot, ASnapshotLargerThanAReplyCanCarryIsRefusedSayingSo) {
  MasterOptions o;
  o.replication_log_bytes = 1 << 20;
  testing::Cluster c(o, 1);
  for (int i = 0; i < 100; ++i) c.Put(c.agents[0], {"k" + std::to_string(i)}, 64, {"s"});
  ReplicationPage snapshot;
  ASSERT_TRUE(c.svc->ReadReplication(0, c.svc->epoch() + 1, 1 << 20, &snapshot).ok());
  const uint64_t size = snapshot.bytes().size();
  MasterRpc rpc(c.svc.get());
  std::vector<uint8_t> bytes;
  auto ask = [&](bool detached) {
    const auto reply =
        rpc.Handle(testing::ReplicateMsg(0, c.svc->epoch() + 1, 0, "f", 1, detached), true);
    bytes.assign(reply.begin(), reply.end());
    return testing::ParseReply(bytes.data(), bytes.size());
  };
  rpc.set_replication_limits(size - 1, size);  // fits only detached
  const fb::Reply* r = ask(false);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kNoSpace));
  const std::string message = r->message() ? r->message()->str() : "";
  EXPECT_NE(message.find(std::to_string(size) + " bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("detached_records"), std::string::npos) << message;
  r = ask(true);
  ASSERT_EQ(r->status(), 0);
  EXPECT_EQ(r->body_as_ReplicateReply()->detached_bytes(), size);

  rpc.set_replication_limits(size - 1, size - 1);  // fits neither
  r = ask(true);
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kNoSpace));
  EXPECT_TRUE(rpc.last().detached.empty());
  rpc.set_replication_limits(size, size);  // fits inline again
  r = ask(false);
  ASSERT_EQ(r->status(), 0);
  EXPECT_EQ(r->body_as_ReplicateReply()->records()->size(), size);
}

}  // namespace
}  // namespace kvagent::master

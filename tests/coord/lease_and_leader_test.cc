// LeaseKeeper (a lease kept alive, and until when its holder may act on it) and LeaderWatcher
// (discovery of a cluster's leader) against a real etcd, including etcd stopping and restarting.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <mutex>

#include "agent_process.h"
#include "etcd_process.h"
#include "kvagent/coord/cluster_address.h"
#include "kvagent/coord/etcd_client.h"
#include "kvagent/coord/leader_watch.h"
#include "kvagent/coord/lease_keeper.h"
#include "kvagent/coord/records.h"

namespace kvagent::coord {
namespace {

using testing::EtcdProcess;
using testing::TempDir;
using testing::WaitUntil;
using namespace std::chrono_literals;

class EtcdLeases : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(etcd_.Start()) << "etcd did not start; see " << etcd_.log_path();
    client_ = EtcdClient::Create({{etcd_.endpoint()}, 2000ms}).value();
  }
  EtcdClientOptions Options() const { return {{etcd_.endpoint()}, 1000ms}; }
  TempDir dir_;
  EtcdProcess etcd_{dir_.path()};
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdLeases, AKeptLeaseOutlivesItsTtlAndAKeeperLearnsWhenItIsGone) {
  auto keeper = LeaseKeeper::Start(Options(), 2s);
  ASSERT_TRUE(keeper.ok()) << keeper.status().ToString();
  EXPECT_TRUE((*keeper)->valid());
  EXPECT_EQ((*keeper)->margin(), 500ms);  // a quarter of the 2 s TTL
  ASSERT_TRUE(client_->Put("/lk/k", "v", (*keeper)->id()).ok());
  // Renewed several times: past the TTL the key is still there.
  ASSERT_TRUE(WaitUntil([&] { return (*keeper)->renewals() >= 6; }));
  EXPECT_TRUE(client_->Get("/lk/k")->has_value());
  EXPECT_TRUE((*keeper)->valid());
  EXPECT_FALSE((*keeper)->lost());
  // Someone revokes it: the keeper finds out at its next renewal and is never valid again.
  ASSERT_TRUE(client_->RevokeLease((*keeper)->id()).ok());
  ASSERT_TRUE(WaitUntil([&] { return (*keeper)->lost(); }));
  EXPECT_FALSE((*keeper)->valid());
}

// The members' default: a 1 s lease (the test's etcd grants it: its election timeout is 500 ms).
// Was: the renewal timeout was half the TTL in whole seconds, 0, and every call was refused.
TEST_F(EtcdLeases, AOneSecondLeaseIsGrantedAndKept) {
  auto keeper = LeaseKeeper::Start(Options(), 1s);
  ASSERT_TRUE(keeper.ok()) << keeper.status().ToString();
  EXPECT_EQ((*keeper)->ttl(), 1000ms);
  EXPECT_EQ((*keeper)->margin(), 250ms);
  ASSERT_TRUE(client_->Put("/lk/one", "v", (*keeper)->id()).ok());
  ASSERT_TRUE(WaitUntil([&] { return (*keeper)->renewals() >= 8; }));  // past 2 TTLs
  EXPECT_TRUE(client_->Get("/lk/one")->has_value());
  EXPECT_TRUE((*keeper)->valid());
}

TEST_F(EtcdLeases, AKeeperCutOffFromEtcdStopsBeingValidWhileTheLeaseStillLives) {
  auto keeper = LeaseKeeper::Start(Options(), 4s);  // margin 1 s
  ASSERT_TRUE(keeper.ok());
  ASSERT_TRUE(client_->Put("/lk/held", "v", (*keeper)->id()).ok());
  ASSERT_TRUE(WaitUntil([&] { return (*keeper)->renewals() >= 1; }));
  etcd_.Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntil([&] { return !(*keeper)->valid(); }));
  EXPECT_GT((*keeper)->failures(), 0u);
  etcd_.Signal(SIGCONT);
  // It stopped before the lease could expire: the lease (and its key) are still there, and
  // the keeper is valid again after its next renewal.
  ASSERT_TRUE(WaitUntil([&] { return (*keeper)->valid(); }));
  EXPECT_FALSE((*keeper)->lost());
  EXPECT_TRUE(client_->Get("/lk/held")->has_value());
}

TEST_F(EtcdLeases, RevokeRemovesTheKeysAtOnce) {
  auto keeper = LeaseKeeper::Start(Options(), 10s);
  ASSERT_TRUE(keeper.ok());
  ASSERT_TRUE(client_->Put("/lk/r", "v", (*keeper)->id()).ok());
  (*keeper)->Revoke();
  EXPECT_FALSE((*keeper)->valid());
  EXPECT_FALSE(client_->Get("/lk/r")->has_value());
}

TEST(LeaseKeeperAlone, NoEtcdNoLease) {
  const std::string dead = "127.0.0.1:" + std::to_string(testing::UnusedPort());
  auto keeper = LeaseKeeper::Start({{dead}, 300ms}, 2s);
  ASSERT_FALSE(keeper.ok());
  EXPECT_EQ(keeper.status().code(), ErrorCode::kMasterUnavailable);
}

// The leader as agents discover it: epoch = the leader key's create revision; a record without
// endpoints (a leader still starting) is no leader yet; a deleted key is no leader.
TEST_F(EtcdLeases, AWatcherFollowsTheLeaderKeyAcrossAnEtcdRestart) {
  const ClusterAddress address{{etcd_.endpoint()}, "wc"};
  const ClusterKeys keys("wc");
  std::mutex mu;
  std::vector<uint64_t> seen;  // epochs passed to on_change (0: none)
  auto watcher = LeaderWatcher::Start(address, [&](const std::optional<Leader>& l) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(l ? l->epoch : 0);
  });
  ASSERT_TRUE(watcher.ok());
  ASSERT_TRUE(WaitUntil([&] { return (*watcher)->etcd_reachable(); }));
  EXPECT_FALSE((*watcher)->current().has_value());

  LeaderRecord starting{"m1", "", "", "", ""};
  auto created = client_->CreateIfAbsent(keys.leader(), starting.Encode(), 0);
  ASSERT_TRUE(created.ok() && created->created);
  const uint64_t epoch = static_cast<uint64_t>(created->create_revision);
  ASSERT_TRUE(WaitUntil([&] { return (*watcher)->highest_epoch() == epoch; }));
  EXPECT_FALSE((*watcher)->current().has_value());  // not serving yet
  LeaderRecord serving{"m1", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3", ""};
  ASSERT_TRUE(
      *client_->PutIfCreatedAt(keys.leader(), serving.Encode(), 0, created->create_revision));
  auto leader = (*watcher)->WaitForLeader(10s);
  ASSERT_TRUE(leader.has_value());
  EXPECT_EQ(leader->epoch, epoch);
  EXPECT_EQ(leader->record.rpc, "tcp://127.0.0.1:1");

  etcd_.Kill();
  ASSERT_TRUE(WaitUntil([&] { return !(*watcher)->etcd_reachable(); }));
  EXPECT_TRUE((*watcher)->current().has_value());  // the last known leader stays
  ASSERT_TRUE(etcd_.Restart());
  client_ = EtcdClient::Create({{etcd_.endpoint()}, 2000ms}).value();
  ASSERT_TRUE(*client_->DeleteIfCreatedAt(keys.leader(), created->create_revision));
  ASSERT_TRUE(WaitUntil([&] { return !(*watcher)->current().has_value(); }));
  auto next = client_->CreateIfAbsent(keys.leader(), serving.Encode(), 0);
  ASSERT_TRUE(next.ok() && next->created);
  ASSERT_TRUE(WaitUntil([&] {
    auto l = (*watcher)->current();
    return l && l->epoch == static_cast<uint64_t>(next->create_revision);
  }));
  EXPECT_GT(static_cast<uint64_t>(next->create_revision), epoch);
  // current() changes just before on_change runs (on the watcher's thread): wait for the call.
  EXPECT_TRUE(WaitUntil([&] {
    std::lock_guard<std::mutex> lock(mu);
    return !seen.empty() && seen.back() == static_cast<uint64_t>(next->create_revision);
  }));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_GE(seen.size(), 3u);  // the first leader, none, the next
}

}  // namespace
}  // namespace kvagent::coord

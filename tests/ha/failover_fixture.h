// The fixture of the HA fault tests (failover_test.cc) and the soak run (soak_test.cc): a real
// etcd, three kvmasters (m1 leading), two agents finding the leader through etcd, and while a
// fault runs: a load of puts and gets on each agent, a probe asking every master whether it
// serves, a router per agent fed by its events, and a sampler of each agent's epoch. Verify()
// checks every guarantee and prints the HA line.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <functional>

#include "ha_observers.h"
#include "ha_support.h"

namespace kvagent::testing {

constexpr const char* kCluster = "ha";

// The epochs an agent's link reports over time; they must never go back.
class EpochSampler {
 public:
  explicit EpochSampler(Client* c) : client_(c), thread_([this] { Run(); }) {}
  ~EpochSampler() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int backwards() const { return backwards_.load(); }

 private:
  void Run() {
    uint64_t newest = 0;
    while (!stop_) {
      const uint64_t e = CounterOf(client_->Stat(), "agent.master_link.epoch");
      if (e != 0 && e < newest) ++backwards_;
      newest = std::max(newest, e);
      std::this_thread::sleep_for(20ms);
    }
  }
  Client* client_;
  std::atomic<bool> stop_{false};
  std::atomic<int> backwards_{0};
  std::thread thread_;
};

class Failover : public ::testing::Test {
 protected:
  // etcd, m1 as the leader (in `leader_ns` when given), m2 and m3 following it, two agents (with
  // `agent_extra`).
  void StartCluster(const Args& master_extra = {}, NetnsLink* leader_ns = nullptr,
                    const Args& agent_extra = {}) {
    ASSERT_TRUE(access(kEtcdBinary, X_OK) == 0) << "etcd-server is not installed (make deps)";
    std::vector<std::string> also;
    if (leader_ns != nullptr) also.push_back(leader_ns->service());
    etcd_ = std::make_unique<EtcdProcess>(dir_.path(), "127.0.0.1", Args{}, also);
    ASSERT_TRUE(etcd_->Start()) << "see " << etcd_->log_path();
    etcd_endpoint_ = etcd_->endpoint();
    if (leader_ns != nullptr) {
      masters_.push_back(std::make_unique<HaMaster>(
          "m1", leader_ns->service() + ":" + std::to_string(etcd_->port()), kCluster, master_extra,
          leader_ns->inner(), leader_ns->Prefix()));
    } else {
      masters_.push_back(std::make_unique<HaMaster>("m1", etcd_endpoint_, kCluster, master_extra));
    }
    ASSERT_TRUE(WaitUntil([&] {
      auto l = LeaderOf(etcd_endpoint_, kCluster);
      return l && l->record.name == "m1";
    })) << "m1 did not lead"
        << masters_[0]->LogTail();
    for (const char* name : {"m2", "m3"}) {
      masters_.push_back(std::make_unique<HaMaster>(name, etcd_endpoint_, kCluster, master_extra));
    }
    const uint64_t epoch = LeaderOf(etcd_endpoint_, kCluster)->epoch;
    for (const char* name : {"m2", "m3"}) {
      ASSERT_TRUE(WaitUntil([&] {
        auto m = MemberOf(etcd_endpoint_, kCluster, name);
        return m && m->role == "follower" && m->epoch == epoch;
      })) << name
          << " did not follow m1" << master(name).LogTail() << master("m1").LogTail();
    }
    const Args agent = Concat(ClusterAgentArgs(etcd_->ClusterUrl(kCluster)), agent_extra);
    a_ = std::make_unique<NodeAgent>(agent);
    b_ = std::make_unique<NodeAgent>(agent);
    ASSERT_TRUE(a_->started() && b_->started());
    ca_ = ConnectClient(*a_, 3000ms);
    cb_ = ConnectClient(*b_, 3000ms);
    ASSERT_TRUE(ca_ && cb_);
    for (Client* c : {ca_.get(), cb_.get()}) {
      ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.master_link.ready") == 1; }));
    }
  }

  void StartLoad() {
    probe_ = std::make_unique<ServingProbe>(etcd_endpoint_, kCluster);
    router_a_ = std::make_unique<Router>(a_->run_dir());
    router_b_ = std::make_unique<Router>(b_->run_dir());
    stat_a_ = ConnectClient(*a_, 3000ms);
    stat_b_ = ConnectClient(*b_, 3000ms);
    epochs_a_ = std::make_unique<EpochSampler>(stat_a_.get());
    epochs_b_ = std::make_unique<EpochSampler>(stat_b_.get());
    load_a_ = std::make_unique<Load>(ca_.get(), "a");
    load_b_ = std::make_unique<Load>(cb_.get(), "b");
    const auto start = Clock::now();
    ASSERT_TRUE(WaitUntil([&] {
      return load_a_->successes_after(start) >= 20 && load_b_->successes_after(start) >= 20;
    }));
    std::this_thread::sleep_for(1s);  // the first leader serves a while under the load
  }

  // Both clients succeed again after `fault`.
  bool ServingAgainAfter(Clock::time_point fault) {
    return WaitUntil(
        [&] {
          return load_a_->successes_after(fault) >= 10 && load_b_->successes_after(fault) >= 10;
        },
        60s);
  }

  // Stops the load, waits for a quiet, settled cluster and checks everything; prints the HA line.
  // Returns the number of acknowledged puts lost.
  size_t Verify(const std::string& name, Clock::time_point fault) {
    std::this_thread::sleep_for(1500ms);  // more load on the settled cluster
    const auto recovered_a = load_a_->RecoveredAfter(fault);
    const auto recovered_b = load_b_->RecoveredAfter(fault);
    load_a_->Stop();
    load_b_->Stop();
    const auto leader = LeaderOf(etcd_endpoint_, kCluster);
    EXPECT_TRUE(leader.has_value());
    if (!leader) return 0;
    // Both agents on the leader, their relays live, each router caught up with its agent.
    for (auto [client, router] :
         {std::pair{stat_a_.get(), router_a_.get()}, std::pair{stat_b_.get(), router_b_.get()}}) {
      EXPECT_TRUE(WaitUntil(
          [&] {
            const Reply st = client->Stat();
            std::string phase;
            CounterOf(st, "agent.relay.phase", &phase);
            return CounterOf(st, "agent.master_link.ready") == 1 &&
                   CounterOf(st, "agent.master_link.epoch") == leader->epoch && phase == "live" &&
                   router->next_seq() == CounterOf(st, "agent.relay.next_seq");
          },
          30s));
    }
    epochs_a_->Stop();
    epochs_b_->Stop();
    probe_->Stop();

    std::set<std::string> listed;
    ListOptions lo;
    do {
      const Reply page = ca_->List(lo);
      EXPECT_TRUE(page.ok()) << page.status.ToString();
      if (!page.ok()) break;
      for (const auto& k : page.listed) listed.insert(k.key);
      lo.cursor = page.next_cursor;
    } while (lo.cursor != 0);
    EXPECT_EQ(router_a_->keys(), listed) << "agent a's event stream does not match kvctl ls";
    EXPECT_EQ(router_b_->keys(), listed) << "agent b's event stream does not match kvctl ls";

    std::map<std::string, Load::Acked> acked = load_a_->acked();
    const auto acked_b = load_b_->acked();
    acked.insert(acked_b.begin(), acked_b.end());
    size_t lost = 0, read_ok = 0, read_failed = 0;
    int wrong = load_a_->wrong_bytes() + load_b_->wrong_bytes();
    int64_t latest_loss_ms = -1000000;
    for (const auto& [key, a] : acked) {
      if (listed.count(key) == 0) {
        ++lost;
        latest_loss_ms = std::max<int64_t>(
            latest_loss_ms,
            std::chrono::duration_cast<std::chrono::milliseconds>(a.at - fault).count());
        continue;
      }
      const Read r = GetValue(key[0] == 'a' ? *ca_ : *cb_, key, 16384);
      if (r.code == ErrorCode::kOk) {
        ++read_ok;
        if (r.bytes != a.value) ++wrong;
      } else {
        ++read_failed;
      }
    }
    // Only the replication window is lost: a follower holds a prefix of the leader's log, and
    // each client puts one key after the other (a-0, a-1, ...), so of the puts the old leader
    // acknowledged before the fault, the lost ones are the newest: none that survived was
    // acknowledged after one that was lost.
    // A lost put reaches each router as a BlockRemoved, without clearing its index: the relay's
    // one AllBlocksCleared is the first batch of its agent's start.
    size_t lost_unannounced = 0;
    for (const auto& [key, a] : acked) {
      if (listed.count(key) != 0) continue;
      for (const Router* router : {router_a_.get(), router_b_.get()}) {
        // (A put whose BlockStored the old leader never published was not announced at all.)
        lost_unannounced += router->saw_stored(key) && !router->saw_removed(key) ? 1 : 0;
      }
    }
    EXPECT_EQ(lost_unannounced, 0u) << "lost puts that a router was not told of as BlockRemoved";
    EXPECT_EQ(router_a_->clears(), 1u) << "agent a's stream cleared its routers' index again";
    EXPECT_EQ(router_b_->clears(), 1u) << "agent b's stream cleared its routers' index again";
    const size_t outside_window = LostOutsideTheWindow(acked, listed, fault);
    EXPECT_EQ(outside_window, 0u)
        << "acknowledged puts lost although a later put of the same client survived";
    EXPECT_EQ(wrong, 0) << "gets answered OK with bytes other than those stored";
    EXPECT_EQ(read_failed, 0u) << "acknowledged values that are listed but cannot be read";
    EXPECT_EQ(probe_->violations(), 0) << "a master served after a newer epoch had served";
    EXPECT_EQ(epochs_a_->backwards() + epochs_b_->backwards(), 0) << "an agent went back an epoch";
    std::string epochs;
    for (uint64_t e : probe_->epochs()) epochs += (epochs.empty() ? "" : ",") + std::to_string(e);
    const uint64_t stale = CounterOf(stat_a_->Stat(), "agent.master_link.stale_replies") +
                           CounterOf(stat_b_->Stat(), "agent.master_link.stale_replies");
    std::printf(
        "HA %s: clients served again %lld ms (a) / %lld ms (b) after the fault; acknowledged "
        "puts %zu, lost %zu%s; gets OK %d during the load and %zu after, 0 with wrong bytes: %s; "
        "serving epochs seen %s (%zu serving answers, %zu refusals, %zu unanswered); stale "
        "replies refused by agents %llu; router BlockRemoved %llu, AllBlocksCleared %llu\n",
        name.c_str(), static_cast<long long>(recovered_a.count()),
        static_cast<long long>(recovered_b.count()), acked.size(), lost,
        lost > 0 ? (" (the latest acknowledged " + std::to_string(latest_loss_ms) +
                    " ms after the fault)")
                       .c_str()
                 : "",
        load_a_->gets_ok() + load_b_->gets_ok(), read_ok, wrong == 0 ? "yes" : "NO", epochs.c_str(),
        probe_->serving_answers(), probe_->refusals(), probe_->unanswered(),
        static_cast<unsigned long long>(stale),
        static_cast<unsigned long long>(router_a_->removed_events()),
        static_cast<unsigned long long>(router_a_->clears()));
    std::fflush(stdout);
    return lost;
  }

  // The surviving puts acknowledged before `fault` that a client made after one of its puts that
  // was lost (keys PREFIX-N, put in order of N).
  static size_t LostOutsideTheWindow(const std::map<std::string, Load::Acked>& acked,
                                     const std::set<std::string>& listed, Clock::time_point fault) {
    std::map<std::string, std::map<uint64_t, bool>> by_client;  // prefix -> N -> survived
    for (const auto& [key, a] : acked) {
      const size_t dash = key.rfind('-');
      if (dash == std::string::npos) continue;
      const bool survived = listed.count(key) != 0;
      if (survived && a.at >= fault) continue;  // acknowledged by the new leader
      by_client[key.substr(0, dash)][std::stoull(key.substr(dash + 1))] = survived;
    }
    size_t out = 0;
    for (const auto& [prefix, puts] : by_client) {
      bool lost_before = false;
      for (const auto& [n, survived] : puts) {
        if (!survived) lost_before = true;
        if (survived && lost_before) ++out;
      }
    }
    return out;
  }

  // Runs `fault` under the load; returns when a leader of a newer epoch serves both clients
  // (false when none did in time). `*at`: when the fault began.
  bool FailOver(const std::function<void()>& fault, Clock::time_point* at) {
    const uint64_t old_epoch = LeaderOf(etcd_endpoint_, kCluster)->epoch;
    *at = Clock::now();
    fault();
    return WaitUntil(
               [&] {
                 auto l = LeaderOf(etcd_endpoint_, kCluster);
                 return l && l->epoch > old_epoch;
               },
               30s) &&
           ServingAgainAfter(*at);
  }

  HaMaster& master(const std::string& name) {
    for (auto& m : masters_) {
      if (m->name() == name) return *m;
    }
    return *masters_.front();
  }

  TempDir dir_;
  // Before the processes: destroyed after them (a namespace is deleted once nothing runs in it).
  std::unique_ptr<NetnsLink> netns_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::string etcd_endpoint_;
  std::vector<std::unique_ptr<HaMaster>> masters_;
  std::unique_ptr<NodeAgent> a_, b_;
  std::unique_ptr<Client> ca_, cb_, stat_a_, stat_b_;
  std::unique_ptr<ServingProbe> probe_;
  std::unique_ptr<Router> router_a_, router_b_;
  std::unique_ptr<EpochSampler> epochs_a_, epochs_b_;
  std::unique_ptr<Load> load_a_, load_b_;
};

}  // namespace kvagent::testing

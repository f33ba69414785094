// MasterServer as followers and HA see it, over its real ROUTER: every reply names the epoch; a
// master that may not serve changes nothing and says so but still hands out its records; a
// follower's fetch that finds nothing new is held until a record is made (long poll); with
// synchronous replication a reply waits until a follower holds its records, and is dropped,
// never sent, when the master may no longer serve.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "kvagent/master/master_server.h"
#include "zmq_test_client.h"

namespace kvagent::master::testing {
namespace {

using namespace std::chrono_literals;

struct Server {
  explicit Server(uint64_t epoch, int sync_followers = 0, int tick_ms = 50) {
    MasterServerOptions o;
    o.tick_ms = tick_ms;
    o.listen = "tcp://127.0.0.1:0";
    o.events = "tcp://127.0.0.1:0";
    o.events_replay = "";
    o.master.epoch = epoch;
    o.master.replication_log_bytes = 1 << 20;
    o.sync_followers = sync_followers;
    o.may_serve = [this] { return serving.load(); };
    auto s = MasterServer::Start(o, &clock);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) server = std::move(*s);
  }
  std::string endpoint() const { return server->endpoint(); }
  SteadyClock clock;
  std::atomic<bool> serving{true};
  std::unique_ptr<MasterServer> server;
};

// The replicate reply's last_seq (and whether it carried records), or nullopt.
struct Page {
  uint64_t last_seq = 0;
  bool snapshot = false;
  size_t record_bytes = 0;
};
std::optional<Page> PageOf(const fb::Reply* r) {
  if (r == nullptr || r->status() != 0) return std::nullopt;
  const fb::ReplicateReply* p = r->body_as_ReplicateReply();
  if (p == nullptr) return std::nullopt;
  return Page{p->last_seq(), p->snapshot(), p->records() ? p->records()->size() : 0};
}

// Requests from several clients, many in flight, each answered as it comes: none waits for the
// loop's next tick. The loop watches the ROUTER through the socket's fd, which signals commands
// rather than messages: it must drain the socket to EAGAIN at each wake-up and look again after
// a reply sent outside that drain (MasterServer::Run). With a tick of 3 s, a request left waiting
// would make its client's 1.5 s receive time out. (Stopping the server waits for the tick.)
TEST(MasterServerLoop, PipelinedRequestsFromSeveralClientsAreEachAnsweredWithoutWaitingForATick) {
  Server s(3, /*sync_followers=*/0, /*tick_ms=*/3000);
  constexpr int kClients = 4;
  constexpr int kInFlight = 16;
  constexpr int kPerClient = 3000;
  std::vector<std::thread> clients;
  std::atomic<int> answered{0};
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      MasterClient client(s.endpoint(), /*timeout_ms=*/1500);
      int sent = 0;
      for (; sent < kInFlight; ++sent) client.Send(StatsMsg());
      for (int got = 0; got < kPerClient; ++got) {
        if (!client.Receive()) return;  // timed out: counted short below
        answered.fetch_add(1);
        if (sent < kPerClient) {
          client.Send(StatsMsg());
          ++sent;
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(answered.load(), kClients * kPerClient);
}

TEST(MasterServerHa, EveryReplyNamesTheEpochAndAMasterThatMayNotServeChangesNothing) {
  Server s(777);
  MasterClient agent(s.endpoint());
  std::string storage;
  const fb::Reply* r = agent.Call(StatsMsg(), &storage);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->master_epoch(), 777u);
  EXPECT_FALSE(r->not_serving());

  s.serving = false;
  r = agent.Call(RegisterAgentMsg("node-1", 5), &storage);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->not_serving());
  EXPECT_EQ(r->status(), static_cast<uint16_t>(ErrorCode::kMasterUnavailable));
  EXPECT_EQ(r->master_epoch(), 777u);
  EXPECT_NE(r->message()->str().find("leadership"), std::string::npos) << r->message()->str();
  // A follower still gets what the master made while it served.
  MasterClient follower(s.endpoint());
  auto page = PageOf(follower.Call(ReplicateMsg(0, 0), &storage));
  ASSERT_TRUE(page.has_value());
  EXPECT_TRUE(page->snapshot);

  s.serving = true;
  r = agent.Call(StatsMsg(), &storage);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(StatValue(r, "agents"), 0u);  // the refused registration changed nothing
  EXPECT_EQ(StatValue(r, "epoch"), 777u);
}

TEST(MasterServerHa, AFollowersFetchWaitsForTheNextRecordInsteadOfComingBackEmpty) {
  Server s(41);
  MasterClient follower(s.endpoint());
  std::string storage;
  auto first = PageOf(follower.Call(ReplicateMsg(0, 0, 0, "f1"), &storage));
  ASSERT_TRUE(first.has_value());
  // Caught up: the next fetch is held (up to its wait) ...
  follower.Send(ReplicateMsg(first->last_seq, 41, 5000, "f1", 2));
  std::this_thread::sleep_for(200ms);
  MasterClient agent(s.endpoint());
  const fb::Reply* st = agent.Call(StatsMsg(), &storage);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(StatValue(st, "followers"), 1u);
  // ... and answered with the record a registration makes.
  ASSERT_NE(agent.Call(RegisterAgentMsg("node-1", 5), &storage), nullptr);
  auto body = follower.Receive();
  ASSERT_TRUE(body.has_value());
  auto page = PageOf(ParseReply(body->data(), body->size()));
  ASSERT_TRUE(page.has_value());
  EXPECT_FALSE(page->snapshot);
  EXPECT_GT(page->record_bytes, 0u);
  EXPECT_GT(page->last_seq, first->last_seq);
}

TEST(MasterServerHa, WithSyncReplicationAReplyWaitsUntilAFollowerHoldsItsRecord) {
  Server s(9, /*sync_followers=*/1);
  MasterClient agent(s.endpoint(), /*timeout_ms=*/300);
  std::string storage;
  // No follower: the registration is made but not acknowledged.
  agent.Send(RegisterAgentMsg("node-1", 5));
  EXPECT_FALSE(agent.Receive().has_value());
  // A follower fetches (a snapshot, which holds the registration) and then says it holds it.
  MasterClient follower(s.endpoint());
  auto snap = PageOf(follower.Call(ReplicateMsg(0, 0, 0, "f1"), &storage));
  ASSERT_TRUE(snap.has_value());
  EXPECT_FALSE(agent.Receive().has_value());  // fetched is not held: nothing acknowledged yet
  follower.Send(ReplicateMsg(snap->last_seq, 9, 1000, "f1", 2));
  auto reply = agent.Receive();
  ASSERT_TRUE(reply.has_value());
  const fb::Reply* r = ParseReply(reply->data(), reply->size());
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), 0);
  EXPECT_NE(r->body_as_RegisterAgentReply(), nullptr);
}

TEST(MasterServerHa, RepliesWaitingForAFollowerAreDroppedWhenTheMasterMayNoLongerServe) {
  Server s(9, /*sync_followers=*/1);
  MasterClient agent(s.endpoint(), /*timeout_ms=*/300);
  agent.Send(RegisterAgentMsg("node-1", 5));
  EXPECT_FALSE(agent.Receive().has_value());
  s.serving = false;  // its lease could not be confirmed: the outcome stays unknown
  std::string storage;
  MasterClient follower(s.endpoint());
  auto snap = PageOf(follower.Call(ReplicateMsg(0, 0, 0, "f1"), &storage));
  ASSERT_TRUE(snap.has_value());
  follower.Send(ReplicateMsg(snap->last_seq, 9, 1000, "f1", 2));
  EXPECT_FALSE(agent.Receive().has_value());  // acknowledged now, but never sent
  s.serving = true;
  MasterClient stats(s.endpoint());
  const fb::Reply* st = stats.Call(StatsMsg(), &storage);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(StatValue(st, "sync_dropped_replies"), 1u);
  EXPECT_EQ(StatValue(st, "sync_waiting_replies"), 0u);
}

}  // namespace
}  // namespace kvagent::master::testing

// kvmaster's framed RPC transport (--framed-listen; master/src/framed_rpc_server.h) through a
// real MasterServer: the same requests and replies as on the ROUTER, many in flight on one
// connection; a long poll held for a framed follower; and what a stream that is not the protocol
// gets: its connection closed and counted, the server going on serving everyone else.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "kvagent/common/framed_connection.h"
#include "kvagent/common/tcp_socket.h"
#include "kvagent/master/master_server.h"
#include "zmq_test_client.h"

namespace kvagent::master::testing {
namespace {

using namespace std::chrono_literals;

struct FramedServer {
  explicit FramedServer(uint64_t epoch = 5) {
    MasterServerOptions o;
    o.listen = "tcp://127.0.0.1:0";
    o.framed_listen = "tcp://127.0.0.1:0";
    o.events = "tcp://127.0.0.1:0";
    o.events_replay = "";
    o.master.epoch = epoch;
    o.master.replication_log_bytes = 1 << 20;
    auto s = MasterServer::Start(o, &clock);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) server = std::move(*s);
  }
  SteadyClock clock;
  std::unique_ptr<MasterServer> server;
};

FramedConnection Connect(const std::string& endpoint) {
  auto c = FramedConnection::Connect(endpoint, size_t{64} << 20);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(*c);
}

const fb::Reply* Call(FramedConnection& c, const Bytes& request, std::vector<uint8_t>* storage) {
  auto reply = c.Call(std::span(request.data(), request.size()), 5s);
  if (!reply.ok()) {
    ADD_FAILURE() << reply.status().ToString();
    return nullptr;
  }
  *storage = std::move(*reply);
  return ParseReply(storage->data(), storage->size());
}

// Sends `requests` at once and returns the replies in arrival order (5 s at most).
std::vector<std::vector<uint8_t>> Pipeline(FramedConnection& c,
                                           const std::vector<Bytes>& requests) {
  for (const Bytes& r : requests) c.Send(std::span(r.data(), r.size()));
  std::vector<std::vector<uint8_t>> replies;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (replies.size() < requests.size() && std::chrono::steady_clock::now() < deadline) {
    pollfd p{c.fd(), c.events(), 0};
    ::poll(&p, 1, 100);
    const Status st = c.OnReady(
        p.revents, [&](std::span<const uint8_t> r) { replies.emplace_back(r.begin(), r.end()); });
    if (!st.ok()) {
      ADD_FAILURE() << st.ToString();
      break;
    }
  }
  return replies;
}

TEST(FramedRpc, AnAgentRegistersMountsAndPutsAsOnTheRouter) {
  FramedServer s(77);
  ASSERT_NE(s.server, nullptr);
  ASSERT_FALSE(s.server->framed_endpoint().empty());
  FramedConnection c = Connect(s.server->framed_endpoint());
  std::vector<uint8_t> storage;
  const fb::Reply* r = Call(c, RegisterAgentMsg("node-1", 9), &storage);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->status(), 0) << (r->message() ? r->message()->str() : "");
  EXPECT_EQ(r->master_epoch(), 77u);
  EXPECT_TRUE(c.established());
  const uint32_t agent = r->body_as_RegisterAgentReply()->agent_id();
  r = Call(c, MountPoolMsg(agent, 64 << 20, "tcp://127.0.0.1:1"), &storage);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->status(), 0);
  r = Call(c, WriteStartMsg(agent, {"k1", "k2"}, {4096, 4096}), &storage);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->status(), 0);
  r = Call(c, WriteFinishMsg(fb::Body::BatchPutEnd, agent, {"k1", "k2"}), &storage);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->status(), 0);
  // The ROUTER's clients see the same state.
  MasterClient zmq_client(s.server->endpoint());
  std::string zstorage;
  const fb::Reply* z =
      zmq_client.Call(KeysMsg(fb::Body::BatchExist, {"k1", "k2", "k3"}), &zstorage);
  ASSERT_NE(z, nullptr);
  const fb::KeyCodesReply* codes = z->body_as_KeyCodesReply();
  ASSERT_NE(codes, nullptr);
  ASSERT_NE(codes->exists(), nullptr);
  EXPECT_EQ(codes->exists()->Get(0), 1);
  EXPECT_EQ(codes->exists()->Get(1), 1);
  EXPECT_EQ(codes->exists()->Get(2), 0);
}

TEST(FramedRpc, ManyRequestsInFlightOnOneConnectionAreEachAnsweredInOrder) {
  FramedServer s;
  FramedConnection c = Connect(s.server->framed_endpoint());
  std::vector<Bytes> requests;
  for (int i = 0; i < 2000; ++i) requests.push_back(StatsMsg());
  const auto replies = Pipeline(c, requests);
  ASSERT_EQ(replies.size(), requests.size());
  for (const auto& r : replies) {
    const fb::Reply* reply = ParseReply(r.data(), r.size());
    ASSERT_NE(reply, nullptr);
    EXPECT_EQ(reply->status(), 0);
  }
}

TEST(FramedRpc, AFramedFollowersLongPollIsAnsweredWhenARecordIsMade) {
  FramedServer s(41);
  FramedConnection follower = Connect(s.server->framed_endpoint());
  std::vector<uint8_t> storage;
  const fb::Reply* first = Call(follower, ReplicateMsg(0, 0, 0, "f1"), &storage);
  ASSERT_NE(first, nullptr);
  const uint64_t after = first->body_as_ReplicateReply()->last_seq();
  const Bytes poll_request = ReplicateMsg(after, 41, 5000, "f1", 2);
  follower.Send(std::span(poll_request.data(), poll_request.size()));
  std::this_thread::sleep_for(200ms);
  MasterClient agent(s.server->endpoint());
  std::string zstorage;
  ASSERT_NE(agent.Call(RegisterAgentMsg("node-1", 5), &zstorage), nullptr);
  std::vector<uint8_t> got;
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  while (got.empty() && std::chrono::steady_clock::now() < deadline) {
    pollfd p{follower.fd(), follower.events(), 0};
    ::poll(&p, 1, 100);
    ASSERT_TRUE(
        follower
            .OnReady(p.revents, [&](std::span<const uint8_t> r) { got.assign(r.begin(), r.end()); })
            .ok());
  }
  const fb::Reply* page = ParseReply(got.data(), got.size());
  ASSERT_NE(page, nullptr);
  EXPECT_GT(page->body_as_ReplicateReply()->last_seq(), after);
}

// A raw socket that sends `bytes`, then reads until the server closes (true) or 3 s pass.
bool ServerCloses(const std::string& endpoint, const std::string& bytes) {
  auto fd = ConnectTcp(endpoint);
  if (!fd.ok()) return false;
  pollfd w{fd->get(), POLLOUT, 0};
  ::poll(&w, 1, 1000);
  (void)!::send(fd->get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd->get(), POLLIN, 0};
    ::poll(&p, 1, 100);
    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    const ssize_t n = ::read(fd->get(), buf, sizeof(buf));
    if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
  }
  return false;
}

TEST(FramedRpc, AStreamThatIsNotTheProtocolIsClosedAndTheServerGoesOn) {
  FramedServer s;
  const std::string ep = s.server->framed_endpoint();
  // A ZMQ greeting, another version, a frame over the limit (64 MiB + 1), and garbage.
  std::string other_version(kFrameHello);
  other_version[4] = 9;
  std::string oversized(kFrameHello);
  const uint32_t n = (64u << 20) + 1;
  oversized.append(reinterpret_cast<const char*>(&n), 4);
  for (const std::string& bytes : {std::string("\xFF\0\0\0\0\0\0\0\x01\x7F", 10), other_version,
                                   oversized, std::string("GET / HTTP/1.1\r\n\r\n")}) {
    EXPECT_TRUE(ServerCloses(ep, bytes));
  }
  // A request frame that is not a master.fbs Request: answered with an error, not closed.
  FramedConnection c = Connect(ep);
  const Bytes junk = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  std::vector<uint8_t> storage;
  const fb::Reply* r = Call(c, junk, &storage);
  ASSERT_NE(r, nullptr);
  EXPECT_NE(r->status(), 0);
  // Everyone else is still served, and the refusals are counted.
  r = Call(c, StatsMsg(), &storage);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), 0);
  EXPECT_EQ(StatValue(r, "framed_bad_streams"), 4u);
  EXPECT_EQ(StatValue(r, "framed_connections"), 1u);
}

TEST(FramedRpc, NotServedWithAClusterSecret) {
  MasterServerOptions o;
  o.listen = "tcp://127.0.0.1:0";
  o.framed_listen = "tcp://127.0.0.1:0";
  o.events = "tcp://127.0.0.1:0";
  o.events_replay = "";
  o.secret = ClusterSecret::FromBytes(std::string(64, 's')).value();
  SteadyClock clock;
  auto s = MasterServer::Start(o, &clock);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kInvalidParams);
  EXPECT_NE(s.status().message().find("--framed-listen"), std::string::npos);
}

}  // namespace
}  // namespace kvagent::master::testing

// kvmaster's framed RPC transport (--framed-listen; master/src/framed_rpc_server.h) through a
// real MasterServer: the same requests and replies as on the ROUTER, many in flight on one
// connection; a long poll held for a framed follower; what a stream that is not the protocol
// gets: its connection closed and counted, the server going on serving everyone else; and, with a
// cluster secret, only members served, every frame sealed.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "framed_rpc_server.h"
#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/frame_cipher.h"
#include "kvagent/common/framed_connection.h"
#include "kvagent/common/tcp_socket.h"
#include "kvagent/master/master_server.h"
#include "zmq_test_client.h"

namespace kvagent::master::testing {
namespace {

using namespace std::chrono_literals;

struct FramedServer {
  explicit FramedServer(uint64_t epoch = 5, std::optional<ClusterSecret> secret = std::nullopt) {
    MasterServerOptions o;
    o.secret = std::move(secret);
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

FramedConnection Connect(const std::string& endpoint,
                         const std::optional<SymmetricKey>& key = std::nullopt) {
  auto c = FramedConnection::Connect(endpoint, size_t{64} << 20, key);
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

const char* kOurSecret = "the cluster's own secret: 32 bytes or more, really";
const char* kOtherSecret = "some other cluster's secret, also long enough!!";

ClusterSecret SecretOf(const char* content) { return *ClusterSecret::FromBytes(content); }

// Reads from a raw connection until `n` bytes are in `out` (false after 3 s or a close).
bool ReadExactly(int fd, size_t n, std::vector<uint8_t>* out) {
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  while (out->size() < n && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 100);
    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    uint8_t buf[4096];
    const ssize_t got = ::read(fd, buf, std::min(sizeof(buf), n - out->size()));
    if (got <= 0) return false;
    out->insert(out->end(), buf, buf + got);
  }
  return out->size() == n;
}

bool SendAll(int fd, const std::vector<uint8_t>& bytes) {
  pollfd w{fd, POLLOUT, 0};
  ::poll(&w, 1, 1000);
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

TEST(FramedRpc, WithAClusterSecretOnlyMembersAreServedAndEveryFrameIsSealed) {
  FramedServer s(5, SecretOf(kOurSecret));
  ASSERT_NE(s.server, nullptr);
  const std::string ep = s.server->framed_endpoint();
  const SymmetricKey ours = FramedRpcKey(SecretOf(kOurSecret));
  std::vector<uint8_t> storage;
  // A member is served.
  FramedConnection member = Connect(ep, ours);
  const fb::Reply* r = Call(member, RegisterAgentMsg("node-1", 9), &storage);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), 0);
  EXPECT_TRUE(member.established());
  // A plain client is told the port wants the secret; a client with another secret is told the
  // server does not hold its secret. Neither gets an answer.
  FramedConnection plain = Connect(ep);
  auto p = plain.Call(std::span(StatsMsg().data(), StatsMsg().size()), 3s);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("version 2, this end version 1"), std::string::npos)
      << p.status().message();
  FramedConnection outsider = Connect(ep, FramedRpcKey(SecretOf(kOtherSecret)));
  auto o = outsider.Call(std::span(StatsMsg().data(), StatsMsg().size()), 3s);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), ErrorCode::kMasterUnavailable);
  EXPECT_NE(o.status().message().find("does not hold this cluster secret"), std::string::npos)
      << o.status().message();

  // An outsider that ignores the failed confirmation and sends a request sealed under a key of
  // its own is closed and counted.
  {
    auto fd = ConnectTcp(ep);
    ASSERT_TRUE(fd.ok());
    FramedClientHandshake forger(FramedRpcKey(SecretOf(kOtherSecret)));
    ASSERT_TRUE(SendAll(fd->get(), forger.Hello()));
    std::vector<uint8_t> hello;
    ASSERT_TRUE(ReadExactly(fd->get(), kFrameHelloPrefixBytes + kSecureServerHelloRest, &hello));
    FrameSealer forged(FramedRpcKey(SecretOf(kOtherSecret)));
    std::vector<uint8_t> frame;
    const Bytes request = StatsMsg();
    forged.Append(&frame, std::span(request.data(), request.size()));
    ASSERT_TRUE(SendAll(fd->get(), frame));
    std::vector<uint8_t> rest;
    EXPECT_FALSE(ReadExactly(fd->get(), 1, &rest)) << "the server answered a forged request";
  }

  // A member's exchange on the wire: the reply's bytes are sealed (none of the counter names
  // the reply carries is readable), and they open under the session's key.
  auto fd = ConnectTcp(ep);
  ASSERT_TRUE(fd.ok());
  FramedClientHandshake handshake(ours);
  ASSERT_TRUE(SendAll(fd->get(), handshake.Hello()));
  std::vector<uint8_t> hello;
  ASSERT_TRUE(ReadExactly(fd->get(), kFrameHelloPrefixBytes + kSecureServerHelloRest, &hello));
  auto keys = handshake.Finish(std::span(hello).subspan(kFrameHelloPrefixBytes));
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  FrameSealer sealer(keys->send);
  std::vector<uint8_t> frame;
  const Bytes stats = StatsMsg();
  sealer.Append(&frame, std::span(stats.data(), stats.size()));
  ASSERT_TRUE(SendAll(fd->get(), frame));
  std::vector<uint8_t> header;
  ASSERT_TRUE(ReadExactly(fd->get(), kFrameHeaderBytes, &header));
  const size_t n = size_t{header[0]} | size_t{header[1]} << 8 | size_t{header[2]} << 16 |
                   size_t{header[3]} << 24;
  std::vector<uint8_t> sealed;
  ASSERT_TRUE(ReadExactly(fd->get(), n, &sealed));
  const std::string wire(sealed.begin(), sealed.end());
  EXPECT_EQ(wire.find("framed_unauthenticated"), std::string::npos);
  FrameOpener opener(keys->receive);
  auto opened = opener.Open(sealed);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const fb::Reply* reply = ParseReply(opened->data(), opened->size());
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(reply->status(), 0);
  EXPECT_EQ(StatValue(reply, "framed_unauthenticated"), 1u);  // the forger above
  EXPECT_GE(StatValue(reply, "framed_bad_streams"), 1u);      // the plain client
}

}  // namespace
// Before a client has shown it holds the secret, its first frame may be small only: an outsider
// announcing a large one is closed at its header, not buffered up to 64 MiB per connection.
TEST(FramedRpc, WithAClusterSecretAnUnprovenClientCannotSendALargeFrame) {
  FramedServer s(5, SecretOf(kOurSecret));
  ASSERT_NE(s.server, nullptr);
  const std::string ep = s.server->framed_endpoint();
  FramedClientHandshake outsider(FramedRpcKey(SecretOf(kOtherSecret)));
  const std::vector<uint8_t> hello = outsider.Hello();
  std::string bytes(hello.begin(), hello.end());
  const uint32_t n = 1u << 20;  // far below the 64 MiB a member may send
  bytes.append(reinterpret_cast<const char*>(&n), 4);
  bytes.append(1000, 'x');
  EXPECT_TRUE(ServerCloses(ep, bytes));
  // A member's large requests are served once its first one opened.
  const SymmetricKey ours = FramedRpcKey(SecretOf(kOurSecret));
  FramedConnection member = Connect(ep, ours);
  std::vector<uint8_t> storage;
  const fb::Reply* r = Call(member, RegisterAgentMsg("node-1", 9), &storage);
  ASSERT_NE(r, nullptr);
  std::vector<std::string> keys;
  for (int i = 0; i < 8192; ++i) keys.push_back("a-key-long-enough-" + std::to_string(i));
  const Bytes big = KeysMsg(fb::Body::BatchExist, keys);
  ASSERT_GT(big.size(), size_t{64} << 10);
  r = Call(member, big, &storage);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), 0);
  r = Call(member, StatsMsg(), &storage);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(StatValue(r, "framed_bad_streams"), 1u);
}

// A connection that does not prove itself in time gives its slot back: silent connections cannot
// hold the 4,096 slots from the agents.
TEST(FramedRpcServerAlone, AConnectionThatDoesNotSendItsHelloInTimeIsClosed) {
  FramedRpcServerOptions o;
  o.listen = "tcp://127.0.0.1:0";
  o.handshake_timeout_ms = 100;
  auto server = FramedRpcServer::Listen(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto silent = ConnectTcp((*server)->endpoint());
  auto talking = ConnectTcp((*server)->endpoint());
  ASSERT_TRUE(silent.ok() && talking.ok());
  const auto hello = FrameHelloPrefix(kFramedPlainVersion);
  ASSERT_EQ(::send(talking->get(), hello.data(), hello.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(hello.size()));
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  std::vector<pollfd> fds;
  while (std::chrono::steady_clock::now() < deadline &&
         (*server)->stats().handshake_timeouts == 0) {
    fds.clear();
    (*server)->AppendPollFds(&fds);
    ::poll(fds.data(), fds.size(), 20);
    (*server)->Serve(
        fds, [](FramedRpcServer::ConnectionId, std::span<const uint8_t>) {}, 16);
    (*server)->ExpireUnproven();
  }
  std::this_thread::sleep_for(150ms);  // past the talking one's deadline too
  (*server)->ExpireUnproven();
  const FramedRpcStats st = (*server)->stats();
  EXPECT_EQ(st.handshake_timeouts, 1u);
  EXPECT_EQ(st.connections, 1u) << "the connection that sent its hello stays";
  char buf[64];
  pollfd p{silent->get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 1000), 1);
  ssize_t got;
  while ((got = ::read(silent->get(), buf, sizeof(buf))) > 0) {
  }
  EXPECT_EQ(got, 0) << "the silent connection was closed";
}

}  // namespace kvagent::master::testing

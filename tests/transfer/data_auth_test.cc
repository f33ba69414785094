// Authentication on the TCP data plane: with a cluster secret, the data server answers only peers
// that prove they hold it (HMAC challenge-response on connect, both ways), and the client talks
// only to servers that prove it too. Without the proof nothing of the pool is read or written.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "kvagent/common/cluster_secret.h"
#include "tcp_server.h"
#include "tcp_wire.h"
#include "test_support.h"

namespace kvagent::transfer {
namespace {

using testing::ReadExactly;
using testing::WriteAll;

constexpr uint64_t kMiB = uint64_t{1} << 20;

SymmetricKey KeyOf(const std::string& secret) {
  return ClusterSecret::FromBytes(secret).value().MacKey(KeyPlane::kDataPlaneMac);
}
const std::string kSecret = "a cluster secret of at least 32 bytes, for the tests";
const std::string kOther = "another cluster's secret, also at least 32 bytes long";

struct Node {
  std::unique_ptr<NodePool> pool;
  std::unique_ptr<TransferEngine> engine;
};

Node MakeNode(std::optional<SymmetricKey> key) {
  Node node;
  node.pool = std::move(NodePool::Create({.size_bytes = 4 * kMiB, .huge_pages = false}).value());
  TransferEngineOptions options;
  options.listen_address = "127.0.0.1:0";
  options.transport = TransportMode::kTcp;
  options.peer_timeout = std::chrono::seconds(10);
  options.data_plane_key = key;
  node.engine = std::move(TransferEngine::Create(*node.pool, options).value());
  return node;
}

// Writes 4 KiB from `from`'s pool into `to`'s pool at offset 0; the op's result.
Status WriteAcross(Node& from, Node& to) {
  std::memset(from.pool->base(), 0x42, 4096);
  TransferOp op{.kind = TransferKind::kWrite,
                .peer = to.engine->endpoint(),
                .remote_offset = 0,
                .local = from.pool->base(),
                .length = 4096};
  return from.engine->TransferAndWait({op})[0];
}

TEST(DataPlaneAuth, MembersWithTheSameSecretMoveBytes) {
  Node a = MakeNode(KeyOf(kSecret)), b = MakeNode(KeyOf(kSecret));
  ASSERT_TRUE(WriteAcross(a, b).ok());
  EXPECT_EQ(b.pool->base()[4095], 0x42);
  EXPECT_EQ(b.engine->stats().served_unauthenticated, 0u);
}

TEST(DataPlaneAuth, EveryMismatchIsRefusedWithAClearMessageAndTouchesNothing) {
  struct Case {
    std::optional<SymmetricKey> client, server;
    const char* says;
  } cases[] = {
      {std::nullopt, KeyOf(kSecret), "requires authentication"},
      {KeyOf(kOther), KeyOf(kSecret), "cluster secret"},
      {KeyOf(kSecret), std::nullopt, "does not authenticate itself"},
  };
  for (const Case& c : cases) {
    Node client = MakeNode(c.client), server = MakeNode(c.server);
    std::memset(server.pool->base(), 0, 4096);
    const Status st = WriteAcross(client, server);
    EXPECT_EQ(st.code(), ErrorCode::kTransferFailed) << c.says;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
    EXPECT_EQ(server.pool->base()[0], 0) << "bytes landed without authentication";
    EXPECT_EQ(server.engine->stats().served_writes, 0u);
  }
}

uint16_t PortOf(const std::string& endpoint) {
  return static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
}

int Connect(const Node& node) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(PortOf(node.engine->endpoint()));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// True when the server closed the connection within a few seconds: EOF, or a reset when it
// closed with our bytes still unread (the kernel then answers with RST instead of FIN).
bool ClosedByPeer(int fd, int seconds) {
  char byte;
  timeval tv{seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const ssize_t n = recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

TEST(DataPlaneAuth, ARequestInsteadOfAProofClosesTheConnectionAndStoresNothing) {
  Node server = MakeNode(KeyOf(kSecret));
  std::memset(server.pool->base(), 0, 64);
  const int fd = Connect(server);
  uint8_t hello[wire::kHelloBytes];
  ASSERT_TRUE(ReadExactly(fd, hello, sizeof(hello)));
  wire::Hello h;
  ASSERT_TRUE(wire::DecodeHello(hello, &h).ok());
  EXPECT_EQ(h.flags & wire::kHelloAuthRequired, wire::kHelloAuthRequired);
  uint8_t request[wire::kRequestBytes];
  wire::EncodeRequest({.opcode = wire::Opcode::kWrite, .id = 1, .offset = 0, .length = 8}, request);
  ASSERT_TRUE(WriteAll(fd, request, sizeof(request)));
  (void)WriteAll(fd, "ABCDEFGH", 8);
  EXPECT_TRUE(ClosedByPeer(fd, 5));
  EXPECT_NE(std::memcmp(server.pool->base(), "ABCDEFGH", 8), 0);
  EXPECT_EQ(server.engine->stats().served_unauthenticated, 1u);
  close(fd);
}

TEST(DataPlaneAuth, APeerThatNeverAuthenticatesIsClosedAfterTheHandshakeTimeout) {
  Node server = MakeNode(KeyOf(kSecret));
  const int fd = Connect(server);
  uint8_t hello[wire::kHelloBytes];
  ASSERT_TRUE(ReadExactly(fd, hello, sizeof(hello)));
  EXPECT_TRUE(ClosedByPeer(fd, 15));  // the server's handshake timeout is 5 s
  EXPECT_EQ(server.engine->stats().served_unauthenticated, 1u);
  close(fd);
}

// Connections that have not authenticated counted against the connection cap like any other, and
// the cap turned new connections away: outsiders holding every slot (each for its 5 s, opened
// again at once) kept every member's new connection out. Now the oldest unauthenticated one
// makes room.
TEST(DataPlaneAuth, OutsidersHoldingEverySlotDoNotKeepAMemberOut) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = 128;  // MaxConnections(): a quarter of it, 32
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  {
    Node server = MakeNode(KeyOf(kSecret)), member = MakeNode(KeyOf(kSecret));
    const size_t cap = TcpDataServer::MaxConnections();
    ASSERT_EQ(cap, 32u);
    std::vector<int> outsiders;
    for (size_t i = 0; i < cap; ++i) {
      outsiders.push_back(Connect(server));
      uint8_t hello[wire::kHelloBytes];  // the server has taken it in: it said hello
      ASSERT_TRUE(ReadExactly(outsiders.back(), hello, sizeof(hello)));
    }
    const Status st = WriteAcross(member, server);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(server.pool->base()[4095], 0x42);
    EXPECT_EQ(server.engine->stats().served_shed_connections, 0u);
    EXPECT_EQ(server.engine->stats().served_unauthenticated, 1u) << "the oldest outsider goes";
    EXPECT_TRUE(ClosedByPeer(outsiders.front(), 5));
    for (int fd : outsiders) close(fd);
  }
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

}  // namespace
}  // namespace kvagent::transfer

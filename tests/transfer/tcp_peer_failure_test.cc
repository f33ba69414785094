// The data server against peers that misbehave (speaking the wire protocol by hand), and the
// client against peers that fail: closed ports, silent peers, peers that hang up mid-transfer.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/resource.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "tcp_wire.h"
#include "test_support.h"

namespace kvagent::transfer {
namespace {

using testing::MakeNode;
using testing::Node;
using testing::ReadExactly;
using testing::WriteAll;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A plain TCP socket on 127.0.0.1; listening (port picked by the OS) or connected.
struct RawSocket {
  int fd = -1;
  ~RawSocket() {
    if (fd >= 0) close(fd);
  }
  static RawSocket Listen() {
    RawSocket s;
    s.fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(s.fd, 8), 0);
    return s;
  }
  static RawSocket Connect(uint16_t port) {
    RawSocket s;
    s.fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    EXPECT_EQ(connect(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return s;
  }
  uint16_t port() const {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    return ntohs(addr.sin_port);
  }
  std::string endpoint() const { return "tcp://127.0.0.1:" + std::to_string(port()); }
};

uint16_t PortOf(const std::string& endpoint) {
  return static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
}

// Reads the hello a data server sends first and returns the pool size it announces.
uint64_t ReadHello(int fd) {
  uint8_t bytes[wire::kHelloBytes];
  EXPECT_TRUE(ReadExactly(fd, bytes, sizeof(bytes)));
  wire::Hello hello;
  EXPECT_TRUE(wire::DecodeHello(bytes, &hello).ok());
  return hello.pool_size;
}

// What a data server sends first.
void SendHello(int fd, uint64_t pool_size) {
  uint8_t hello[wire::kHelloBytes];
  wire::EncodeHello({.version = wire::kVersion, .pool_size = pool_size}, hello);
  WriteAll(fd, hello, sizeof(hello));
}

void SendRequest(int fd, wire::Opcode opcode, uint64_t id, uint64_t offset, uint64_t length) {
  uint8_t bytes[wire::kRequestBytes];
  wire::EncodeRequest({.opcode = opcode, .id = id, .offset = offset, .length = length}, bytes);
  ASSERT_TRUE(WriteAll(fd, bytes, sizeof(bytes)));
}

// A fake data server on `fake`: takes one connection, sends the hello, reads one request and
// lets `answer` reply to it on the connection's fd; then closes it.
template <typename Answer>
std::thread AnswerOneRequest(const RawSocket& fake, Answer answer) {
  return std::thread([&fake, answer] {
    const int fd = accept(fake.fd, nullptr, nullptr);
    SendHello(fd, 64 * kMiB);
    uint8_t bytes[wire::kRequestBytes];
    wire::Request request;
    if (ReadExactly(fd, bytes, sizeof(bytes)) && wire::DecodeRequest(bytes, &request).ok()) {
      answer(fd, request);
    }
    close(fd);
  });
}

// Reads one reply; its body (data or error text) goes to *body.
wire::Reply ReadReply(int fd, std::string* body) {
  uint8_t bytes[wire::kReplyBytes];
  wire::Reply reply;
  EXPECT_TRUE(ReadExactly(fd, bytes, sizeof(bytes)));
  EXPECT_TRUE(wire::DecodeReply(bytes, &reply).ok());
  body->assign(reply.length, '\0');
  EXPECT_TRUE(ReadExactly(fd, body->data(), body->size()));
  return reply;
}

TEST(DataServerTest, OutOfRangeRequestsGetAnErrorReplyAndTheConnectionKeepsServing) {
  Node server = MakeNode(4 * kMiB);
  RawSocket peer = RawSocket::Connect(PortOf(server.engine->endpoint()));
  const uint64_t pool = ReadHello(peer.fd);
  ASSERT_EQ(pool, server.pool->size());
  std::string body;

  SendRequest(peer.fd, wire::Opcode::kRead, 1, pool, 16);
  wire::Reply refused = ReadReply(peer.fd, &body);
  EXPECT_EQ(refused.id, 1u);
  EXPECT_EQ(refused.status, static_cast<uint16_t>(ErrorCode::kBufferOutOfRange));
  EXPECT_NE(body.find("outside the node pool"), std::string::npos) << body;

  // A refused WRITE's payload is consumed, so the stream stays in step.
  SendRequest(peer.fd, wire::Opcode::kWrite, 2, pool - 4, 8);
  ASSERT_TRUE(WriteAll(peer.fd, "ABCDEFGH", 8));
  refused = ReadReply(peer.fd, &body);
  EXPECT_EQ(refused.id, 2u);
  EXPECT_EQ(refused.status, static_cast<uint16_t>(ErrorCode::kBufferOutOfRange));
  EXPECT_NE(std::memcmp(server.pool->base() + pool - 4, "ABCD", 4), 0) << "nothing was stored";

  SendRequest(peer.fd, wire::Opcode::kWrite, 3, 100, 8);
  ASSERT_TRUE(WriteAll(peer.fd, "12345678", 8));
  wire::Reply stored = ReadReply(peer.fd, &body);
  EXPECT_EQ(stored.id, 3u);
  EXPECT_EQ(stored.status, 0u);
  EXPECT_EQ(std::memcmp(server.pool->base() + 100, "12345678", 8), 0);

  SendRequest(peer.fd, wire::Opcode::kRead, 4, 100, 8);
  wire::Reply read = ReadReply(peer.fd, &body);
  EXPECT_EQ(read.status, 0u);
  EXPECT_EQ(body, "12345678");
  EXPECT_EQ(server.engine->stats().served_rejected, 2u);
}

TEST(DataServerTest, GarbageBytesGetTheConnectionDroppedAndOthersAreStillServed) {
  testing::LogCapture log;
  Node server = MakeNode(4 * kMiB);
  Node client = MakeNode(4 * kMiB);
  RawSocket vandal = RawSocket::Connect(PortOf(server.engine->endpoint()));
  ReadHello(vandal.fd);
  std::vector<uint8_t> garbage = testing::Pattern(64, 99);
  ASSERT_TRUE(WriteAll(vandal.fd, garbage.data(), garbage.size()));
  // The server closes: recv sees end of stream (bounded wait inside ReadExactly).
  uint8_t byte;
  EXPECT_FALSE(ReadExactly(vandal.fd, &byte, 1));
  EXPECT_EQ(server.engine->stats().served_dropped_connections, 1u);
  EXPECT_EQ(log.Matching("not a data-plane request").size(), 1u);

  std::memcpy(client.pool->base(), "still serving", 13);
  auto results = client.engine->TransferAndWait(
      {{TransferKind::kWrite, server.engine->endpoint(), 0, client.pool->base(), 13}});
  EXPECT_TRUE(results[0].ok()) << results[0].ToString();
  EXPECT_EQ(std::memcmp(server.pool->base(), "still serving", 13), 0);
}

// Descriptors of this process that name /dev/null (above stdio), and the highest open one.
std::pair<int, int> DevNullAndHighestFd() {
  int dev_null = 0, highest = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    std::error_code error;
    if (fd > 2 && std::filesystem::read_symlink(entry.path(), error) == "/dev/null") ++dev_null;
    highest = std::max(highest, fd);
  }
  return {dev_null, highest};
}

// Out of descriptors, the server sheds a pending connection with a spare one it keeps; when the
// spare is gone too (another thread took it, or it could not be opened), nothing took the
// connection and the listener stayed readable: the data loop spun, shedding ~nothing at full
// CPU. It now stops listening for 100 ms at a time, and accepts again once descriptors free up.
// The server here starts under a descriptor limit that leaves no room for its spare.
TEST(DataServerTest, OutOfDescriptorsWithoutItsSpareTheServerDoesNotSpin) {
  auto pool = NodePool::Create({.size_bytes = 1 * kMiB, .huge_pages = false});
  ASSERT_TRUE(pool.ok());
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(client, 0);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int dev_null_before = DevNullAndHighestFd().first;
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(DevNullAndHighestFd().second + 64);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::unique_ptr<TransferEngine> engine;
  std::vector<int> filler;  // every descriptor left under the limit
  for (size_t room = 1; room <= 16 && !engine; ++room) {
    for (int fd : filler) close(fd);
    filler.clear();
    for (int fd; (fd = eventfd(0, EFD_CLOEXEC)) >= 0;) filler.push_back(fd);
    ASSERT_GE(filler.size(), room);
    for (size_t i = 0; i < room; ++i) {
      close(filler.back());
      filler.pop_back();
    }
    TransferEngineOptions options;
    options.listen_address = "127.0.0.1:0";
    options.transport = TransportMode::kTcp;
    auto created = TransferEngine::Create(**pool, options);
    if (!created.ok()) continue;  // too little room for what it needs
    // It started with `room` descriptors: everything it needs but its spare, or with it. (The
    // scan opens /proc/self/fd: one filler steps aside for it.)
    ASSERT_FALSE(filler.empty());
    close(filler.back());
    const int dev_null_now = DevNullAndHighestFd().first;
    filler.back() = eventfd(0, EFD_CLOEXEC);
    if (dev_null_now != dev_null_before) break;
    engine = std::move(*created);
  }
  ASSERT_TRUE(engine) << "no descriptor limit started the server without its spare";
  for (int fd; (fd = eventfd(0, EFD_CLOEXEC)) >= 0;) filler.push_back(fd);  // none, or what is left
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const std::string endpoint = engine->endpoint();
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1))));
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const uint64_t sheds = engine->stats().served_shed_connections;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  for (int fd : filler) close(fd);
  // About one attempt per pause (5 in 500 ms); the spinning loop made tens of thousands.
  EXPECT_GE(sheds, 1u);
  EXPECT_LE(sheds, 20u);
  uint8_t hello[wire::kHelloBytes];  // listening again: the pending connection is served
  EXPECT_TRUE(ReadExactly(client, hello, sizeof(hello)));
  close(client);
}

TEST(DataServerTest, PeerVanishingMidWriteLeavesTheServerServing) {
  Node server = MakeNode(4 * kMiB);
  {
    RawSocket quitter = RawSocket::Connect(PortOf(server.engine->endpoint()));
    ReadHello(quitter.fd);
    SendRequest(quitter.fd, wire::Opcode::kWrite, 1, 0, kMiB);
    ASSERT_TRUE(WriteAll(quitter.fd, "partial", 7));
  }  // closed with 7 of 1 MiB sent
  RawSocket next = RawSocket::Connect(PortOf(server.engine->endpoint()));
  ReadHello(next.fd);
  SendRequest(next.fd, wire::Opcode::kRead, 9, 0, 7);
  std::string body;
  wire::Reply reply = ReadReply(next.fd, &body);
  EXPECT_EQ(reply.status, 0u);
  EXPECT_EQ(reply.id, 9u);
}

TEST(DataClientTest, PeerThatClosesMidWriteFailsTheOpWithTransferFailed) {
  Node client = MakeNode(32 * kMiB);
  RawSocket fake = RawSocket::Listen();
  std::thread peer([&] {
    int fd = accept(fake.fd, nullptr, nullptr);
    SendHello(fd, 64 * kMiB);
    std::vector<uint8_t> some(kMiB);
    ReadExactly(fd, some.data(), some.size());  // the request header and part of the payload
    close(fd);
  });
  auto results = client.engine->TransferAndWait(
      {{TransferKind::kWrite, fake.endpoint(), 0, client.pool->base(), 16 * kMiB}});
  peer.join();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].code(), ErrorCode::kTransferFailed) << results[0].ToString();
  EXPECT_NE(results[0].message().find(fake.endpoint()), std::string::npos);
  EXPECT_NE(results[0].message().find("WRITE of 16777216 bytes"), std::string::npos)
      << results[0].message();
}

TEST(DataClientTest, PeerThatClosesMidReadReplyFailsTheOpWithTransferFailed) {
  Node client = MakeNode(4 * kMiB);
  RawSocket fake = RawSocket::Listen();
  std::thread peer = AnswerOneRequest(fake, [](int fd, const wire::Request& request) {
    uint8_t reply[wire::kReplyBytes];
    wire::EncodeReply({.status = 0, .id = request.id, .length = request.length}, reply);
    WriteAll(fd, reply, sizeof(reply));
    WriteAll(fd, "half", 4);  // of 1 MiB
  });
  auto results = client.engine->TransferAndWait(
      {{TransferKind::kRead, fake.endpoint(), 0, client.pool->base(), kMiB}});
  peer.join();
  EXPECT_EQ(results[0].code(), ErrorCode::kTransferFailed) << results[0].ToString();
  EXPECT_NE(results[0].message().find("closed the connection"), std::string::npos)
      << results[0].message();
}

// A reply header with bits where the protocol has zeros is not a reply of this protocol: the
// stream cannot be trusted, so the op fails rather than take the bytes that follow as data.
TEST(DataClientTest, AReplyWithNonZeroReservedBytesFailsTheOp) {
  Node client = MakeNode(4 * kMiB);
  RawSocket fake = RawSocket::Listen();
  std::thread peer = AnswerOneRequest(fake, [](int fd, const wire::Request& request) {
    uint8_t reply[wire::kReplyBytes];
    wire::EncodeReply({.status = 0, .id = request.id, .length = request.length}, reply);
    reply[6] = 0x01;
    WriteAll(fd, reply, sizeof(reply));
    const std::string data(request.length, 'x');
    WriteAll(fd, data.data(), data.size());
    const timeval limit{5, 0};  // bounded, also when the client keeps the connection
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    char byte;
    (void)!read(fd, &byte, 1);  // until the client closes
  });
  auto results = client.engine->TransferAndWait(
      {{TransferKind::kRead, fake.endpoint(), 0, client.pool->base(), 16}});
  peer.join();
  EXPECT_EQ(results[0].code(), ErrorCode::kTransferFailed) << results[0].ToString();
  EXPECT_NE(results[0].message().find("reserved"), std::string::npos) << results[0].message();
}

TEST(DataClientTest, ClosedPortFailsWithTransferFailedNamingThePeer) {
  Node client = MakeNode(1 * kMiB);
  std::string dead;
  {
    RawSocket gone = RawSocket::Listen();
    dead = gone.endpoint();
  }  // closed: nothing listens there now
  auto results =
      client.engine->TransferAndWait({{TransferKind::kWrite, dead, 0, client.pool->base(), 10},
                                      {TransferKind::kRead, dead, 0, client.pool->base(), 10}});
  for (const Status& status : results) {
    EXPECT_EQ(status.code(), ErrorCode::kTransferFailed) << status.ToString();
    EXPECT_NE(status.message().find(dead), std::string::npos);
    EXPECT_NE(status.message().find("refused"), std::string::npos) << status.message();
  }
}

TEST(DataClientTest, SilentPeerTimesOutAfterThePeerTimeout) {
  Node client = MakeNode(1 * kMiB, std::chrono::milliseconds(200));
  RawSocket silent = RawSocket::Listen();  // the kernel completes the handshake; no hello comes
  auto results = client.engine->TransferAndWait(
      {{TransferKind::kWrite, silent.endpoint(), 0, client.pool->base(), 10}});
  EXPECT_EQ(results[0].code(), ErrorCode::kTimeout) << results[0].ToString();
  EXPECT_NE(results[0].message().find("200 ms"), std::string::npos) << results[0].message();
  EXPECT_NE(results[0].message().find("hello"), std::string::npos) << results[0].message();
  EXPECT_EQ(client.engine->stats().ops_timed_out, 1u);
}

// Every byte received restarted the peer timeout, during the handshake too: a peer sending its
// hello a byte at a time, each just inside the timeout, held the op (and its batch) about 40
// timeouts before it had proved anything (80 under a secret). The handshake now has one timeout.
TEST(DataClientTest, APeerTricklingItsHelloTimesOutWithinOneTimeout) {
  Node client = MakeNode(1 * kMiB, std::chrono::milliseconds(300));
  RawSocket fake = RawSocket::Listen();
  std::atomic<size_t> sent{0};
  std::atomic<bool> stop{false};
  int accepted = -1;
  std::thread peer([&] {
    accepted = accept(fake.fd, nullptr, nullptr);
    uint8_t hello[wire::kHelloBytes];
    wire::EncodeHello({.version = wire::kVersion, .pool_size = kMiB}, hello);
    for (size_t i = 0; i < sizeof(hello) && !stop; ++i) {  // a byte every 200 ms
      WriteAll(accepted, hello + i, 1);
      sent = i + 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  auto results = client.engine->TransferAndWait(
      {{TransferKind::kRead, fake.endpoint(), 0, client.pool->base(), 4096}});
  const size_t sent_by_then = sent;
  stop = true;
  peer.join();
  close(accepted);
  EXPECT_EQ(results[0].code(), ErrorCode::kTimeout) << results[0].ToString();
  EXPECT_LT(sent_by_then, wire::kHelloBytes) << "the op waited for the whole trickled hello";
}

TEST(DataClientTest, PeerThatStopsReplyingTimesOutAndTheOpIsNotLeftHanging) {
  Node client = MakeNode(1 * kMiB, std::chrono::milliseconds(200));
  RawSocket fake = RawSocket::Listen();
  int accepted = -1;
  std::thread peer([&] {
    accepted = accept(fake.fd, nullptr, nullptr);
    SendHello(accepted, kMiB);  // then reads nothing and answers nothing
  });
  auto results = client.engine->TransferAndWait(
      {{TransferKind::kRead, fake.endpoint(), 0, client.pool->base(), 4096}});
  peer.join();
  EXPECT_EQ(results[0].code(), ErrorCode::kTimeout) << results[0].ToString();
  EXPECT_NE(results[0].message().find("waiting for replies"), std::string::npos)
      << results[0].message();
  close(accepted);
}

TEST(DataClientTest, NonKvagentPeerIsRejectedOnItsHello) {
  Node client = MakeNode(1 * kMiB);
  RawSocket fake = RawSocket::Listen();
  std::thread peer([&] {
    int fd = accept(fake.fd, nullptr, nullptr);
    const char response[] =
        "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";  // longer than a hello
    WriteAll(fd, response, sizeof(response) - 1);
    uint8_t sink[64];
    testing::WaitReadable(fd);
    (void)!recv(fd, sink, sizeof(sink), 0);
    close(fd);
  });
  auto results = client.engine->TransferAndWait(
      {{TransferKind::kWrite, fake.endpoint(), 0, client.pool->base(), 10}});
  peer.join();
  EXPECT_EQ(results[0].code(), ErrorCode::kTransferFailed);
  EXPECT_NE(results[0].message().find("bad magic"), std::string::npos) << results[0].message();
}

}  // namespace
}  // namespace kvagent::transfer

// The pool fence: which ops a pool refuses (another pool incarnation, another master epoch, an
// abandoned write), enforced by the data server, the client's hello check, a WRITE whose
// payload is arriving while the fence changes, and local copies. Also what the server refuses
// because it arrived damaged: a WRITE whose payload fails its CRC, a header that fails its own.
#include "kvagent/transfer/pool_fence.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <thread>
#include <vector>

#include "kvagent/common/checksum.h"
#include "tcp_proxy.h"
#include "tcp_wire.h"
#include "test_support.h"

namespace kvagent::transfer {
namespace {

using testing::MakeNode;
using testing::Node;
using testing::ReadExactly;
using testing::WriteAll;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kPool = 0x1111;   // pool incarnation of the node under test
constexpr uint64_t kEpoch = 0x2222;  // the master it is registered with

TEST(PoolFence, RefusesOtherPoolsOtherMastersAndAbandonedWrites) {
  PoolFence fence(kPool);
  fence.SetEpoch(kEpoch);
  EXPECT_TRUE(fence.CheckRead(kPool, kEpoch).ok());
  EXPECT_TRUE(fence.CheckWrite(kPool, kEpoch, 5).ok());
  EXPECT_FALSE(fence.CheckRead(kPool + 1, kEpoch).ok());  // placed in an earlier pool
  EXPECT_FALSE(fence.CheckRead(kPool, kEpoch + 1).ok());  // placed by another master
  EXPECT_FALSE(fence.CheckWrite(kPool, kEpoch + 1, 5).ok());
  ASSERT_TRUE(fence.Apply(kEpoch, /*watermark=*/10, std::vector<uint64_t>{12, 15}));
  EXPECT_FALSE(fence.CheckWrite(kPool, kEpoch, 9).ok());  // below the watermark: ended
  EXPECT_TRUE(fence.CheckWrite(kPool, kEpoch, 10).ok());
  EXPECT_FALSE(fence.CheckWrite(kPool, kEpoch, 12).ok());  // fenced
  EXPECT_TRUE(fence.CheckWrite(kPool, kEpoch, 13).ok());
  EXPECT_TRUE(fence.CheckRead(kPool, kEpoch).ok());  // reads do not care about writes
  EXPECT_FALSE(fence.Apply(kEpoch + 1, 100, {}));    // another master's fences are ignored
  EXPECT_TRUE(fence.CheckWrite(kPool, kEpoch, 13).ok());
  // A new master: the old one's ops are refused, its fences forgotten.
  fence.SetEpoch(kEpoch + 1);
  EXPECT_FALSE(fence.CheckWrite(kPool, kEpoch, 13).ok());
  EXPECT_TRUE(fence.CheckWrite(kPool, kEpoch + 1, 12).ok());
  EXPECT_EQ(fence.refused(), 6u);
}

// Epoch 0 means "not checked" for a pool no master knows; once one does, an op without an epoch
// passed every fence: a write of an abandoned put (id 3, below the watermark) was stored.
TEST(PoolFence, AnOpWithoutAnEpochIsRefusedOnceThePoolHasOne) {
  PoolFence fence(kPool);
  EXPECT_TRUE(fence.CheckWrite(kPool, 0, 3).ok());  // no master yet: tools, tests
  fence.SetEpoch(5);
  ASSERT_TRUE(fence.Apply(5, /*watermark=*/10, {}));
  EXPECT_FALSE(fence.CheckWrite(kPool, 0, 3).ok());
  EXPECT_FALSE(fence.CheckWrite(0, 0, 11).ok());
  EXPECT_FALSE(fence.CheckRead(kPool, 0).ok());
  EXPECT_FALSE(fence.CheckWrite(kPool, 5, 3).ok());  // what the epoch-0 write bypassed
  EXPECT_TRUE(fence.CheckWrite(kPool, 5, 11).ok());
}

TEST(PoolFence, ApplyWaitsForTheLocalCopyInProgressNotForTheWholeBatch) {
  PoolFence fence(kPool);
  fence.SetEpoch(kEpoch);
  auto writes = fence.BeginLocalWrites();
  ASSERT_TRUE(writes.Admit(kEpoch, 7).ok());
  std::atomic<bool> applied{false};
  std::thread t([&] {
    fence.Apply(kEpoch, 0, std::vector<uint64_t>{7, 9});
    applied = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(applied.load());  // the copy of write 7 is still in progress
  // The batch's next copy lets the waiting fence in first and is judged by it: write 9 was
  // fenced meanwhile. (Until the Apply is waiting, a copy is admitted under the old fences.)
  Status next = Status::Ok();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (next.ok() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    next = writes.Admit(kEpoch, 9);
  }
  EXPECT_EQ(next.code(), ErrorCode::kTransferFailed) << next.message();
  if (next.ok()) writes = PoolFence::LocalWrites();  // the fence never got in: end the batch
  t.join();
  EXPECT_TRUE(applied.load());
  // The batch goes on under the new fences, holding the fence again.
  EXPECT_TRUE(writes.Admit(kEpoch, 8).ok());
  EXPECT_FALSE(writes.Admit(kEpoch, 7).ok());
  std::atomic<bool> epoch_set{false};
  std::thread t2([&] {
    fence.SetEpoch(kEpoch + 1);  // a new master: waits for the copy in progress too
    epoch_set = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(epoch_set.load());
  writes = PoolFence::LocalWrites();  // the batch ends
  t2.join();
  EXPECT_TRUE(epoch_set.load());
  auto later = fence.BeginLocalWrites();
  EXPECT_FALSE(later.Admit(kEpoch, 8).ok());  // the old master's write
  EXPECT_TRUE(later.Admit(kEpoch + 1, 8).ok());
}

TEST(PoolFence, LocalWritesHoldTheFenceOnlyFromTheirFirstCopy) {
  PoolFence fence(kPool);
  fence.SetEpoch(kEpoch);
  auto writes = fence.BeginLocalWrites();            // a batch with no local replica yet
  fence.Apply(kEpoch, 0, std::vector<uint64_t>{7});  // would wait forever if it were held
  EXPECT_FALSE(writes.Admit(kEpoch, 7).ok());
  PoolFence::LocalWrites unfenced;  // an agent without a fence admits every copy
  EXPECT_TRUE(unfenced.Admit(kEpoch + 5, 7).ok());
}

uint16_t PortOf(const std::string& endpoint) {
  return static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
}

int ConnectTo(const std::string& endpoint) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(PortOf(endpoint));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

wire::Reply ReadReply(int fd, std::string* body) {
  uint8_t bytes[wire::kReplyBytes];
  wire::Reply reply;
  EXPECT_TRUE(ReadExactly(fd, bytes, sizeof(bytes)));
  EXPECT_TRUE(wire::DecodeReply(bytes, &reply).ok());
  body->assign(reply.length, '\0');
  EXPECT_TRUE(ReadExactly(fd, body->data(), body->size()));
  return reply;
}

// A WRITE header (with `crc` as its payload CRC when given); `flip`: a header byte to damage
// after encoding, as a bad link would.
void SendWrite(int fd, uint64_t id, uint64_t offset, uint64_t length, uint64_t pool, uint64_t epoch,
               uint64_t write_id, std::optional<uint32_t> crc = std::nullopt,
               std::optional<size_t> flip = std::nullopt) {
  uint8_t bytes[wire::kRequestBytes];
  wire::EncodeRequest({.opcode = wire::Opcode::kWrite,
                       .id = id,
                       .offset = offset,
                       .length = length,
                       .pool_incarnation = pool,
                       .master_epoch = epoch,
                       .write_id = write_id,
                       .has_payload_crc = crc.has_value(),
                       .payload_crc = crc.value_or(0)},
                      bytes);
  if (flip) bytes[*flip] ^= 0x04;
  ASSERT_TRUE(WriteAll(fd, bytes, sizeof(bytes)));
}

TEST(FencedDataServer, AnnouncesItsPoolAndRefusesWritesTheFenceRefuses) {
  PoolFence fence(kPool);
  fence.SetEpoch(kEpoch);
  Node node = MakeNode(4 * kMiB, std::chrono::seconds(10), "127.0.0.1:0", &fence);
  const int fd = ConnectTo(node.engine->endpoint());
  uint8_t hello_bytes[wire::kHelloBytes];
  ASSERT_TRUE(ReadExactly(fd, hello_bytes, sizeof(hello_bytes)));
  wire::Hello hello;
  ASSERT_TRUE(wire::DecodeHello(hello_bytes, &hello).ok());
  EXPECT_EQ(hello.pool_incarnation, kPool);
  ASSERT_TRUE(fence.Apply(kEpoch, 1, std::vector<uint64_t>{40}));
  std::string body;
  struct Case {
    uint64_t pool, epoch, write_id;
    bool stored;
  } cases[] = {{kPool, kEpoch, 41, true},
               {kPool + 1, kEpoch, 41, false},
               {kPool, kEpoch + 1, 41, false},
               {kPool, kEpoch, 40, false}};
  uint64_t id = 1;
  for (const Case& c : cases) {
    std::memset(node.pool->base(), 0, 64);
    SendWrite(fd, id, 0, 8, c.pool, c.epoch, c.write_id);
    ASSERT_TRUE(WriteAll(fd, "ABCDEFGH", 8));
    wire::Reply r = ReadReply(fd, &body);
    EXPECT_EQ(r.id, id++);
    EXPECT_EQ(r.status == 0, c.stored) << body;
    EXPECT_EQ(std::memcmp(node.pool->base(), "ABCDEFGH", 8) == 0, c.stored);
  }
  EXPECT_EQ(node.engine->stats().served_fenced, 3u);
  close(fd);
}

TEST(FencedDataServer, AWriteFencedWhileItsPayloadArrivesStoresNothingMore) {
  PoolFence fence(kPool);
  fence.SetEpoch(kEpoch);
  Node node = MakeNode(4 * kMiB, std::chrono::seconds(10), "127.0.0.1:0", &fence);
  std::memset(node.pool->base(), 0, kMiB);
  const int fd = ConnectTo(node.engine->endpoint());
  uint8_t hello[wire::kHelloBytes];
  ASSERT_TRUE(ReadExactly(fd, hello, sizeof(hello)));
  const std::vector<uint8_t> payload(kMiB, 0x5A);
  SendWrite(fd, 1, 0, kMiB, kPool, kEpoch, 9);
  ASSERT_TRUE(WriteAll(fd, payload.data(), kMiB / 2));
  // Wait until the first half is in the pool (the write was accepted and is arriving).
  for (int i = 0; i < 500 && node.pool->base()[kMiB / 2 - 1] != 0x5A; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(node.pool->base()[kMiB / 2 - 1], 0x5A);
  // The master fenced write 9 (a revoke): apply, cut the payload off, then the rest arrives.
  ASSERT_TRUE(fence.Apply(kEpoch, 0, std::vector<uint64_t>{9}));
  std::promise<void> refenced;
  node.engine->Refence([&] { refenced.set_value(); });
  refenced.get_future().wait();
  ASSERT_TRUE(WriteAll(fd, payload.data() + kMiB / 2, kMiB / 2));
  std::string body;
  wire::Reply r = ReadReply(fd, &body);
  EXPECT_NE(r.status, 0u);
  EXPECT_NE(body.find("abandoned"), std::string::npos) << body;
  for (uint64_t i = kMiB / 2; i < kMiB; i += 4096) {
    ASSERT_EQ(node.pool->base()[i], 0) << "byte " << i << " of a fenced write landed";
  }
  close(fd);
}

TEST(FencedDataServer, AClientFailsAnOpForARestartedPeerWithoutSendingIt) {
  PoolFence fence(kPool);
  fence.SetEpoch(kEpoch);
  Node server = MakeNode(4 * kMiB, std::chrono::seconds(10), "127.0.0.1:0", &fence);
  Node client = MakeNode(4 * kMiB);
  std::vector<uint8_t> src(4096, 0x77);
  ASSERT_TRUE(client.engine->RegisterMemory(src.data(), src.size()).ok());
  TransferOp op{.kind = TransferKind::kWrite,
                .peer = server.engine->endpoint(),
                .remote_offset = 0,
                .local = src.data(),
                .length = src.size(),
                .pool_incarnation = kPool - 1,  // the placement was made in the peer's last life
                .master_epoch = kEpoch,
                .write_id = 3};
  std::vector<Status> r = client.engine->TransferAndWait({op});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].code(), ErrorCode::kTransferFailed);
  EXPECT_NE(r[0].message().find("restarted"), std::string::npos) << r[0].message();
  EXPECT_EQ(server.engine->stats().served_writes + server.engine->stats().served_rejected, 0u);
  op.pool_incarnation = kPool;
  r = client.engine->TransferAndWait({op});
  EXPECT_TRUE(r[0].ok()) << r[0].ToString();
  EXPECT_EQ(server.pool->base()[100], 0x77);
}

// Bytes damaged on the way to the pool: a payload that does not match the CRC the writer sent
// fails the write with DATA_CORRUPTED (the stream stays in step: the next write is stored); a
// header with a damaged byte (here its offset: the write would land on another value) fails its
// CRC and closes the connection before a byte of its payload is stored.
TEST(FencedDataServer, AWriteDamagedOnTheWayIsRefusedAndADamagedHeaderClosesTheConnection) {
  PoolFence fence(kPool);
  fence.SetEpoch(kEpoch);
  Node node = MakeNode(4 * kMiB, std::chrono::seconds(10), "127.0.0.1:0", &fence);
  std::memset(node.pool->base(), 0, 3 * 4096);
  std::vector<uint8_t> payload(4096, 0x6B);
  const uint32_t crc = Crc32c(payload.data(), payload.size());
  const int fd = ConnectTo(node.engine->endpoint());
  uint8_t hello[wire::kHelloBytes];
  ASSERT_TRUE(ReadExactly(fd, hello, sizeof(hello)));
  std::vector<uint8_t> damaged = payload;
  damaged[1234] ^= 0x10;
  SendWrite(fd, 1, 0, damaged.size(), kPool, kEpoch, 5, crc);
  ASSERT_TRUE(WriteAll(fd, damaged.data(), damaged.size()));
  std::string body;
  wire::Reply r = ReadReply(fd, &body);
  EXPECT_EQ(ErrorCodeFromWire(r.status), ErrorCode::kDataCorrupted) << body;
  EXPECT_NE(body.find("damaged on the way"), std::string::npos) << body;
  EXPECT_EQ(node.engine->stats().served_corrupted, 1u);
  SendWrite(fd, 2, 4096, payload.size(), kPool, kEpoch, 6, crc);
  ASSERT_TRUE(WriteAll(fd, payload.data(), payload.size()));
  r = ReadReply(fd, &body);
  EXPECT_EQ(r.status, 0u) << body;
  EXPECT_EQ(node.pool->base()[4096 + 1234], 0x6B);
  // The offset's low byte damaged: 8192 would become 8196.
  SendWrite(fd, 3, 8192, payload.size(), kPool, kEpoch, 7, crc, /*flip=*/16);
  ASSERT_TRUE(WriteAll(fd, payload.data(), payload.size()));
  char byte = 0;
  EXPECT_LE(recv(fd, &byte, 1, 0), 0);  // closed
  for (uint64_t i = 8192; i < 3 * 4096; ++i) ASSERT_EQ(node.pool->base()[i], 0) << i;
  EXPECT_EQ(node.engine->stats().served_dropped_connections, 1u);
  EXPECT_EQ(node.engine->stats().served_writes, 1u);
  close(fd);
}

TEST(DataWire, ARequestRoundTripsAndADamagedOrMalformedOneIsRefused) {
  const wire::Request write{.opcode = wire::Opcode::kWrite,
                            .id = 7,
                            .offset = 8192,
                            .length = 4096,
                            .pool_incarnation = kPool,
                            .master_epoch = kEpoch,
                            .write_id = 9,
                            .has_payload_crc = true,
                            .payload_crc = 0xCAFEF00D};
  uint8_t bytes[wire::kRequestBytes];
  wire::EncodeRequest(write, bytes);
  wire::Request got;
  ASSERT_TRUE(wire::DecodeRequest(bytes, &got).ok());
  EXPECT_TRUE(got.has_payload_crc);
  EXPECT_EQ(got.payload_crc, 0xCAFEF00Du);
  EXPECT_EQ(got.offset, 8192u);
  for (size_t i = 0; i < wire::kRequestBytes; ++i) {  // any one damaged byte is caught
    uint8_t damaged[wire::kRequestBytes];
    std::memcpy(damaged, bytes, sizeof(damaged));
    damaged[i] ^= 0x01;
    EXPECT_FALSE(wire::DecodeRequest(damaged, &got).ok()) << "byte " << i;
  }
  // A READ cannot carry a payload CRC (even with a header CRC that matches).
  wire::Request read = write;
  read.opcode = wire::Opcode::kRead;
  wire::EncodeRequest(read, bytes);
  Status refused = wire::DecodeRequest(bytes, &got);
  EXPECT_NE(refused.message().find("READ"), std::string::npos) << refused.ToString();
}

// The client's pooled connection outlived its peer's restart (a partition kept the FIN away):
// an op placed in the peer's new pool is sent on a new connection, whose hello names that
// pool, instead of being failed on the connection to the peer's last life.
TEST(FencedDataServer, AnIdleConnectionToAPeersLastLifeIsReplacedForAnOpOfItsNewPool) {
  PoolFence old_fence(kPool - 1), new_fence(kPool);
  old_fence.SetEpoch(kEpoch);
  new_fence.SetEpoch(kEpoch);
  Node old_life = MakeNode(4 * kMiB, std::chrono::seconds(10), "127.0.0.1:0", &old_fence);
  Node new_life = MakeNode(4 * kMiB, std::chrono::seconds(10), "127.0.0.1:0", &new_fence);
  // The first connection reaches the old life, every later one the new.
  kvagent::testing::TcpProxy peer(
      "127.0.0.1", 0, {PortOf(old_life.engine->endpoint()), PortOf(new_life.engine->endpoint())});
  ASSERT_TRUE(peer.ok());
  Node client = MakeNode(4 * kMiB);
  std::vector<uint8_t> src(4096, 0x31);
  ASSERT_TRUE(client.engine->RegisterMemory(src.data(), src.size()).ok());
  TransferOp op{.kind = TransferKind::kWrite,
                .peer = peer.endpoint(),
                .remote_offset = 0,
                .local = src.data(),
                .length = src.size(),
                .pool_incarnation = kPool - 1,
                .master_epoch = kEpoch,
                .write_id = 3};
  std::vector<Status> r = client.engine->TransferAndWait({op});
  ASSERT_TRUE(r[0].ok()) << r[0].ToString();
  EXPECT_EQ(old_life.pool->base()[0], 0x31);
  // The peer restarts behind a partition: its old connection stays open, silent.
  peer.Cut();
  old_life = Node();
  std::fill(src.begin(), src.end(), 0x32);
  op.pool_incarnation = kPool;
  r = client.engine->TransferAndWait({op});
  ASSERT_TRUE(r[0].ok()) << r[0].ToString();
  EXPECT_EQ(new_life.pool->base()[0], 0x32);
  EXPECT_EQ(peer.accepted(), 2);
  // A stale op (placed in the last life) still fails, unsent: a new connection's hello says so.
  op.pool_incarnation = kPool - 1;
  r = client.engine->TransferAndWait({op});
  EXPECT_EQ(r[0].code(), ErrorCode::kTransferFailed);
  EXPECT_NE(r[0].message().find("restarted"), std::string::npos) << r[0].message();
  EXPECT_EQ(new_life.engine->stats().served_writes, 1u);
}

}  // namespace
}  // namespace kvagent::transfer

// Two engines in one process, each with its own pool, talking TCP over 127.0.0.1.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstring>
#include <future>
#include <thread>

#include "kvagent/common/checksum.h"
#include "kvagent/transfer/transfer_engine.h"
#include "test_support.h"

namespace kvagent::transfer {
namespace {

using testing::MakeNode;
using testing::Node;
using testing::Pattern;

constexpr uint64_t kMiB = uint64_t{1} << 20;

TransferOp Write(const std::string& peer, uint64_t offset, void* local, uint64_t length) {
  return {TransferKind::kWrite, peer, offset, local, length};
}
TransferOp Read(const std::string& peer, uint64_t offset, void* local, uint64_t length) {
  return {TransferKind::kRead, peer, offset, local, length};
}

class TcpTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_ = MakeNode(64 * kMiB);
    server_ = MakeNode(64 * kMiB);
    ASSERT_TRUE(client_.engine && server_.engine);
    peer_ = server_.engine->endpoint();
  }
  // A buffer in the client's pool: always registered local memory.
  uint8_t* ClientBuffer(uint64_t offset) { return client_.pool->base() + offset; }

  Node client_;
  Node server_;
  std::string peer_;
};

class RoundTripTest : public TcpTransferTest, public ::testing::WithParamInterface<uint64_t> {};

TEST_P(RoundTripTest, WriteThenReadBackIsByteExact) {
  const uint64_t size = GetParam();
  const uint64_t remote_offset = 3 * kMiB + 17;  // unaligned on purpose
  std::vector<uint8_t> value = Pattern(size, static_cast<uint32_t>(size));
  std::memcpy(ClientBuffer(0), value.data(), size);

  auto wrote =
      client_.engine->TransferAndWait({Write(peer_, remote_offset, ClientBuffer(0), size)});
  ASSERT_EQ(wrote.size(), 1u);
  ASSERT_TRUE(wrote[0].ok()) << wrote[0].ToString();
  EXPECT_EQ(std::memcmp(server_.pool->base() + remote_offset, value.data(), size), 0)
      << "the peer's pool holds the written bytes";

  uint8_t* back = ClientBuffer(32 * kMiB);
  std::memset(back, 0, size);
  auto read = client_.engine->TransferAndWait({Read(peer_, remote_offset, back, size)});
  ASSERT_TRUE(read[0].ok()) << read[0].ToString();
  EXPECT_EQ(std::memcmp(back, value.data(), size), 0);

  TransferStats stats = client_.engine->stats();
  EXPECT_EQ(stats.bytes_written, size);
  EXPECT_EQ(stats.bytes_read, size);
  EXPECT_EQ(server_.engine->stats().served_writes, 1u);
  EXPECT_EQ(server_.engine->stats().served_reads, 1u);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RoundTripTest, ::testing::Values(1, 4096, 1 * kMiB, 16 * kMiB),
                         [](const auto& info) { return std::to_string(info.param) + "B"; });

TEST_F(TcpTransferTest, ManyConcurrentOpsInOneBatchAllLandAndReportInOrder) {
  constexpr size_t kOps = 2000;
  constexpr uint64_t kValue = 4096 + 13;
  std::vector<uint8_t> data = Pattern(kOps * kValue, 7);
  std::memcpy(ClientBuffer(0), data.data(), data.size());
  std::vector<TransferOp> writes;
  for (size_t i = 0; i < kOps; ++i) {
    // Reverse order on the remote side: an op landing at the wrong place would show.
    writes.push_back(Write(peer_, (kOps - 1 - i) * kValue, ClientBuffer(i * kValue), kValue));
  }
  auto wrote = client_.engine->TransferAndWait(std::move(writes));
  ASSERT_EQ(wrote.size(), kOps);
  for (size_t i = 0; i < kOps; ++i) ASSERT_TRUE(wrote[i].ok()) << i << ": " << wrote[i].ToString();
  for (size_t i = 0; i < kOps; ++i) {
    ASSERT_EQ(std::memcmp(server_.pool->base() + (kOps - 1 - i) * kValue, data.data() + i * kValue,
                          kValue),
              0)
        << "op " << i;
  }
  std::vector<TransferOp> reads;
  const uint64_t back = 32 * kMiB;
  for (size_t i = 0; i < kOps; ++i) {
    reads.push_back(Read(peer_, i * kValue, ClientBuffer(back + i * kValue), kValue));
  }
  auto read = client_.engine->TransferAndWait(std::move(reads));
  for (size_t i = 0; i < kOps; ++i) ASSERT_TRUE(read[i].ok()) << read[i].ToString();
  for (size_t i = 0; i < kOps; ++i) {
    ASSERT_EQ(
        std::memcmp(ClientBuffer(back + i * kValue), server_.pool->base() + i * kValue, kValue), 0);
  }
  EXPECT_EQ(client_.engine->stats().connections_opened, 1u) << "one pooled connection per peer";
}

// A read that asks for the CRC32C of its bytes as they arrived gets it (taken from the
// transport's own buffer, before the bytes reach `local`), whatever the size and however the
// replies share the stream; the bytes land as without it. A write never reports one.
TEST_F(TcpTransferTest, AReadAskingForItsChecksumGetsTheCrcOfTheBytesAsTheyArrived) {
  const std::vector<uint64_t> sizes = {1, 100, 4096, 4096 + 13, 70000, 1 * kMiB, 5 * kMiB + 3};
  uint64_t total = 0;
  for (uint64_t n : sizes) total += n;
  std::vector<uint8_t> data = Pattern(total, 99);
  std::memcpy(server_.pool->base(), data.data(), total);
  std::vector<TransferOp> reads;
  std::vector<ReceivedChecksum> received(sizes.size() + 1);
  const uint64_t back = 16 * kMiB;
  uint64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    reads.push_back(Read(peer_, at, ClientBuffer(back + at), sizes[i]));
    reads.back().received = &received[i];
    at += sizes[i];
  }
  std::memcpy(ClientBuffer(0), data.data(), 4096);
  reads.push_back(Write(peer_, 40 * kMiB, ClientBuffer(0), 4096));
  reads.back().received = &received[sizes.size()];
  auto done = client_.engine->TransferAndWait(std::move(reads));
  ASSERT_EQ(done.size(), sizes.size() + 1);
  at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(done[i].ok()) << done[i].ToString();
    EXPECT_EQ(std::memcmp(ClientBuffer(back + at), data.data() + at, sizes[i]), 0) << sizes[i];
    EXPECT_TRUE(received[i].taken) << sizes[i];
    EXPECT_EQ(received[i].crc, Crc32c(data.data() + at, sizes[i])) << sizes[i];
    at += sizes[i];
  }
  ASSERT_TRUE(done.back().ok()) << done.back().ToString();
  EXPECT_FALSE(received.back().taken) << "a write has no received bytes";
}

TEST_F(TcpTransferTest, OutOfRangeOpIsRefusedAndTheNextOpStillWorks) {
  const uint64_t pool = server_.pool->size();
  auto results = client_.engine->TransferAndWait({
      Write(peer_, pool - 10, ClientBuffer(0), 11),
      Read(peer_, pool, ClientBuffer(0), 1),
      Write(peer_, 0, ClientBuffer(0), 100),
  });
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].code(), ErrorCode::kBufferOutOfRange);
  EXPECT_NE(results[0].message().find(peer_), std::string::npos) << results[0].message();
  EXPECT_NE(results[0].message().find(std::to_string(pool)), std::string::npos);
  EXPECT_EQ(results[1].code(), ErrorCode::kBufferOutOfRange);
  EXPECT_TRUE(results[2].ok()) << results[2].ToString();
}

TEST_F(TcpTransferTest, MalformedOpsFailAloneWithInvalidParams) {
  std::vector<uint8_t> unregistered(64);
  auto results = client_.engine->TransferAndWait({
      Write(peer_, 0, unregistered.data(), unregistered.size()),
      Write("tcp://not-an-ip:1", 0, ClientBuffer(0), 8),
      Write(peer_, 0, ClientBuffer(0), 0),
      Write(peer_, 0, nullptr, 8),
      Write(peer_, 64, ClientBuffer(0), 8),
  });
  ASSERT_EQ(results.size(), 5u);
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(results[i].IsInvalidParams()) << i << results[i].ToString();
  EXPECT_NE(results[0].message().find("RegisterMemory"), std::string::npos);
  EXPECT_TRUE(results[4].ok()) << results[4].ToString();
}

TEST_F(TcpTransferTest, RegisteredMemoryIsUsableAndUnregisteredIsNot) {
  std::vector<uint8_t> arena = Pattern(1 << 16, 3);
  ASSERT_TRUE(client_.engine->RegisterMemory(arena.data(), arena.size()).ok());
  EXPECT_TRUE(client_.engine->RegisterMemory(arena.data() + 8, 8).IsInvalidParams())
      << "overlapping registration";
  auto ok = client_.engine->TransferAndWait({Write(peer_, 0, arena.data(), arena.size())});
  EXPECT_TRUE(ok[0].ok()) << ok[0].ToString();
  EXPECT_EQ(std::memcmp(server_.pool->base(), arena.data(), arena.size()), 0);
  ASSERT_TRUE(client_.engine->UnregisterMemory(arena.data()).ok());
  auto refused = client_.engine->TransferAndWait({Write(peer_, 0, arena.data(), 1)});
  EXPECT_TRUE(refused[0].IsInvalidParams());
  EXPECT_TRUE(client_.engine->UnregisterMemory(arena.data()).IsInvalidParams());
}

TEST_F(TcpTransferTest, CallbacksRunOnTheEngineThreadOncePerBatch) {
  std::promise<std::thread::id> where;
  std::atomic<int> calls{0};
  client_.engine->Submit({Write(peer_, 0, ClientBuffer(0), 10)}, [&](std::vector<Status> results) {
    calls++;
    EXPECT_EQ(results.size(), 1u);
    where.set_value(std::this_thread::get_id());
  });
  EXPECT_NE(where.get_future().get(), std::this_thread::get_id());
  // An empty batch also completes, also on the engine thread.
  std::promise<std::pair<std::thread::id, size_t>> empty;
  client_.engine->Submit({}, [&](std::vector<Status> results) {
    empty.set_value({std::this_thread::get_id(), results.size()});
  });
  auto [thread, count] = empty.get_future().get();
  EXPECT_NE(thread, std::this_thread::get_id());
  EXPECT_EQ(count, 0u);
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(TcpTransferTest, IsLocalRecognisesOnlyTheEnginesOwnEndpoint) {
  EXPECT_TRUE(server_.engine->IsLocal(server_.engine->endpoint()));
  EXPECT_FALSE(server_.engine->IsLocal(client_.engine->endpoint()));
  EXPECT_FALSE(server_.engine->IsLocal("garbage"));
  EXPECT_EQ(server_.engine->endpoint().rfind("tcp://127.0.0.1:", 0), 0u);
}

TEST_F(TcpTransferTest, ReconnectsAfterThePeerRestartsOnTheSamePort) {
  ASSERT_TRUE(client_.engine->TransferAndWait({Write(peer_, 0, ClientBuffer(0), 10)})[0].ok());
  const std::string port = peer_.substr(peer_.rfind(':') + 1);
  server_.engine.reset();
  auto failed = client_.engine->TransferAndWait({Write(peer_, 0, ClientBuffer(0), 10)});
  EXPECT_EQ(failed[0].code(), ErrorCode::kTransferFailed) << failed[0].ToString();
  EXPECT_NE(failed[0].message().find(peer_), std::string::npos) << failed[0].message();

  TransferEngineOptions options;
  options.listen_address = "127.0.0.1:" + port;
  options.transport = TransportMode::kTcp;
  auto restarted = TransferEngine::Create(*server_.pool, options);
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  ASSERT_EQ((*restarted)->endpoint(), peer_);
  std::memset(ClientBuffer(0), 0x5A, 10);
  auto again = client_.engine->TransferAndWait({Write(peer_, 100, ClientBuffer(0), 10)});
  EXPECT_TRUE(again[0].ok()) << again[0].ToString();
  EXPECT_EQ(server_.pool->base()[109], 0x5A);
}

TEST_F(TcpTransferTest, DestroyingTheEngineFailsOutstandingOpsAndRunsTheirCallbacks) {
  // A peer that accepts TCP but never says hello keeps the op outstanding.
  uint16_t port = 0;
  const int listener = testing::ListenOnLoopback(&port);
  ASSERT_GE(listener, 0);
  const std::string silent = "tcp://127.0.0.1:" + std::to_string(port);

  std::promise<std::vector<Status>> done;
  client_.engine->Submit({Write(silent, 0, ClientBuffer(0), 10)},
                         [&](std::vector<Status> results) { done.set_value(std::move(results)); });
  client_.engine.reset();
  auto results = done.get_future().get();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].code(), ErrorCode::kTransferFailed);
  EXPECT_NE(results[0].message().find("shutting down"), std::string::npos) << results[0].message();
  close(listener);
}

}  // namespace
}  // namespace kvagent::transfer

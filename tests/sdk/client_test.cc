// The SDK against a real kvagent process: calls, arena buffers, concurrency, back-pressure,
// timeouts and local validation.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "agent_process.h"
#include "kvagent/client.h"

namespace kvagent::testing {
namespace {

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(agent_.started()); }
  void TearDown() override {
    if (agent_.Running()) agent_.Signal(SIGCONT);
  }

  std::unique_ptr<Client> Connect(uint64_t arena = 1 << 20, uint64_t ring = 0) {
    ClientOptions options;
    options.run_dir = agent_.run_dir();
    options.arena_bytes = arena;
    options.ring_bytes = ring;
    options.client_name = "client-test";
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(*client) : nullptr;
  }

  void StopAgent() {
    agent_.Signal(SIGSTOP);
    ASSERT_TRUE(WaitUntil([&] { return IsStopped(agent_.pid()); }));
  }

  AgentProcess agent_{DegradedAgentArgs()};  // no reachable master: see the per-key test
};

TEST_F(ClientTest, ConnectFailsWithAgentUnavailableWhenNoAgentListens) {
  ClientOptions options;
  options.run_dir = agent_.run_dir() + "/nowhere";
  auto client = Client::Connect(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), ErrorCode::kAgentUnavailable);
  EXPECT_NE(client.status().message().find("kvagent --run-dir"), std::string::npos);
}

TEST_F(ClientTest, PingAnswersOkWithNoKeys) {
  auto client = Connect();
  ASSERT_TRUE(client);
  Reply r = client->Ping();
  EXPECT_TRUE(r.ok()) << r.status.ToString();
  EXPECT_TRUE(r.keys.empty());
  EXPECT_GT(client->client_id(), 0u);
  EXPECT_NE(client->agent_incarnation(), 0u);
  EXPECT_EQ(client->agent_epoch(), client->agent_incarnation());  // the deprecated name
  EXPECT_EQ(client->arena_bytes(), 1u << 20);
}

TEST_F(ClientTest, EveryOpOtherThanPingIsAnsweredPerKeyByTheHandler) {
  auto client = Connect();
  ASSERT_TRUE(client);
  std::vector<std::string> keys = {"a", "b", "c"};
  std::vector<std::string> sessions = {"s1", "", "s3"};
  auto buffer = client->Allocate(4096);
  ASSERT_TRUE(buffer.ok());
  std::vector<Value> values = {Value(*buffer), Value(std::string_view("raw")), Value(*buffer, 10)};
  CallOptions options;
  options.session_ids = sessions;
  std::vector<const ArenaBuffer*> targets = {&*buffer, &*buffer, &*buffer};
  for (Reply r : {client->Put(keys, values, options), client->Upsert(keys, values, options),
                  client->Get(keys, targets), client->Exist(keys), client->Remove(keys)}) {
    EXPECT_EQ(r.status.code(), ErrorCode::kMasterUnavailable);
    ASSERT_EQ(r.keys.size(), 3u);
    for (const KeyResult& k : r.keys) {
      EXPECT_EQ(k.code, ErrorCode::kMasterUnavailable);
      EXPECT_NE(k.message.find("not reachable"), std::string::npos) << k.message;
    }
  }
  Reply all = client->RemoveAll();
  EXPECT_EQ(all.status.code(), ErrorCode::kMasterUnavailable);
}

TEST_F(ClientTest, InvalidArgumentsFailLocallyWithoutARoundTrip) {
  auto client = Connect();
  ASSERT_TRUE(client);
  StopAgent();  // anything that reached the agent would now time out instead
  std::vector<std::string> keys = {"a", "b"};
  std::vector<Value> values = {Value(std::string_view("x")), Value(std::string_view("y"))};
  std::vector<std::string> long_session = {"ok", std::string(257, 's')};
  CallOptions options;
  options.session_ids = long_session;
  options.timeout = std::chrono::milliseconds(60000);
  Reply r = client->Put(keys, values, options);
  EXPECT_EQ(r.status.code(), ErrorCode::kInvalidParams);
  ASSERT_EQ(r.keys.size(), 2u);
  EXPECT_EQ(r.keys[0].code, ErrorCode::kInvalidParams);
  EXPECT_NE(r.status.message().find("257 bytes"), std::string::npos);

  std::vector<std::string> bad_utf8 = {"ok", "\xff"};
  options.session_ids = bad_utf8;
  EXPECT_EQ(client->Put(keys, values, options).status.code(), ErrorCode::kInvalidParams);
  std::vector<std::string> one = {"only-one"};
  options.session_ids = one;
  EXPECT_EQ(client->Put(keys, values, options).status.code(), ErrorCode::kInvalidParams);
  std::vector<Value> one_value = {Value(std::string_view("x"))};
  EXPECT_EQ(client->Put(keys, one_value).status.code(), ErrorCode::kInvalidParams);
  std::vector<std::string> empty_key = {""};
  EXPECT_EQ(client->Exist(empty_key).status.code(), ErrorCode::kInvalidParams);
}

TEST_F(ClientTest, ArenaBuffersAreDisjointAndExhaustionSaysHowMuchIsFree) {
  auto client = Connect(64 << 10);
  ASSERT_TRUE(client);
  auto a = client->Allocate(32 << 10);
  auto b = client->Allocate(32 << 10);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->offset() + a->size() <= b->offset() || b->offset() + b->size() <= a->offset());
  std::memset(a->data(), 0xAA, a->size());  // writable in place
  auto c = client->Allocate(1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kNoSpace);
  *a = ArenaBuffer();  // frees a's range
  EXPECT_TRUE(client->Allocate(32 << 10).ok());
}

TEST_F(ClientTest, ValueLongerThanItsArenaBufferIsBufferOutOfRange) {
  auto client = Connect();
  ASSERT_TRUE(client);
  auto buffer = client->Allocate(100);
  ASSERT_TRUE(buffer.ok());
  std::vector<std::string> keys = {"k"};
  std::vector<Value> values = {Value(*buffer, 101)};
  EXPECT_EQ(client->Put(keys, values).status.code(), ErrorCode::kBufferOutOfRange);
}

TEST_F(ClientTest, BufferOfAnotherClientIsRejected) {
  auto mine = Connect();
  auto theirs = Connect();
  ASSERT_TRUE(mine && theirs);
  auto buffer = theirs->Allocate(64);
  ASSERT_TRUE(buffer.ok());
  std::vector<std::string> keys = {"k"};
  std::vector<Value> values = {Value(*buffer)};
  Reply r = mine->Put(keys, values);
  EXPECT_EQ(r.status.code(), ErrorCode::kBufferOutOfRange);
  EXPECT_NE(r.status.message().find("another Client"), std::string::npos);
}

TEST_F(ClientTest, ArenaBufferMayOutliveItsClient) {
  ArenaBuffer survivor;
  {
    auto client = Connect();
    ASSERT_TRUE(client);
    survivor = client->Allocate(128).value();
  }
  std::memset(survivor.data(), 1, survivor.size());  // still mapped
  survivor = ArenaBuffer();
}

TEST_F(ClientTest, ManyThreadsShareOneClient) {
  auto client = Connect();
  ASSERT_TRUE(client);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) failures += !client->Ping().ok();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(ClientTest, AsyncCallCanBePolledAndThenCollected) {
  auto client = Connect();
  ASSERT_TRUE(client);
  PendingCall call = client->SubmitPing();
  EXPECT_TRUE(WaitUntil([&] { return call.Ready(); }));
  Reply r = call.Wait();
  EXPECT_TRUE(r.ok()) << r.status.ToString();
  // Abandoned calls free their slots once their replies arrive: far more than max_in_flight
  // abandoned calls still work.
  for (int i = 0; i < 10000; ++i) (void)client->SubmitPing();
  EXPECT_TRUE(client->Ping().ok());
}

TEST_F(ClientTest, FullRequestRingMakesTheCallerWaitAndNothingIsDropped) {
  auto client = Connect(1 << 20, 4096);  // smallest rings: ~64 Ping frames
  ASSERT_TRUE(client);
  StopAgent();
  constexpr int kCalls = 1000;
  std::atomic<int> submitted{0};
  std::vector<PendingCall> calls(kCalls);
  std::thread submitter([&] {
    for (int i = 0; i < kCalls; ++i) {
      calls[i] = client->SubmitPing(std::chrono::milliseconds(60000));
      submitted.fetch_add(1);
    }
  });
  ASSERT_TRUE(WaitUntil([&] { return submitted.load() >= 10; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_LT(submitted.load(), kCalls);  // the ring cannot hold them all: the caller waits
  agent_.Signal(SIGCONT);
  submitter.join();
  int ok = 0;
  for (auto& c : calls) ok += c.Wait().ok();
  EXPECT_EQ(ok, kCalls);
}

TEST_F(ClientTest, UnansweredCallTimesOutAndALateReplyIsDropped) {
  auto client = Connect();
  ASSERT_TRUE(client);
  StopAgent();
  Reply r = client->Ping(std::chrono::milliseconds(20));
  EXPECT_EQ(r.status.code(), ErrorCode::kTimeout) << r.status.ToString();
  agent_.Signal(SIGCONT);
  Reply after = client->Ping();
  EXPECT_TRUE(after.ok()) << after.status.ToString();
}

TEST_F(ClientTest, RequestLargerThanTheRingIsAnErrorNotAHang) {
  auto client = Connect(1 << 20, 4096);
  ASSERT_TRUE(client);
  std::vector<std::string> keys;
  for (int i = 0; i < 100; ++i) keys.push_back(std::string(100, 'k') + std::to_string(i));
  Reply r = client->Exist(keys);
  EXPECT_EQ(r.status.code(), ErrorCode::kInvalidParams);
  EXPECT_NE(r.status.message().find("split the batch"), std::string::npos) << r.status.message();
  EXPECT_TRUE(client->Ping().ok());
}

}  // namespace
}  // namespace kvagent::testing

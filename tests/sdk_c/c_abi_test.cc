// The C ABI against a real kvagent: connecting, options, arena buffers, local validation, async
// calls, buffers held by calls in flight, agent death, threads.
#include <cstring>
#include <thread>
#include <vector>

#include "c_abi.h"

namespace kvagent::testing {
namespace {

TEST_F(CAbiTest, ConnectWithoutAnAgentIsAgentUnavailableAndSaysWhatToDo) {
  kv_connect_options_t options;
  kv_connect_options_init(&options);
  const std::string nowhere = agent_.run_dir() + "/nowhere";
  options.run_dir = nowhere.c_str();
  kv_client_t* client = reinterpret_cast<kv_client_t*>(0x1);  // must be overwritten
  EXPECT_EQ(kv_connect(&options, &client), KV_AGENT_UNAVAILABLE);
  EXPECT_EQ(client, nullptr);
  EXPECT_NE(std::string(kv_last_error_message()).find("kvagent --run-dir"), std::string::npos)
      << kv_last_error_message();
}

TEST_F(CAbiTest, PingAnswersOkAndTheClientReportsWhatTheAgentGranted) {
  ClientPtr client = Connect(1 << 20);
  ASSERT_TRUE(client);
  EXPECT_EQ(kv_ping(client.get(), 0), KV_OK) << kv_last_error_message();
  EXPECT_STREQ(kv_last_error_message(), "");
  EXPECT_GT(kv_client_id(client.get()), 0u);
  EXPECT_NE(kv_client_agent_incarnation(client.get()), 0u);
  // The deprecated name answers the same value.
  EXPECT_EQ(kv_client_agent_epoch(client.get()), kv_client_agent_incarnation(client.get()));
  EXPECT_EQ(kv_client_agent_incarnation(nullptr), 0u);
  EXPECT_EQ(kv_client_arena_bytes(client.get()), 1u << 20);
  EXPECT_EQ(kv_client_connected(client.get()), 1);
}

TEST_F(CAbiTest, OptionsMustComeFromTheirInitAndUnknownFieldsMustBeUnset) {
  kv_connect_options_t zeroed;
  std::memset(&zeroed, 0, sizeof(zeroed));
  kv_client_t* client = nullptr;
  EXPECT_EQ(kv_connect(&zeroed, &client), KV_INVALID_PARAMS);
  EXPECT_NE(std::string(kv_last_error_message()).find("kv_connect_options_init"), std::string::npos)
      << kv_last_error_message();

  // A newer header's struct: accepted while its extra fields are zero, refused once one is set.
  struct Newer {
    kv_connect_options_t known;
    uint64_t added_later;
  } newer;
  std::memset(&newer, 0, sizeof(newer));
  kv_connect_options_init(&newer.known);
  newer.known.struct_size = sizeof(newer);
  newer.known.run_dir = agent_.run_dir().c_str();
  ASSERT_EQ(kv_connect(&newer.known, &client), KV_OK) << kv_last_error_message();
  ClientPtr owned(client);
  newer.added_later = 7;
  client = nullptr;
  EXPECT_EQ(kv_connect(&newer.known, &client), KV_INVALID_PARAMS);
  EXPECT_NE(std::string(kv_last_error_message()).find("upgrade libkvclient"), std::string::npos);
  EXPECT_EQ(client, nullptr);

  // The same rule for per-call options.
  kv_call_options_t call;
  kv_call_options_init(&call);
  call.struct_size = 4;
  const kv_bytes_t key = Bytes("k");
  kv_result_t* raw = nullptr;
  EXPECT_EQ(kv_exist(owned.get(), 1, &key, &call, &raw), KV_INVALID_PARAMS);
  ResultPtr result(raw);
  ExpectEveryKey(result.get(), 1, KV_INVALID_PARAMS);
}

TEST_F(CAbiTest, ArenaBuffersAreWritableDisjointAndExhaustionSaysWhatIsFree) {
  ClientPtr client = Connect(64 << 10);
  ASSERT_TRUE(client);
  BufferPtr a = Allocate(client.get(), 32 << 10);
  BufferPtr b = Allocate(client.get(), 32 << 10);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(kv_buffer_size(a.get()), 32u << 10);
  auto* pa = static_cast<uint8_t*>(kv_buffer_data(a.get()));
  auto* pb = static_cast<uint8_t*>(kv_buffer_data(b.get()));
  EXPECT_TRUE(pa + (32 << 10) <= pb || pb + (32 << 10) <= pa);
  std::memset(pa, 0xAA, 32 << 10);
  std::memset(pb, 0x55, 32 << 10);
  EXPECT_EQ(pa[(32 << 10) - 1], 0xAA);

  kv_buffer_t* none = reinterpret_cast<kv_buffer_t*>(0x1);
  EXPECT_EQ(kv_allocate(client.get(), 1, &none), KV_NO_SPACE);
  EXPECT_EQ(none, nullptr);
  EXPECT_NE(std::string(kv_last_error_message()).find("largest extent"), std::string::npos)
      << kv_last_error_message();
  EXPECT_EQ(kv_allocate(client.get(), 0, &none), KV_INVALID_PARAMS);

  a.reset();  // its range goes back to the arena
  EXPECT_TRUE(Allocate(client.get(), 32 << 10));
}

TEST_F(CAbiTest, InvalidArgumentsFailLocallyWithoutARoundTrip) {
  ClientPtr client = Connect();
  ASSERT_TRUE(client);
  StopAgent();  // anything that reached the agent would now time out instead
  kv_write_options_t write;
  kv_write_options_init(&write);
  write.timeout_ms = 60000;
  const kv_bytes_t keys[] = {Bytes("a"), Bytes("b")};
  const kv_value_t values[] = {{nullptr, "x", 1}, {nullptr, "y", 1}};
  auto put = [&](const kv_bytes_t* k, const kv_value_t* v, const kv_bytes_t* sessions) {
    kv_result_t* raw = nullptr;
    kv_put(client.get(), 2, k, v, sessions, nullptr, &write, &raw);
    return ResultPtr(raw);
  };

  const std::string long_id(257, 's');
  const kv_bytes_t long_session[] = {Bytes("ok"), Bytes(long_id)};
  ResultPtr r = put(keys, values, long_session);
  ExpectEveryKey(r.get(), 2, KV_INVALID_PARAMS);
  EXPECT_EQ(r->status, KV_INVALID_PARAMS);
  EXPECT_NE(Message(*r).find("257 bytes"), std::string::npos) << Message(*r);
  EXPECT_EQ(Message(r->keys[1]), Message(*r));

  // Lengths, not NUL terminators, delimit the bytes: the invalid byte after a NUL is found.
  const kv_bytes_t nul_then_bad[] = {Bytes("ok"), Bytes(std::string_view("a\0\xff", 3))};
  r = put(keys, values, nul_then_bad);
  EXPECT_EQ(r->status, KV_INVALID_PARAMS);
  EXPECT_NE(Message(*r).find("session_ids[1]: invalid UTF-8 at byte 2"), std::string::npos)
      << Message(*r);
  const kv_bytes_t bad_keys[] = {Bytes("\xc3\x28"), Bytes("b")};
  r = put(bad_keys, values, nullptr);
  EXPECT_EQ(r->status, KV_INVALID_PARAMS);
  EXPECT_NE(Message(*r).find("keys[0]: invalid UTF-8 at byte 0"), std::string::npos) << Message(*r);

  // Malformed C arrays are refused before anything is read through them.
  r = put(nullptr, values, nullptr);
  EXPECT_EQ(r->status, KV_INVALID_PARAMS);
  EXPECT_NE(Message(*r).find("keys is NULL"), std::string::npos);
  const kv_value_t no_data[] = {{nullptr, "x", 1}, {nullptr, nullptr, 3}};
  r = put(keys, no_data, nullptr);
  EXPECT_NE(Message(*r).find("values[1] has neither a buffer nor bytes"), std::string::npos);
  const kv_bytes_t dangling[] = {Bytes("ok"), {nullptr, 5}};
  r = put(keys, values, dangling);
  EXPECT_NE(Message(*r).find("session_ids[1].data is NULL"), std::string::npos);
  write.replica_count = 0;
  r = put(keys, values, nullptr);
  EXPECT_NE(Message(*r).find("replica_count is 0"), std::string::npos) << Message(*r);

  kv_buffer_t* no_buffers[] = {nullptr};
  kv_result_t* raw = nullptr;
  EXPECT_EQ(kv_get(client.get(), 1, keys, no_buffers, nullptr, &raw), KV_INVALID_PARAMS);
  r.reset(raw);
  EXPECT_NE(Message(*r).find("buffers[0] is NULL"), std::string::npos);
}

TEST_F(CAbiTest, ACountAboveTheBatchLimitIsRefusedWithoutTouchingTheArrays) {
  ClientPtr client = Connect();
  ASSERT_TRUE(client);
  const kv_bytes_t one = Bytes("k");
  kv_result_t* raw = nullptr;
  EXPECT_EQ(kv_exist(client.get(), SIZE_MAX, &one, nullptr, &raw), KV_INVALID_PARAMS);
  ResultPtr r(raw);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->key_count, 0u);
  EXPECT_NE(Message(*r).find("split the batch"), std::string::npos) << Message(*r);
  EXPECT_EQ(kv_exist(client.get(), KV_MAX_BATCH_KEYS + 1, &one, nullptr, nullptr),
            KV_INVALID_PARAMS);
  raw = nullptr;
  EXPECT_EQ(kv_exist(nullptr, SIZE_MAX, &one, nullptr, &raw), KV_INVALID_PARAMS);  // no client
  ResultPtr refused(raw);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->key_count, 0u);
}

TEST_F(CAbiTest, NullHandlesAreRefusedWithAMessageAndFreeingNullIsANoOp) {
  EXPECT_EQ(kv_ping(nullptr, 0), KV_INVALID_PARAMS);
  EXPECT_NE(std::string(kv_last_error_message()).find("kv_connect"), std::string::npos);
  kv_buffer_t* buffer = nullptr;
  EXPECT_EQ(kv_allocate(nullptr, 16, &buffer), KV_INVALID_PARAMS);
  EXPECT_EQ(kv_connect(nullptr, nullptr), KV_INVALID_PARAMS);
  const kv_bytes_t keys[] = {Bytes("a"), Bytes("b")};
  kv_result_t* raw = nullptr;
  EXPECT_EQ(kv_remove(nullptr, 2, keys, nullptr, &raw), KV_INVALID_PARAMS);
  ResultPtr r(raw);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->key_count, 2u);  // one entry per key, as for any refused call
  kv_pending_t* pending = nullptr;
  EXPECT_EQ(kv_submit_ping(nullptr, 0, &pending), KV_INVALID_PARAMS);
  EXPECT_EQ(pending, nullptr);
  EXPECT_EQ(kv_pending_wait(nullptr, nullptr), KV_INVALID_PARAMS);
  EXPECT_EQ(kv_pending_ready(nullptr), 1);
  EXPECT_EQ(kv_buffer_data(nullptr), nullptr);
  EXPECT_EQ(kv_buffer_size(nullptr), 0u);
  EXPECT_EQ(kv_client_connected(nullptr), 0);
  kv_client_free(nullptr);
  kv_buffer_free(nullptr);
  kv_pending_free(nullptr);
  kv_result_free(nullptr);
}

TEST_F(CAbiTest, StatusNamesAreSemanticsNamesAndUnknownCodesReadAsInternal) {
  EXPECT_STREQ(kv_status_name(KV_OK), "OK");
  EXPECT_STREQ(kv_status_name(KV_OBJECT_ALREADY_EXISTS), "OBJECT_ALREADY_EXISTS");
  EXPECT_STREQ(kv_status_name(KV_AGENT_UNAVAILABLE), "AGENT_UNAVAILABLE");
  EXPECT_STREQ(kv_status_name(static_cast<kv_status_t>(99)), "INTERNAL");
  EXPECT_STREQ(kv_status_name(static_cast<kv_status_t>(-1)), "INTERNAL");
  EXPECT_STREQ(kv_status_name(static_cast<kv_status_t>(65536)), "INTERNAL");
  EXPECT_TRUE(kv_key_succeeded(KV_OBJECT_ALREADY_EXISTS));
  EXPECT_FALSE(kv_key_succeeded(KV_OBJECT_NOT_FOUND));
}

TEST_F(CAbiTest, TheLastErrorMessageBelongsToTheCallingThread) {
  ClientPtr client = Connect();
  ASSERT_TRUE(client);
  kv_buffer_t* buffer = nullptr;
  ASSERT_EQ(kv_allocate(client.get(), 0, &buffer), KV_INVALID_PARAMS);
  const std::string mine = kv_last_error_message();
  ASSERT_FALSE(mine.empty());
  std::thread other([&] { EXPECT_EQ(kv_ping(client.get(), 0), KV_OK); });
  other.join();
  EXPECT_EQ(mine, kv_last_error_message());
}

TEST_F(CAbiTest, AnAsyncCallCanBePolledThenCollectedExactlyOnce) {
  ClientPtr client = Connect();
  ASSERT_TRUE(client);
  kv_pending_t* raw = nullptr;
  ASSERT_EQ(kv_submit_ping(client.get(), 0, &raw), KV_OK);
  PendingPtr pending(raw);
  EXPECT_TRUE(WaitUntil([&] { return kv_pending_ready(pending.get()) == 1; }));
  kv_result_t* result = nullptr;
  EXPECT_EQ(kv_pending_wait(pending.get(), &result), KV_OK);
  ResultPtr owned(result);
  ASSERT_TRUE(owned);
  EXPECT_EQ(owned->key_count, 0u);
  EXPECT_EQ(kv_pending_wait(pending.get(), nullptr), KV_INVALID_PARAMS);
  EXPECT_NE(std::string(kv_last_error_message()).find("wait once"), std::string::npos);
}

TEST_F(CAbiTest, ASubmitWithBadArgumentsIsCollectedLikeAnyOtherCall) {
  ClientPtr client = Connect();
  ASSERT_TRUE(client);
  const std::string long_id(300, 's');
  const kv_bytes_t key = Bytes("k"), session = Bytes(long_id);
  const kv_value_t value = {nullptr, "v", 1};
  kv_pending_t* raw = nullptr;
  ASSERT_EQ(kv_submit_put(client.get(), 1, &key, &value, &session, nullptr, nullptr, &raw), KV_OK);
  PendingPtr pending(raw);
  EXPECT_EQ(kv_pending_ready(pending.get()), 1);
  kv_result_t* result = nullptr;
  EXPECT_EQ(kv_pending_wait(pending.get(), &result), KV_INVALID_PARAMS);
  ResultPtr owned(result);
  ExpectEveryKey(owned.get(), 1, KV_INVALID_PARAMS);
}

// The buffer-holding rule (handles.h): a range named by a call in flight is not handed out
// again, whatever the caller does with its kv_buffer_t meanwhile.
TEST_F(CAbiTest, ABufferFreedDuringACallStaysReservedUntilTheCallIsCollected) {
  ClientPtr client = Connect(64 << 10);
  ASSERT_TRUE(client);
  BufferPtr whole = Allocate(client.get(), 64 << 10);
  ASSERT_TRUE(whole);
  StopAgent();
  const kv_bytes_t key = Bytes("k");
  kv_buffer_t* targets[] = {whole.get()};
  kv_pending_t* raw = nullptr;
  ASSERT_EQ(kv_submit_get(client.get(), 1, &key, targets, nullptr, &raw), KV_OK);
  PendingPtr pending(raw);
  whole.reset();
  EXPECT_FALSE(CanAllocate(client.get(), 64 << 10));
  agent_.Signal(SIGCONT);
  EXPECT_NE(kv_pending_wait(pending.get(), nullptr), KV_TIMEOUT);
  EXPECT_TRUE(CanAllocate(client.get(), 64 << 10));
}

TEST_F(CAbiTest, AnAbandonedCallKeepsItsBuffersUntilItsReplyArrives) {
  ClientPtr client = Connect(64 << 10);
  ASSERT_TRUE(client);
  BufferPtr whole = Allocate(client.get(), 64 << 10);
  ASSERT_TRUE(whole);
  StopAgent();
  const kv_bytes_t key = Bytes("k");
  const kv_value_t value = {whole.get(), nullptr, 64 << 10};
  kv_pending_t* pending = nullptr;
  ASSERT_EQ(kv_submit_put(client.get(), 1, &key, &value, nullptr, nullptr, nullptr, &pending),
            KV_OK);
  kv_pending_free(pending);  // abandoned while the agent cannot have read the value yet
  whole.reset();
  EXPECT_FALSE(CanAllocate(client.get(), 64 << 10));
  agent_.Signal(SIGCONT);
  EXPECT_TRUE(WaitUntil([&] { return CanAllocate(client.get(), 64 << 10); }));
}

TEST_F(CAbiTest, ATimedOutCallKeepsItsBuffersUntilTheClientIsFreed) {
  ClientPtr client = Connect(64 << 10);
  ASSERT_TRUE(client);
  BufferPtr whole = Allocate(client.get(), 64 << 10);
  ASSERT_TRUE(whole);
  StopAgent();
  const kv_bytes_t key = Bytes("k");
  kv_buffer_t* targets[] = {whole.get()};
  kv_call_options_t options;
  kv_call_options_init(&options);
  options.timeout_ms = 20;
  EXPECT_EQ(kv_get(client.get(), 1, &key, targets, &options, nullptr), KV_TIMEOUT);
  whole.reset();
  agent_.Signal(SIGCONT);
  EXPECT_EQ(kv_ping(client.get(), 0), KV_OK);  // the agent is answering again
  EXPECT_FALSE(CanAllocate(client.get(), 64 << 10));
}

TEST_F(CAbiTest, AKilledAgentFailsPendingAndLaterCallsWithAgentUnavailable) {
  ClientPtr client = Connect();
  ASSERT_TRUE(client);
  StopAgent();
  kv_pending_t* raw = nullptr;
  ASSERT_EQ(kv_submit_ping(client.get(), 60000, &raw), KV_OK);
  PendingPtr pending(raw);
  agent_.Kill();
  kv_result_t* result = nullptr;
  EXPECT_EQ(kv_pending_wait(pending.get(), &result), KV_AGENT_UNAVAILABLE);
  ResultPtr owned(result);
  ASSERT_TRUE(owned);
  EXPECT_GT(owned->message_size, 0u);
  EXPECT_TRUE(WaitUntil([&] { return kv_client_connected(client.get()) == 0; }));
  EXPECT_EQ(kv_ping(client.get(), 60000), KV_AGENT_UNAVAILABLE);
  const kv_bytes_t key = Bytes("k");
  kv_result_t* raw_exist = nullptr;
  EXPECT_EQ(kv_exist(client.get(), 1, &key, nullptr, &raw_exist), KV_AGENT_UNAVAILABLE);
  ResultPtr exist(raw_exist);
  ExpectEveryKey(exist.get(), 1, KV_AGENT_UNAVAILABLE);
}

TEST_F(CAbiTest, ManyThreadsShareOneClient) {
  ClientPtr client = Connect();
  ASSERT_TRUE(client);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        if (i % 2 == 0) {
          failures += kv_ping(client.get(), 0) != KV_OK;
        } else {
          kv_pending_t* p = nullptr;
          failures += kv_submit_ping(client.get(), 0, &p) != KV_OK;
          failures += kv_pending_wait(p, nullptr) != KV_OK;
          kv_pending_free(p);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace kvagent::testing

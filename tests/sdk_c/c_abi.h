// Test support for the C ABI: RAII owners of its handles (so a failing assertion frees them
// too), kv_bytes_t from a string, and a fixture with a real kvagent in a fresh run directory.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>

#include "agent_process.h"
#include "kvagent/client_c.h"

namespace kvagent::testing {

struct ClientFree {
  void operator()(kv_client_t* c) const { kv_client_free(c); }
};
struct BufferFree {
  void operator()(kv_buffer_t* b) const { kv_buffer_free(b); }
};
struct PendingFree {
  void operator()(kv_pending_t* p) const { kv_pending_free(p); }
};
struct ResultFree {
  void operator()(kv_result_t* r) const { kv_result_free(r); }
};
using ClientPtr = std::unique_ptr<kv_client_t, ClientFree>;
using BufferPtr = std::unique_ptr<kv_buffer_t, BufferFree>;
using PendingPtr = std::unique_ptr<kv_pending_t, PendingFree>;
using ResultPtr = std::unique_ptr<kv_result_t, ResultFree>;

inline kv_bytes_t Bytes(std::string_view s) { return kv_bytes_t{s.data(), s.size()}; }

inline std::string Message(const kv_key_result_t& k) {
  return std::string(k.message, k.message_size);
}
inline std::string Message(const kv_result_t& r) { return std::string(r.message, r.message_size); }

class CAbiTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(agent_.started()); }
  void TearDown() override {
    if (agent_.Running()) agent_.Signal(SIGCONT);
  }

  // A client of the test's agent (null, with a test failure, when it cannot connect).
  ClientPtr Connect(uint64_t arena = 1 << 20) {
    kv_connect_options_t options;
    kv_connect_options_init(&options);
    options.run_dir = agent_.run_dir().c_str();
    options.client_name = "sdk-c-test";
    options.arena_bytes = arena;
    kv_client_t* client = nullptr;
    EXPECT_EQ(kv_connect(&options, &client), KV_OK) << kv_last_error_message();
    return ClientPtr(client);
  }

  BufferPtr Allocate(kv_client_t* client, size_t size) {
    kv_buffer_t* buffer = nullptr;
    EXPECT_EQ(kv_allocate(client, size, &buffer), KV_OK) << kv_last_error_message();
    return BufferPtr(buffer);
  }

  // True when `size` bytes can be allocated now (the buffer is freed again at once).
  static bool CanAllocate(kv_client_t* client, size_t size) {
    kv_buffer_t* buffer = nullptr;
    const bool ok = kv_allocate(client, size, &buffer) == KV_OK;
    kv_buffer_free(buffer);
    return ok;
  }

  // Expects a result with `count` keys, each with `code`.
  static void ExpectEveryKey(const kv_result_t* r, size_t count, kv_status_t code) {
    ASSERT_NE(r, nullptr);
    ASSERT_EQ(r->key_count, count);
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(r->keys[i].code, code) << "keys[" << i << "]";
  }

  // Freezes the agent: nothing sent from now on is answered until TearDown or SIGCONT.
  void StopAgent() {
    agent_.Signal(SIGSTOP);
    ASSERT_TRUE(WaitUntil([&] { return IsStopped(agent_.pid()); }));
  }

  AgentProcess agent_;
};

}  // namespace kvagent::testing

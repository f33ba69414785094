// Data through the C ABI and a real kvagent (standalone: its embedded master and node pool):
// put/get with the bytes checked, keys with NUL and non-ASCII bytes, session IDs and block
// metadata, duplicates, upsert, exist/remove/remove-all, async, short buffers, list, stat.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "c_abi.h"

namespace kvagent::testing {
namespace {

class RoundTripTest : public CAbiTest {
 protected:
  void SetUp() override {
    CAbiTest::SetUp();
    client_ = Connect(4 << 20);
    ASSERT_TRUE(client_);
  }

  // Writes raw `values` under `keys` with `write` (kv_put or kv_upsert).
  ResultPtr Write(decltype(&kv_put) write, const std::vector<std::string>& keys,
                  const std::vector<std::string>& values) {
    std::vector<kv_bytes_t> k;
    std::vector<kv_value_t> v;
    for (size_t i = 0; i < keys.size(); ++i) {
      k.push_back(Bytes(keys[i]));
      v.push_back({nullptr, values[i].data(), values[i].size()});
    }
    kv_result_t* raw = nullptr;
    EXPECT_EQ(write(client_.get(), k.size(), k.data(), v.data(), nullptr, nullptr, nullptr, &raw),
              KV_OK)
        << kv_last_error_message();
    return ResultPtr(raw);
  }

  // Puts raw `values` under `keys` and expects every key stored.
  void PutAll(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
    ResultPtr r = Write(kv_put, keys, values);
    ExpectEveryKey(r.get(), keys.size(), KV_OK);
  }

  // The value of `key` read into a fresh buffer of `capacity` bytes ("" with a failure if the
  // key cannot be read).
  std::string GetOne(const std::string& key, size_t capacity = 64 << 10) {
    BufferPtr buffer = Allocate(client_.get(), capacity);
    kv_buffer_t* targets[] = {buffer.get()};
    const kv_bytes_t k = Bytes(key);
    kv_result_t* raw = nullptr;
    EXPECT_EQ(kv_get(client_.get(), 1, &k, targets, nullptr, &raw), KV_OK);
    ResultPtr r(raw);
    if (r == nullptr || r->key_count != 1 || r->keys[0].code != KV_OK) {
      ADD_FAILURE() << "get " << key << ": " << (r ? Message(r->keys[0]) : "no result");
      return "";
    }
    return std::string(static_cast<const char*>(kv_buffer_data(buffer.get())), r->keys[0].length);
  }

  // exists flags of `keys`.
  std::vector<uint32_t> Exist(const std::vector<std::string>& keys) {
    std::vector<kv_bytes_t> k;
    for (const std::string& key : keys) k.push_back(Bytes(key));
    kv_result_t* raw = nullptr;
    EXPECT_EQ(kv_exist(client_.get(), k.size(), k.data(), nullptr, &raw), KV_OK);
    ResultPtr r(raw);
    std::vector<uint32_t> flags;
    for (size_t i = 0; r && i < r->key_count; ++i) flags.push_back(r->keys[i].exists);
    return flags;
  }

  ClientPtr client_;
};

TEST_F(RoundTripTest, PutThenGetReturnsTheSameBytesFromArenaBuffersAndRawValues) {
  BufferPtr block = Allocate(client_.get(), 4096);
  ASSERT_TRUE(block);
  auto* p = static_cast<uint8_t*>(kv_buffer_data(block.get()));
  for (size_t i = 0; i < 4096; ++i) p[i] = static_cast<uint8_t>(i * 7 + 3);         // in place
  const std::string nul_key("\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87\0\xe9\x94\xae", 12);  // ключ\0键
  const std::string raw("raw\0bytes", 9);
  const kv_bytes_t keys[] = {Bytes("plain"), Bytes(nul_key)};
  const kv_value_t values[] = {{block.get(), nullptr, 4096}, {nullptr, raw.data(), raw.size()}};
  const kv_bytes_t sessions[] = {Bytes("s1"), Bytes("\xe4\xbc\x9a\xe8\xaf\x9d")};  // 会话
  std::vector<uint64_t> hashes = {1};
  std::vector<uint32_t> tokens(16);
  for (uint32_t i = 0; i < 16; ++i) tokens[i] = 100 + i;
  kv_block_t blocks[2];
  std::memset(blocks, 0, sizeof(blocks));  // blocks[1]: no metadata for that key
  blocks[0].hashes = hashes.data();
  blocks[0].hash_count = hashes.size();
  blocks[0].token_ids = tokens.data();
  blocks[0].token_count = tokens.size();
  blocks[0].block_size = 16;
  kv_result_t* raw_result = nullptr;
  ASSERT_EQ(kv_put(client_.get(), 2, keys, values, sessions, blocks, nullptr, &raw_result), KV_OK)
      << kv_last_error_message();
  ResultPtr put(raw_result);
  ExpectEveryKey(put.get(), 2, KV_OK);

  const std::string got = GetOne("plain");
  ASSERT_EQ(got.size(), 4096u);
  EXPECT_EQ(std::memcmp(got.data(), p, 4096), 0);
  EXPECT_EQ(GetOne(nul_key), raw);
  EXPECT_EQ(Exist({"\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87"}), std::vector<uint32_t>{0})
      << "the key is all 12 bytes, not the part before the NUL";
}

TEST_F(RoundTripTest, ASecondPutOfAKeyIsObjectAlreadyExistsWhichCountsAsSuccess) {
  PutAll({"k"}, {"first"});
  ResultPtr r = Write(kv_put, {"k"}, {"second"});
  ExpectEveryKey(r.get(), 1, KV_OBJECT_ALREADY_EXISTS);
  EXPECT_TRUE(kv_key_succeeded(r->keys[0].code));
  EXPECT_EQ(GetOne("k"), "first");
}

TEST_F(RoundTripTest, UpsertReplacesTheValue) {
  PutAll({"k"}, {"aaa"});
  ResultPtr r = Write(kv_upsert, {"k"}, {"bbbbbb"});
  ExpectEveryKey(r.get(), 1, KV_OK);
  EXPECT_EQ(GetOne("k"), "bbbbbb");
}

TEST_F(RoundTripTest, ExistAndRemoveSeeExactlyWhatWasStored) {
  PutAll({"here", "also"}, {"1", "2"});
  EXPECT_EQ(Exist({"here", "missing", "also"}), (std::vector<uint32_t>{1, 0, 1}));
  const kv_bytes_t gone[] = {Bytes("here"), Bytes("missing")};
  kv_result_t* raw = nullptr;
  EXPECT_EQ(kv_remove(client_.get(), 2, gone, nullptr, &raw), KV_OK);
  ResultPtr removed(raw);
  ASSERT_EQ(removed->key_count, 2u);
  EXPECT_EQ(removed->keys[0].code, KV_OK);
  EXPECT_EQ(removed->keys[1].code, KV_OBJECT_NOT_FOUND);
  EXPECT_GT(removed->keys[1].message_size, 0u);
  EXPECT_EQ(Exist({"here", "also"}), (std::vector<uint32_t>{0, 1}));

  BufferPtr buffer = Allocate(client_.get(), 16);
  kv_buffer_t* targets[] = {buffer.get()};
  raw = nullptr;
  EXPECT_EQ(kv_get(client_.get(), 1, gone, targets, nullptr, &raw), KV_OK);  // attempted
  ResultPtr get(raw);
  ExpectEveryKey(get.get(), 1, KV_OBJECT_NOT_FOUND);
}

TEST_F(RoundTripTest, RemoveAllCountsWhatItRemoved) {
  PutAll({"a", "b", "c"}, {"1", "2", "3"});
  kv_result_t* raw = nullptr;
  EXPECT_EQ(kv_remove_all(client_.get(), nullptr, &raw), KV_OK) << kv_last_error_message();
  ResultPtr r(raw);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->removed_count, 3u);
  EXPECT_EQ(Exist({"a", "b", "c"}), (std::vector<uint32_t>{0, 0, 0}));
}

TEST_F(RoundTripTest, GetIntoATooSmallBufferIsBufferOutOfRangeAndGivesTheLength) {
  PutAll({"big"}, {std::string(1000, 'x')});
  BufferPtr small = Allocate(client_.get(), 100);
  kv_buffer_t* targets[] = {small.get()};
  const kv_bytes_t key = Bytes("big");
  kv_result_t* raw = nullptr;
  EXPECT_EQ(kv_get(client_.get(), 1, &key, targets, nullptr, &raw), KV_OK);
  ResultPtr r(raw);
  ExpectEveryKey(r.get(), 1, KV_BUFFER_OUT_OF_RANGE);
  EXPECT_EQ(r->keys[0].length, 1000u);
}

TEST_F(RoundTripTest, AsyncPutsAndGetsRoundTrip) {
  constexpr int kCalls = 16;
  std::vector<std::string> keys, values;
  for (int i = 0; i < kCalls; ++i) {
    keys.push_back("async-" + std::to_string(i));
    values.push_back(std::string(100 + i, static_cast<char>('a' + i)));
  }
  std::vector<PendingPtr> puts;
  for (int i = 0; i < kCalls; ++i) {
    const kv_bytes_t k = Bytes(keys[i]);
    const kv_value_t v = {nullptr, values[i].data(), values[i].size()};
    kv_pending_t* p = nullptr;
    ASSERT_EQ(kv_submit_put(client_.get(), 1, &k, &v, nullptr, nullptr, nullptr, &p), KV_OK);
    puts.emplace_back(p);
  }
  for (auto& p : puts) EXPECT_EQ(kv_pending_wait(p.get(), nullptr), KV_OK);

  std::vector<BufferPtr> buffers;
  std::vector<PendingPtr> gets;
  for (int i = 0; i < kCalls; ++i) {
    buffers.push_back(Allocate(client_.get(), 256));
    const kv_bytes_t k = Bytes(keys[i]);
    kv_buffer_t* targets[] = {buffers.back().get()};
    kv_pending_t* p = nullptr;
    ASSERT_EQ(kv_submit_get(client_.get(), 1, &k, targets, nullptr, &p), KV_OK);
    gets.emplace_back(p);
  }
  for (int i = 0; i < kCalls; ++i) {
    kv_result_t* raw = nullptr;
    EXPECT_EQ(kv_pending_wait(gets[i].get(), &raw), KV_OK);
    ResultPtr r(raw);
    ExpectEveryKey(r.get(), 1, KV_OK);
    EXPECT_EQ(
        std::string(static_cast<const char*>(kv_buffer_data(buffers[i].get())), r->keys[0].length),
        values[i]);
  }
}

TEST_F(RoundTripTest, ListPagesThroughEveryKeyUnderThePrefixOnceWithSizesAndSessions) {
  std::vector<std::string> keys, values, sessions;
  for (int i = 0; i < 25; ++i) {
    keys.push_back("p/" + std::to_string(i));
    values.push_back(std::string(10 + i, 'v'));
    sessions.push_back(i % 2 ? "" : "s-" + std::to_string(i));
  }
  std::vector<kv_bytes_t> k, ids;
  std::vector<kv_value_t> v;
  for (int i = 0; i < 25; ++i) {
    k.push_back(Bytes(keys[i]));
    ids.push_back(Bytes(sessions[i]));
    v.push_back({nullptr, values[i].data(), values[i].size()});
  }
  kv_result_t* raw = nullptr;
  ASSERT_EQ(kv_put(client_.get(), 25, k.data(), v.data(), ids.data(), nullptr, nullptr, &raw),
            KV_OK);
  ResultPtr(raw).reset();
  PutAll({"q/outside"}, {"x"});

  std::map<std::string, std::pair<uint64_t, std::string>> listed;
  kv_list_options_t options;
  kv_list_options_init(&options);
  options.prefix = Bytes("p/");
  options.limit = 10;
  int pages = 0;
  do {
    raw = nullptr;
    ASSERT_EQ(kv_list(client_.get(), &options, &raw), KV_OK) << kv_last_error_message();
    ResultPtr page(raw);
    for (size_t i = 0; i < page->listed_count; ++i) {
      const kv_listed_key_t& e = page->listed[i];
      const std::string key(static_cast<const char*>(e.key.data), e.key.size);
      const std::string session(static_cast<const char*>(e.session_id.data), e.session_id.size);
      EXPECT_TRUE(listed.emplace(key, std::make_pair(e.size, session)).second) << "twice: " << key;
    }
    options.cursor = page->next_cursor;
    ASSERT_LT(++pages, 100) << "the scan does not end";
  } while (options.cursor != 0);
  EXPECT_GT(pages, 1);
  ASSERT_EQ(listed.size(), 25u);
  for (int i = 0; i < 25; ++i) {
    EXPECT_EQ(listed[keys[i]], std::make_pair(uint64_t(values[i].size()), sessions[i])) << keys[i];
  }

  options.limit = 20000;
  options.cursor = 0;
  raw = nullptr;
  EXPECT_EQ(kv_list(client_.get(), &options, &raw), KV_INVALID_PARAMS);
  ResultPtr(raw).reset();
}

TEST_F(RoundTripTest, StatReportsTheAgentsAndTheMastersCountersIncludingOurPuts) {
  PutAll({"a", "b"}, {"1", "2"});
  auto counters = [&] {
    kv_result_t* raw = nullptr;
    EXPECT_EQ(kv_stat(client_.get(), 0, &raw), KV_OK) << kv_last_error_message();
    ResultPtr r(raw);
    std::map<std::string, std::pair<uint64_t, std::string>> out;
    for (size_t i = 0; r && i < r->counter_count; ++i) {
      const kv_counter_t& c = r->counters[i];
      EXPECT_EQ(std::strlen(c.name), c.name_size);
      out[std::string(c.name, c.name_size)] = {c.value, std::string(c.text, c.text_size)};
    }
    return out;
  };
  auto before = counters();
  EXPECT_GE(before["agent.keys.put"].first, 2u);
  EXPECT_TRUE(before.count("agent.master_link"));
  EXPECT_TRUE(std::any_of(before.begin(), before.end(),
                          [](const auto& c) { return c.first.rfind("master.", 0) == 0; }));
  PutAll({"c"}, {"3"});
  EXPECT_EQ(counters()["agent.keys.put"].first, before["agent.keys.put"].first + 1);

  kv_pending_t* p = nullptr;
  ASSERT_EQ(kv_submit_stat(client_.get(), 0, &p), KV_OK);
  PendingPtr pending(p);
  kv_result_t* raw = nullptr;
  EXPECT_EQ(kv_pending_wait(pending.get(), &raw), KV_OK);
  ResultPtr r(raw);
  EXPECT_GT(r->counter_count, 0u);
}

}  // namespace
}  // namespace kvagent::testing

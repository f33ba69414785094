// Process memory through the C++ SDK and a real standalone kvagent: the agent copies values
// straight between this process's memory and its pool (so a value larger than the arena is fine),
// gathers and scatters ranges, fails only the key whose memory it cannot read or write (and
// keeps serving), and without the grant the SDK takes the same calls through the arena.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "agent_process.h"
#include "kvagent/client.h"

namespace kvagent {
namespace {

using testing::AgentProcess;

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 13 + i * 7 + (i >> 11));
  return v;
}

class ProcessMemoryTest : public ::testing::Test {
 protected:
  std::unique_ptr<Client> Connect(bool process_memory, uint64_t arena = 1 << 20) {
    ClientOptions options;
    options.run_dir = agent_.run_dir();
    options.arena_bytes = arena;
    options.client_name = "process-memory-test";
    options.process_memory = process_memory;
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(*client) : nullptr;
  }

  AgentProcess agent_;  // standalone: the embedded master answers, bytes land in its pool
};

TEST_F(ProcessMemoryTest, AValueLargerThanTheArenaGoesStraightFromMemoryAndBack) {
  auto c = Connect(/*process_memory=*/true, /*arena=*/1 << 20);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->process_memory());
  const std::vector<uint8_t> value = Pattern(8 << 20, 1);  // 8 MiB through a 1 MiB arena
  std::vector<std::string> keys = {"big"};
  std::vector<Value> values = {Value(std::span<const uint8_t>(value))};
  Reply put = c->Put(keys, values);
  ASSERT_TRUE(put.ok()) << put.status.ToString();
  ASSERT_EQ(put.keys[0].code, ErrorCode::kOk) << put.keys[0].message;

  std::vector<uint8_t> back(value.size() + 100, 0);
  MemoryRange target{back.data(), back.size()};
  std::vector<MemoryValue> targets = {MemoryValue(&target, 1)};
  Reply got = c->GetInto(keys, targets);
  ASSERT_EQ(got.keys[0].code, ErrorCode::kOk) << got.keys[0].message;
  EXPECT_EQ(got.keys[0].length, value.size());
  EXPECT_TRUE(std::equal(value.begin(), value.end(), back.begin()));

  // The same put without process memory needs the arena, which is too small.
  auto staged = Connect(/*process_memory=*/false, /*arena=*/1 << 20);
  ASSERT_TRUE(staged);
  std::vector<std::string> other = {"big-2"};
  Reply refused = staged->Put(other, values);
  EXPECT_EQ(refused.status.code(), ErrorCode::kNoSpace);
}

TEST_F(ProcessMemoryTest, RangesAreGatheredByAPutAndScatteredByAGet) {
  for (bool granted : {true, false}) {
    SCOPED_TRACE(granted ? "process memory" : "through the arena");
    auto c = Connect(granted);
    ASSERT_TRUE(c);
    ASSERT_EQ(c->process_memory(), granted);
    const std::vector<uint8_t> a = Pattern(70000, 2), b = Pattern(3, 3), d = Pattern(300001, 4);
    MemoryRange parts[] = {{const_cast<uint8_t*>(a.data()), a.size()},
                           {const_cast<uint8_t*>(b.data()), b.size()},
                           {const_cast<uint8_t*>(d.data()), d.size()}};
    const std::string key = granted ? "gathered-pm" : "gathered-arena";
    std::vector<std::string> keys = {key};
    std::vector<Value> values = {Value(MemoryValue(parts, 3))};
    Reply put = c->Put(keys, values);
    ASSERT_EQ(put.keys[0].code, ErrorCode::kOk) << put.keys[0].message;

    std::vector<uint8_t> x(100000), y(1), z(280000);
    MemoryRange into[] = {{x.data(), x.size()}, {y.data(), y.size()}, {z.data(), z.size()}};
    std::vector<MemoryValue> targets = {MemoryValue(into, 3)};
    Reply got = c->GetInto(keys, targets);
    ASSERT_EQ(got.keys[0].code, ErrorCode::kOk) << got.keys[0].message;
    std::vector<uint8_t> whole = a;
    whole.insert(whole.end(), b.begin(), b.end());
    whole.insert(whole.end(), d.begin(), d.end());
    ASSERT_EQ(got.keys[0].length, whole.size());
    std::vector<uint8_t> scattered = x;
    scattered.insert(scattered.end(), y.begin(), y.end());
    scattered.insert(scattered.end(), z.begin(), z.begin() + (whole.size() - 100001));
    EXPECT_EQ(scattered, whole);

    // A target smaller than the value: BUFFER_OUT_OF_RANGE with the size needed.
    MemoryRange small{x.data(), 10};
    std::vector<MemoryValue> too_small = {MemoryValue(&small, 1)};
    Reply short_get = c->GetInto(keys, too_small);
    EXPECT_EQ(short_get.keys[0].code, ErrorCode::kBufferOutOfRange);
    EXPECT_EQ(short_get.keys[0].length, whole.size());
  }
}

TEST_F(ProcessMemoryTest, MemoryTheAgentCannotUseFailsOnlyItsKeyAndTheAgentKeepsServing) {
  auto c = Connect(true);
  ASSERT_TRUE(c && c->process_memory());
  const size_t page = sysconf(_SC_PAGESIZE);
  auto* mapped = static_cast<uint8_t*>(
      mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(mapped, MAP_FAILED);
  std::memset(mapped, 7, 2 * page);
  ASSERT_EQ(munmap(mapped + page, page), 0);
  const std::vector<uint8_t> good = Pattern(5000, 5);

  std::vector<std::string> keys = {"good", "unmapped", "past-the-end"};
  MemoryRange r0{const_cast<uint8_t*>(good.data()), good.size()};
  MemoryRange r1{mapped + page, 100};
  MemoryRange r2{mapped, 2 * page};
  std::vector<Value> values = {Value(MemoryValue(&r0, 1)), Value(MemoryValue(&r1, 1)),
                               Value(MemoryValue(&r2, 1))};
  Reply put = c->Put(keys, values);
  ASSERT_TRUE(put.ok()) << put.status.ToString();
  EXPECT_EQ(put.keys[0].code, ErrorCode::kOk);
  EXPECT_EQ(put.keys[1].code, ErrorCode::kInvalidParams) << put.keys[1].message;
  EXPECT_EQ(put.keys[2].code, ErrorCode::kInvalidParams) << put.keys[2].message;
  EXPECT_NE(put.keys[1].message.find("not readable"), std::string::npos);

  Reply exist = c->Exist(keys);
  EXPECT_TRUE(exist.keys[0].exists);
  EXPECT_FALSE(exist.keys[1].exists);  // nothing of a failed key becomes readable
  EXPECT_FALSE(exist.keys[2].exists);

  // A get into memory that is not writable fails that key alone.
  ASSERT_EQ(mprotect(mapped, page, PROT_READ), 0);
  std::vector<uint8_t> ok_target(good.size());
  MemoryRange t0{ok_target.data(), ok_target.size()};
  MemoryRange t1{mapped, page};
  std::vector<std::string> small_key = {"small"};
  std::vector<Value> small = {Value(std::span<const uint8_t>(good.data(), 1000))};
  ASSERT_EQ(c->Put(small_key, small).keys[0].code, ErrorCode::kOk);
  std::vector<std::string> twice = {"good", "small"};
  std::vector<MemoryValue> targets = {MemoryValue(&t0, 1), MemoryValue(&t1, 1)};
  Reply got = c->GetInto(twice, targets);
  EXPECT_EQ(got.keys[0].code, ErrorCode::kOk);
  EXPECT_EQ(got.keys[1].code, ErrorCode::kInvalidParams) << got.keys[1].message;
  EXPECT_EQ(ok_target, good);
  munmap(mapped, page);

  EXPECT_TRUE(c->Ping().ok());  // the agent is still there
  EXPECT_TRUE(agent_.Running());
}

TEST_F(ProcessMemoryTest, NullRangesAreRefusedLocally) {
  auto c = Connect(true);
  ASSERT_TRUE(c);
  std::vector<std::string> keys = {"k"};
  MemoryRange null_range{nullptr, 10};
  std::vector<Value> values = {Value(MemoryValue(&null_range, 1))};
  Reply put = c->Put(keys, values);
  EXPECT_EQ(put.status.code(), ErrorCode::kInvalidParams);
  std::vector<MemoryValue> targets = {MemoryValue()};
  EXPECT_EQ(c->GetInto(keys, targets).status.code(), ErrorCode::kInvalidParams);
}

}  // namespace
}  // namespace kvagent

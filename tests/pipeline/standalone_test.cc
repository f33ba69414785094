// The request pipeline of a standalone kvagent (embedded master), through the SDK: every op with
// its bytes checked, per-key results by original position, natural batching across clients.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pipeline_support.h"

namespace kvagent::testing {
namespace {

// Puts `values[i]` under `keys[i]` (raw bytes: the SDK copies them into its arena).
Reply PutAll(Client& c, const std::vector<std::string>& keys,
             const std::vector<std::string>& values, const std::vector<std::string>& sessions = {},
             bool upsert = false) {
  std::vector<Value> vs;
  for (const auto& v : values) vs.emplace_back(std::string_view(v));
  CallOptions o;
  o.session_ids = sessions;
  return upsert ? c.Upsert(keys, vs, o) : c.Put(keys, vs, o);
}

// Reads `key` into a buffer of `capacity` bytes; returns the bytes read (empty on failure, with
// the key's result in *result).
std::string GetOne(Client& c, const std::string& key, size_t capacity,
                   KeyResult* result = nullptr) {
  auto buffer = c.Allocate(capacity);
  if (!buffer.ok()) return "";
  std::vector<std::string> keys = {key};
  std::vector<const ArenaBuffer*> targets = {&*buffer};
  Reply r = c.Get(keys, targets);
  if (r.keys.size() != 1) return "";
  if (result != nullptr) *result = r.keys[0];
  if (r.keys[0].code != ErrorCode::kOk) return "";
  return std::string(reinterpret_cast<const char*>(buffer->data()), r.keys[0].length);
}

// Equal bytes, or a failure that says where they first differ (not the whole values).
::testing::AssertionResult SameBytes(const std::string& got, const std::string& want) {
  if (got == want) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return ::testing::AssertionFailure() << "got " << got.size() << " bytes, want " << want.size()
                                       << "; first difference at byte " << i;
}

std::vector<std::string> Codes(const Reply& r) {
  std::vector<std::string> out;
  for (const auto& k : r.keys) out.emplace_back(ErrorCodeName(k.code));
  return out;
}

std::map<std::string, ListedKey> ListAll(Client& c, const std::string& prefix, uint32_t limit) {
  std::map<std::string, ListedKey> out;
  ListOptions o;
  o.prefix = prefix;
  o.limit = limit;
  for (int pages = 0; pages < 10000; ++pages) {
    Reply r = c.List(o);
    EXPECT_TRUE(r.ok()) << r.status.ToString();
    if (!r.ok()) break;
    for (const auto& k : r.listed) {
      EXPECT_TRUE(out.emplace(k.key, k).second) << "listed twice: " << k.key;
    }
    if (r.next_cursor == 0) break;
    o.cursor = r.next_cursor;
  }
  return out;
}

TEST(Standalone, PutThenGetReturnsTheSameBytesFor4KiBAnd1MiBValues) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  const std::vector<std::string> keys = {"small", "large"};
  const std::vector<std::string> values = {Pattern("small", 4096), Pattern("large", 1 << 20)};
  Reply put = PutAll(*c, keys, values);
  ASSERT_TRUE(put.ok()) << put.status.ToString();
  EXPECT_EQ(Codes(put), (std::vector<std::string>{"OK", "OK"}));
  EXPECT_TRUE(SameBytes(GetOne(*c, "small", 4096), values[0]));
  EXPECT_TRUE(SameBytes(GetOne(*c, "large", 2 << 20), values[1]));
  // Zero-copy: a value filled in place in an arena buffer.
  auto buffer = c->Allocate(8192);
  ASSERT_TRUE(buffer.ok());
  const std::string bytes = Pattern("in-place", 8192);
  std::memcpy(buffer->data(), bytes.data(), bytes.size());
  std::vector<std::string> k = {"in-place"};
  std::vector<Value> v = {Value(*buffer)};
  EXPECT_TRUE(c->Put(k, v).keys.at(0).ok());
  EXPECT_TRUE(SameBytes(GetOne(*c, "in-place", 8192), bytes));
}

TEST(Standalone, ValueLargerThanThePartSizeIsStoredInPartsAndReadBackWhole) {
  AgentProcess agent({"--max-part-bytes", "64KiB"});
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  const std::string value = Pattern("multi", (1 << 20) + 7);  // 17 parts, the last one 7 bytes
  Reply put = PutAll(*c, {"multi"}, {value}, {"writer-1"});
  ASSERT_EQ(Codes(put), std::vector<std::string>{"OK"}) << put.keys[0].message;
  EXPECT_TRUE(SameBytes(GetOne(*c, "multi", value.size()), value));
  auto listed = ListAll(*c, "multi", 100);
  ASSERT_EQ(listed.count("multi"), 1u);
  EXPECT_EQ(listed["multi"].size, value.size());
  EXPECT_EQ(listed["multi"].session_id, "writer-1");
}

TEST(Standalone, ExistIsTrueOnlyForStoredKeysAndRemoveMakesThemUnreadable) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(PutAll(*c, {"a", "b"}, {"1", "2"}).ok());
  std::vector<std::string> keys = {"a", "missing", "b"};
  Reply exist = c->Exist(keys);
  ASSERT_TRUE(exist.ok());
  ASSERT_EQ(exist.keys.size(), 3u);
  EXPECT_TRUE(exist.keys[0].exists);
  EXPECT_FALSE(exist.keys[1].exists);
  EXPECT_TRUE(exist.keys[2].exists);
  Reply removed = c->Remove(keys);
  EXPECT_EQ(Codes(removed), (std::vector<std::string>{"OK", "OBJECT_NOT_FOUND", "OK"}));
  EXPECT_FALSE(removed.keys[1].message.empty());
  KeyResult r;
  EXPECT_EQ(GetOne(*c, "a", 16, &r), "");
  EXPECT_EQ(r.code, ErrorCode::kObjectNotFound);
  EXPECT_FALSE(c->Exist(keys).keys[2].exists);
}

TEST(Standalone, RemoveAllRemovesEveryObjectAndCountsThem) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(PutAll(*c, {"x", "y", "z"}, {"1", "2", "3"}).ok());
  Reply all = c->RemoveAll();
  ASSERT_TRUE(all.ok()) << all.status.ToString();
  EXPECT_EQ(all.removed_count, 3u);
  EXPECT_TRUE(ListAll(*c, "", 100).empty());
}

TEST(Standalone, DuplicatePutAnswersObjectAlreadyExistsAndKeepsTheFirstValue) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(PutAll(*c, {"dup"}, {"first"}).keys.at(0).ok());
  Reply again = PutAll(*c, {"dup"}, {"second"});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.keys.at(0).code, ErrorCode::kObjectAlreadyExists);
  EXPECT_TRUE(again.keys.at(0).ok());  // callers treat "exists" as success
  EXPECT_EQ(GetOne(*c, "dup", 64), "first");
}

// 20 000 keys that all fail with key-specific messages make a completion larger than the 1 MiB
// completion ring: the work is done, so the client still gets every key's code, and one
// request-level line instead of 20 000 messages.
TEST(Standalone, ABatchWhoseMessagesOverflowTheCompletionRingKeepsEveryKeysCode) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent, 64 << 20);
  ASSERT_TRUE(c);
  std::vector<std::string> keys;
  std::vector<std::string> values;
  for (int i = 0; i < 20000; ++i) {
    keys.push_back("k/" + std::to_string(i));
    values.emplace_back("v");
  }
  Reply first = PutAll(*c, keys, values);
  ASSERT_TRUE(first.ok()) << first.status.ToString();
  Reply again = PutAll(*c, keys, values);
  ASSERT_TRUE(again.ok()) << again.status.ToString();
  ASSERT_EQ(again.keys.size(), keys.size());
  for (const KeyResult& k : again.keys) ASSERT_EQ(k.code, ErrorCode::kObjectAlreadyExists);
}

TEST(Standalone, UpsertReplacesTheValueInPlaceOrWithANewSize) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(PutAll(*c, {"u", "w"}, {Pattern("v1", 5000), Pattern("w1", 5000)}).ok());
  Reply same = PutAll(*c, {"u"}, {Pattern("v2", 5000)}, {}, /*upsert=*/true);
  EXPECT_EQ(Codes(same), std::vector<std::string>{"OK"});
  Reply bigger = PutAll(*c, {"w"}, {Pattern("w2", 70000)}, {}, /*upsert=*/true);
  EXPECT_EQ(Codes(bigger), std::vector<std::string>{"OK"});
  EXPECT_TRUE(SameBytes(GetOne(*c, "u", 8192), Pattern("v2", 5000)));
  EXPECT_TRUE(SameBytes(GetOne(*c, "w", 70000), Pattern("w2", 70000)));
  // The get above holds a read lease on "u": rewriting it now would change bytes under a reader.
  Reply busy = PutAll(*c, {"u"}, {Pattern("v3", 5000)}, {}, /*upsert=*/true);
  EXPECT_EQ(Codes(busy), std::vector<std::string>{"OBJECT_BUSY"});
  Reply fresh = PutAll(*c, {"new"}, {"n"}, {}, /*upsert=*/true);  // upsert of a new key stores it
  EXPECT_EQ(Codes(fresh), std::vector<std::string>{"OK"});
  EXPECT_EQ(GetOne(*c, "new", 8), "n");
}

TEST(Standalone, GetIntoATooSmallBufferIsBufferOutOfRangeWithTheLengthNeeded) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(PutAll(*c, {"big", "fits"}, {Pattern("big", 10000), "ok"}).ok());
  auto small = c->Allocate(100);
  auto enough = c->Allocate(100);
  ASSERT_TRUE(small.ok() && enough.ok());
  std::vector<std::string> keys = {"big", "fits"};
  std::vector<const ArenaBuffer*> targets = {&*small, &*enough};
  Reply r = c->Get(keys, targets);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.keys[0].code, ErrorCode::kBufferOutOfRange);
  EXPECT_EQ(r.keys[0].length, 10000u);
  EXPECT_NE(r.keys[0].message.find("10000"), std::string::npos) << r.keys[0].message;
  EXPECT_EQ(r.keys[1].code, ErrorCode::kOk);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(enough->data()), r.keys[1].length), "ok");
}

TEST(Standalone, PerKeyResultsAndSessionIdsFollowTheKeysOriginalPositions) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(PutAll(*c, {"k0", "k2"}, {"old0", "old2"}, {"first-0", "first-2"}).ok());
  // Keys 0 and 2 exist: the batch the master ends is the subset {1, 3}, whose tags must be
  // those of positions 1 and 3, not of the subset's positions 0 and 1.
  Reply r = PutAll(*c, {"k0", "k1", "k2", "k3"}, {"a", "b", "c", "d"},
                   {"sess-0", "sess-1", "sess-2", "séance-3"});
  ASSERT_TRUE(r.ok()) << r.status.ToString();
  EXPECT_EQ(Codes(r), (std::vector<std::string>{"OBJECT_ALREADY_EXISTS", "OK",
                                                "OBJECT_ALREADY_EXISTS", "OK"}));
  auto listed = ListAll(*c, "k", 100);
  ASSERT_EQ(listed.size(), 4u);
  EXPECT_EQ(listed["k0"].session_id, "first-0");  // a duplicate keeps the existing tag
  EXPECT_EQ(listed["k1"].session_id, "sess-1");
  EXPECT_EQ(listed["k2"].session_id, "first-2");
  EXPECT_EQ(listed["k3"].session_id, "séance-3");
  EXPECT_EQ(GetOne(*c, "k1", 8), "b");
  EXPECT_EQ(GetOne(*c, "k3", 8), "d");
  EXPECT_EQ(GetOne(*c, "k0", 8), "old0");
}

TEST(Standalone, ListPagesThroughEveryKeyWithThePrefixExactlyOnce) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  std::vector<std::string> keys, values;
  for (int i = 0; i < 300; ++i) keys.push_back("a/" + std::to_string(i));
  for (int i = 0; i < 50; ++i) keys.push_back("b/" + std::to_string(i));
  values.assign(keys.size(), "v");
  ASSERT_TRUE(PutAll(*c, keys, values).ok());
  auto a = ListAll(*c, "a/", 64);
  EXPECT_EQ(a.size(), 300u);
  for (const auto& [key, k] : a) {
    EXPECT_EQ(key.rfind("a/", 0), 0u) << key;
    EXPECT_EQ(k.size, 1u);
  }
  EXPECT_EQ(ListAll(*c, "", 1000).size(), 350u);
  EXPECT_TRUE(ListAll(*c, "zzz", 10).empty());
}

TEST(Standalone, RequestsOfSeveralClientsTravelInOneMasterBatch) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 6; ++i) {
    clients.push_back(Connect(agent, 1 << 20, "batching-" + std::to_string(i)));
    ASSERT_TRUE(clients.back());
  }
  // Every request is on its ring before the agent looks: one pass sees all of them. A SIGSTOP
  // can land in the middle of a pass (the agent wakes for its timers), which then sees the rings
  // it had not read yet and leaves the others to the next pass: two batches. So the round is
  // tried a few times, and one of them must carry all six requests in one batch.
  uint64_t fewest_batches = UINT64_MAX;
  for (int round = 0; round < 5 && fewest_batches != 1; ++round) {
    const Reply before = clients[0]->Stat();
    ASSERT_TRUE(before.ok()) << before.status.ToString();
    agent.Signal(SIGSTOP);
    ASSERT_TRUE(WaitUntil([&] { return IsStopped(agent.pid()); }));
    std::vector<std::vector<std::string>> keys(6), values(6);
    std::vector<std::vector<Value>> vs(6);
    std::vector<PendingCall> calls;
    for (int i = 0; i < 6; ++i) {
      const std::string prefix = "r" + std::to_string(round) + "c" + std::to_string(i);
      keys[i] = {prefix + "-a", prefix + "-b"};
      values[i] = {Pattern(keys[i][0], 100), Pattern(keys[i][1], 200)};
      for (const auto& v : values[i]) vs[i].emplace_back(std::string_view(v));
      calls.push_back(clients[i]->SubmitPut(keys[i], vs[i]));
    }
    agent.Signal(SIGCONT);
    for (auto& call : calls) {
      Reply r = call.Wait();
      EXPECT_EQ(Codes(r), (std::vector<std::string>{"OK", "OK"})) << r.status.ToString();
    }
    const Reply after = clients[0]->Stat();
    EXPECT_EQ(CounterOf(after, "agent.requests.put") - CounterOf(before, "agent.requests.put"), 6u);
    EXPECT_EQ(CounterOf(after, "agent.keys.put") - CounterOf(before, "agent.keys.put"), 12u);
    fewest_batches = std::min<uint64_t>(fewest_batches, CounterOf(after, "agent.batches.put") -
                                                            CounterOf(before, "agent.batches.put"));
    for (int i = 0; i < 6; ++i) {
      EXPECT_TRUE(SameBytes(GetOne(*clients[(i + 1) % 6], keys[i][1], 256), values[i][1]));
    }
  }
  EXPECT_EQ(fewest_batches, 1u) << "six stalled requests never travelled in one master batch";
}

// The SDK sends each call's deadline; work the agent reaches after it is not done, so a call
// that timed out while the agent was stalled does not happen behind the caller's back.
TEST(Standalone, CallsWhoseDeadlinePassedWhileTheAgentStalledAreNotCarriedOut) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_EQ(Codes(PutAll(*c, {"kept"}, {"kept-value"})), std::vector<std::string>{"OK"});
  auto target = c->Allocate(64);
  ASSERT_TRUE(target.ok());
  std::memset(target->data(), 0xEE, target->size());

  agent.Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntil([&] { return IsStopped(agent.pid()); }));
  CallOptions quick;
  quick.timeout = std::chrono::milliseconds(100);
  const std::string late_value = "late-value";
  std::vector<std::string> late = {"late"}, kept = {"kept"};
  std::vector<Value> values = {Value(std::string_view(late_value))};
  std::vector<const ArenaBuffer*> targets = {&*target};
  EXPECT_EQ(c->Put(late, values, quick).status.code(), ErrorCode::kTimeout);
  EXPECT_EQ(c->Get(kept, targets, quick).status.code(), ErrorCode::kTimeout);
  agent.Signal(SIGCONT);

  // Both requests reach the agent now, after their deadlines.
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.expired_keys") == 2; }));
  Reply exist = c->Exist(late);
  ASSERT_EQ(exist.keys.size(), 1u);
  EXPECT_FALSE(exist.keys[0].exists) << "a put that timed out was stored";
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(target->data()), 64), std::string(64, '\xEE'))
      << "a get that timed out wrote into its buffer";
  EXPECT_EQ(GetOne(*c, "kept", 64), "kept-value");
}

TEST(Standalone, StatReportsTheAgentsAndTheMastersCounters) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(PutAll(*c, {"s1", "s2"}, {Pattern("s1", 1000), Pattern("s2", 3000)}).ok());
  Reply st = c->Stat();
  ASSERT_TRUE(st.ok()) << st.status.ToString();
  std::string link;
  EXPECT_EQ(CounterOf(st, "agent.master_link", &link), 1u);
  EXPECT_NE(link.find("standalone"), std::string::npos) << link;
  EXPECT_EQ(CounterOf(st, "agent.clients"), 1u);
  EXPECT_EQ(CounterOf(st, "agent.bytes_to_pool"), 4000u);
  EXPECT_EQ(CounterOf(st, "agent.pool_bytes"), 64u << 20);
  EXPECT_EQ(CounterOf(st, "master.keys"), 2u);
  EXPECT_EQ(CounterOf(st, "master.agents"), 1u);
}

TEST(Standalone, EventsOnTheAgentSocketCarryEachWritersSession) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(PutAll(*c, {"e1", "e2", "e3"}, {"a", "b", "c"}, {"sess-A", "会话-B", ""}).ok());
  const SeenEvents seen = CollectStored(agent.run_dir(), {"e1", "e2", "e3"});
  EXPECT_TRUE(seen.started_with_clear);
  ASSERT_EQ(seen.stored.size(), 3u);
  EXPECT_EQ(seen.stored.at("e1").session_id, "sess-A");
  EXPECT_EQ(seen.stored.at("e2").session_id, "会话-B");
  EXPECT_FALSE(seen.stored.at("e3").session_id.has_value());  // untagged: no session_id key
  EXPECT_EQ(seen.stored.at("e1").medium, "EXTERNAL");
}

TEST(Standalone, SecondAgentOnTheSameRunDirIsRefusedAndTheFirstKeepsItsEventSocket) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  ProcessGuard second(fork());
  if (second.pid() == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    execl(KVAGENT_BINARY, KVAGENT_BINARY, "--run-dir", agent.run_dir().c_str(), "--pool-size",
          "64MiB", static_cast<char*>(nullptr));
    _exit(127);
  }
  const int status = second.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  ASSERT_TRUE(PutAll(*c, {"still-mine"}, {"v"}, {"first-agent"}).ok());
  const SeenEvents seen = CollectStored(agent.run_dir(), {"still-mine"});
  ASSERT_EQ(seen.stored.count("still-mine"), 1u);
  EXPECT_EQ(seen.stored.at("still-mine").session_id, "first-agent");
}

TEST(Standalone, FourClientsPuttingConcurrentlyReadEveryKeyBack) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&, w] {
      auto c = Connect(agent, 16 << 20, "writer-" + std::to_string(w));
      if (!c) return void(++failures);
      for (int i = 0; i < 100; ++i) {
        const std::string key = "w" + std::to_string(w) + "/" + std::to_string(i);
        const std::string value = Pattern(key, 1000 + 997 * ((i * 7 + w) % 40));
        Reply r = PutAll(*c, {key}, {value}, {"writer-" + std::to_string(w)});
        if (!r.ok() || r.keys[0].code != ErrorCode::kOk) ++failures;
      }
    });
  }
  for (auto& t : writers) t.join();
  ASSERT_EQ(failures.load(), 0);
  auto c = Connect(agent);
  ASSERT_TRUE(c);
  for (int w = 0; w < 4; ++w) {
    for (int i = 0; i < 100; ++i) {
      const std::string key = "w" + std::to_string(w) + "/" + std::to_string(i);
      ASSERT_TRUE(
          SameBytes(GetOne(*c, key, 64 << 10), Pattern(key, 1000 + 997 * ((i * 7 + w) % 40))))
          << key;
    }
  }
}

}  // namespace
}  // namespace kvagent::testing

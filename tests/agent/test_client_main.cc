// kvagent_test_client: an SDK client process for the agent and pipeline tests.
//   ping-loop RUN_DIR               connect, print "ready", ping until killed (exit 3 on failure)
//   stress RUN_DIR SEED ITERATIONS THREADS
//                                   randomized valid and invalid calls from several threads
//                                   against a degraded agent (no reachable master); exit 0 when
//                                   every reply was the expected one
//   put-loop RUN_DIR PREFIX SIZE    puts PREFIX-0, PREFIX-1, ... (Pattern bytes of SIZE) four at
//                                   a time, printing "ready" after the first; until killed
//   put-async RUN_DIR PREFIX SIZE COUNT REPLICAS
//                                   submits COUNT puts of PREFIX-i at once, prints "submitted"
//                                   and waits to be killed without collecting the replies
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvagent/client.h"
#include "value_pattern.h"

namespace {

using kvagent::ErrorCode;

std::atomic<int> failures{0};

void Expect(bool ok, const char* what, const kvagent::Reply& r) {
  if (ok) return;
  if (failures.fetch_add(1) < 10) {
    std::fprintf(stderr, "unexpected reply for %s: %s\n", what, r.status.ToString().c_str());
  }
}

bool AllKeys(const kvagent::Reply& r, size_t n, ErrorCode code) {
  if (r.keys.size() != n || r.status.code() != code) return false;
  for (const auto& k : r.keys) {
    if (k.code != code || k.message.empty()) return false;
  }
  return true;
}

std::string RandomKey(std::mt19937_64& rng) {
  std::string key = "key-";
  const size_t n = 1 + rng() % 100;
  for (size_t i = 0; i < n; ++i) key.push_back(static_cast<char>('a' + rng() % 26));
  return key;
}

// Puts `raw` (copied by the SDK) under every key, tagged with `sessions`.
kvagent::Reply PutRaw(kvagent::Client& client, const std::vector<std::string>& keys,
                      const std::vector<std::string>& sessions, const std::string& raw) {
  std::vector<kvagent::Value> values(keys.size(), kvagent::Value(std::string_view(raw)));
  kvagent::CallOptions o;
  o.session_ids = sessions;
  return client.Put(keys, values, o);
}

void StressThread(kvagent::Client& client, uint64_t seed, int iterations) {
  std::mt19937_64 rng(seed);
  for (int it = 0; it < iterations; ++it) {
    const size_t n = 1 + rng() % 4;
    std::vector<std::string> keys;
    std::vector<std::string> sessions;
    for (size_t i = 0; i < n; ++i) {
      keys.push_back(RandomKey(rng));
      sessions.push_back(rng() % 3 == 0 ? "" : "session-" + std::to_string(rng() % 1000));
    }
    std::string raw(1 + rng() % 2000, 'v');
    switch (rng() % 7) {
      case 0: {
        kvagent::Reply r = client.Ping();
        Expect(r.ok() && r.keys.empty(), "Ping", r);
        break;
      }
      case 1: {
        kvagent::Reply r = PutRaw(client, keys, sessions, raw);
        Expect(AllKeys(r, n, ErrorCode::kMasterUnavailable), "Put(raw)", r);
        break;
      }
      case 2: {
        auto buffer = client.Allocate(raw.size());
        if (!buffer.ok()) {
          std::fprintf(stderr, "Allocate: %s\n", buffer.status().ToString().c_str());
          failures.fetch_add(1);
          break;
        }
        std::memcpy(buffer->data(), raw.data(), raw.size());
        std::vector<kvagent::Value> values(n, kvagent::Value(*buffer));
        kvagent::Reply r = client.Upsert(keys, values);
        Expect(AllKeys(r, n, ErrorCode::kMasterUnavailable), "Upsert(arena)", r);
        break;
      }
      case 3: {
        sessions[rng() % n] = std::string(257, 's');
        kvagent::Reply r = PutRaw(client, keys, sessions, raw);
        Expect(AllKeys(r, n, ErrorCode::kInvalidParams), "Put(257-byte session)", r);
        break;
      }
      case 4: {
        kvagent::Reply r = client.Exist(keys);
        Expect(AllKeys(r, n, ErrorCode::kMasterUnavailable), "Exist", r);
        break;
      }
      case 5: {
        std::vector<kvagent::PendingCall> calls;
        for (int i = 0; i < 16; ++i) calls.push_back(client.SubmitPing());
        for (auto& c : calls) {
          kvagent::Reply r = c.Wait();
          Expect(r.ok(), "pipelined Ping", r);
        }
        break;
      }
      case 6: {
        std::vector<kvagent::ArenaBuffer> buffers;
        std::vector<const kvagent::ArenaBuffer*> targets;
        for (size_t i = 0; i < n; ++i) buffers.push_back(client.Allocate(4096).value());
        for (auto& b : buffers) targets.push_back(&b);
        kvagent::Reply r = client.Get(keys, targets);
        Expect(AllKeys(r, n, ErrorCode::kMasterUnavailable), "Get", r);
        break;
      }
    }
  }
}

// Writes values as fast as the agent takes them, several in flight, until the process dies.
int PutLoop(kvagent::Client& client, const std::string& prefix, size_t size) {
  constexpr int kInFlight = 4;
  std::vector<std::string> keys(kInFlight);
  std::vector<kvagent::ArenaBuffer> buffers;
  for (int i = 0; i < kInFlight; ++i) {
    auto b = client.Allocate(size);
    if (!b.ok()) return 5;
    buffers.push_back(std::move(*b));
  }
  for (uint64_t round = 0;; ++round) {
    std::vector<kvagent::PendingCall> calls;
    std::vector<std::vector<std::string>> call_keys(kInFlight);
    std::vector<std::vector<kvagent::Value>> values(kInFlight);
    for (int i = 0; i < kInFlight; ++i) {
      call_keys[i] = {prefix + "-" + std::to_string(round * kInFlight + i)};
      const std::string bytes = kvagent::testing::Pattern(call_keys[i][0], size);
      std::memcpy(buffers[i].data(), bytes.data(), size);
      values[i] = {kvagent::Value(buffers[i])};
      calls.push_back(client.SubmitPut(call_keys[i], values[i]));
    }
    for (auto& c : calls) {
      if (!c.Wait().ok()) return 3;
    }
    if (round == 0) {
      std::printf("ready\n");
      std::fflush(stdout);
    }
  }
}

// Submits `count` puts and leaves them in flight.
int PutAsync(kvagent::Client& client, const std::string& prefix, size_t size, int count,
             int replicas) {
  std::vector<std::vector<std::string>> keys(count);
  std::vector<std::vector<kvagent::Value>> values(count);
  std::vector<kvagent::ArenaBuffer> buffers;
  std::vector<kvagent::PendingCall> calls;
  kvagent::CallOptions options;
  options.write.replica_count = static_cast<uint8_t>(replicas);
  for (int i = 0; i < count; ++i) {
    keys[i] = {prefix + "-" + std::to_string(i)};
    auto b = client.Allocate(size);
    if (!b.ok()) return 5;
    const std::string bytes = kvagent::testing::Pattern(keys[i][0], size);
    std::memcpy(b->data(), bytes.data(), size);
    buffers.push_back(std::move(*b));
    values[i] = {kvagent::Value(buffers.back())};
    calls.push_back(client.SubmitPut(keys[i], values[i], options));
  }
  std::printf("submitted\n");
  std::fflush(stdout);
  while (true) pause();
}

kvagent::Result<std::unique_ptr<kvagent::Client>> Connect(const char* run_dir) {
  kvagent::ClientOptions options;
  options.run_dir = run_dir;
  options.arena_bytes = 64 << 20;
  options.call_timeout = std::chrono::milliseconds(30000);
  return kvagent::Client::Connect(options);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: kvagent_test_client ping-loop|stress|put-loop|put-async RUN_DIR ...\n");
    return 2;
  }
  const std::string mode = argv[1];
  auto client = Connect(argv[2]);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  if (mode == "ping-loop") {
    std::printf("ready\n");
    std::fflush(stdout);
    while (true) {
      kvagent::Reply r = (*client)->Ping();
      if (!r.ok()) return 3;
    }
  }
  if (mode == "stress" && argc == 6) {
    const uint64_t seed = std::stoull(argv[3]);
    const int iterations = std::stoi(argv[4]);
    const int threads = std::stoi(argv[5]);
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back(StressThread, std::ref(**client), seed * 1000 + t, iterations);
    }
    for (auto& w : workers) w.join();
    return failures.load() == 0 ? 0 : 4;
  }
  if (mode == "put-loop" && argc == 5) return PutLoop(**client, argv[3], std::stoull(argv[4]));
  if (mode == "put-async" && argc == 7) {
    return PutAsync(**client, argv[3], std::stoull(argv[4]), std::stoi(argv[5]),
                    std::stoi(argv[6]));
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}

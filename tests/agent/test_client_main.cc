// kvagent_test_client: an SDK client process for the agent tests.
//   ping-loop RUN_DIR               connect, print "ready", ping until killed (exit 3 on failure)
//   stress RUN_DIR SEED ITERATIONS THREADS
//                                   randomized valid and invalid calls from several threads;
//                                   exit 0 when every reply was the expected one
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvagent/client.h"

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

kvagent::Result<std::unique_ptr<kvagent::Client>> Connect(const char* run_dir) {
  kvagent::ClientOptions options;
  options.run_dir = run_dir;
  options.arena_bytes = 8 << 20;
  options.call_timeout = std::chrono::milliseconds(30000);
  return kvagent::Client::Connect(options);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: kvagent_test_client ping-loop|stress RUN_DIR ...\n");
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
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}

// kvctl bench: how fast this node's agent stores and reads values, measured through the SDK the
// way an engine uses it (one client, zero-copy arena buffers, one request in flight).
//
// Puts fresh keys under a private prefix for --seconds (or until the keys would fill half of
// the node pool, so eviction does not become the thing measured), then gets them back in the
// same batches for as long, then removes every key it wrote. Prints one line per phase:
// keys/s, GB/s and the request latency p50/p99.
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "kvagent/common/format.h"
#include "kvctl_agent.h"
#include "kvctl_commands.h"

namespace kvagent::kvctl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr CommandSpec kBench{
    "bench",
    "bench [--op put|get|both] [--value-bytes N] [--keys-per-request N] [--seconds S] "
    "[--session ID]",
    "Measures puts and gets of this node's agent through the SDK: fresh keys under\n"
    "kvctl-bench/<pid>/, one request in flight, values in the client's arena (zero-copy).\n"
    "Stops a put phase early when its keys would fill half of the node pool. Removes every key\n"
    "it wrote before it exits. Prints keys/s, GB/s and the request latency p50/p99 per phase.",
    0, 0};

struct BenchOptions {
  std::string op = "both";
  uint64_t value_bytes = 4096;
  uint64_t keys_per_request = 128;
  double seconds = 3;
  std::string session;
};

struct Phase {
  uint64_t keys = 0;
  uint64_t requests = 0;
  double seconds = 0;
  std::vector<double> latencies_us;
};

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  const size_t i = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  std::nth_element(values.begin(), values.begin() + i, values.end());
  return values[i];
}

void PrintPhase(std::ostream& out, const char* name, const Phase& p, const BenchOptions& o) {
  const double keys_per_s = p.seconds > 0 ? p.keys / p.seconds : 0;
  char line[256];
  std::snprintf(line, sizeof(line),
                "%s: %llu x %s per request: %.0f keys/s, %.2f GB/s, request p50 %.1f us, "
                "p99 %.1f us (%llu requests in %.2f s)\n",
                name, static_cast<unsigned long long>(o.keys_per_request),
                FormatBytes(o.value_bytes).c_str(), keys_per_s, keys_per_s * o.value_bytes / 1e9,
                Percentile(p.latencies_us, 0.50), Percentile(p.latencies_us, 0.99),
                static_cast<unsigned long long>(p.requests), p.seconds);
  out << line;
}

// The node pool's size from the agent's counters (0 when it does not say).
uint64_t PoolBytes(Client& client, const GlobalOptions& global) {
  Reply stat = client.Stat(global.timeout);
  for (const Counter& c : stat.counters) {
    if (c.name == "agent.pool_bytes") return c.value;
  }
  return 0;
}

class Bench {
 public:
  Bench(Client& client, const GlobalOptions& global, const BenchOptions& o)
      : client_(client), global_(global), o_(o) {
    prefix_ = "kvctl-bench/" + std::to_string(getpid()) + "/";
    if (!o_.session.empty()) sessions_.assign(o_.keys_per_request, o_.session);
  }

  Status Allocate() {
    for (uint64_t i = 0; i < o_.keys_per_request; ++i) {
      auto buffer = client_.Allocate(o_.value_bytes);
      if (!buffer.ok()) return buffer.status();
      std::memset(buffer->data(), static_cast<int>('a' + i % 26), buffer->size());
      buffers_.push_back(std::move(*buffer));
    }
    return Status::Ok();
  }

  // Puts batches of fresh keys until the time is up or `max_keys` are stored.
  Result<Phase> Put(uint64_t max_keys) {
    std::vector<Value> values;
    for (const ArenaBuffer& b : buffers_) values.emplace_back(b);
    CallOptions call = CallWithTimeout(global_);
    call.session_ids = sessions_;
    Phase phase;
    std::vector<std::string> keys(o_.keys_per_request);
    const auto start = Clock::now();
    const auto end = start + std::chrono::duration<double>(o_.seconds);
    while (Clock::now() < end && written_ + o_.keys_per_request <= max_keys) {
      for (std::string& k : keys) k = prefix_ + std::to_string(written_++);
      Status st = Timed(&phase, keys.size(), [&] { return client_.Put(keys, values, call); });
      if (!st.ok()) return st;
    }
    phase.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return phase;
  }

  // Gets the written keys back in the same batches, round and round, until the time is up.
  Result<Phase> Get() {
    std::vector<const ArenaBuffer*> targets;
    for (const ArenaBuffer& b : buffers_) targets.push_back(&b);
    const CallOptions call = CallWithTimeout(global_);
    Phase phase;
    std::vector<std::string> keys(o_.keys_per_request);
    const uint64_t batches = written_ / o_.keys_per_request;
    if (batches == 0) return phase;
    const auto start = Clock::now();
    const auto end = start + std::chrono::duration<double>(o_.seconds);
    for (uint64_t b = 0; Clock::now() < end; b = (b + 1) % batches) {
      for (uint64_t i = 0; i < keys.size(); ++i) {
        keys[i] = prefix_ + std::to_string(b * o_.keys_per_request + i);
      }
      Status st = Timed(&phase, keys.size(), [&] { return client_.Get(keys, targets, call); });
      if (!st.ok()) return st;
    }
    phase.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return phase;
  }

  // Removes every key written (force: the gets left read leases). Returns how many went.
  uint64_t RemoveAll() {
    CallOptions call = CallWithTimeout(global_);
    call.force = true;
    uint64_t removed = 0;
    std::vector<std::string> keys;
    for (uint64_t i = 0; i < written_; ++i) {
      keys.push_back(prefix_ + std::to_string(i));
      if (keys.size() == 1024 || i + 1 == written_) {
        Reply r = client_.Remove(keys, call);
        for (const KeyResult& k : r.keys) removed += k.code == ErrorCode::kOk;
        keys.clear();
      }
    }
    return removed;
  }

  const std::string& prefix() const { return prefix_; }
  uint64_t written() const { return written_; }

 private:
  // Runs one request, records its latency and, when every key succeeded, counts its keys.
  template <typename Call>
  static Status Timed(Phase* phase, size_t keys, Call&& call) {
    const auto t0 = Clock::now();
    const Reply reply = call();
    phase->latencies_us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (Status st = FirstFailure(reply); !st.ok()) return st;
    phase->keys += keys;
    ++phase->requests;
    return Status::Ok();
  }

  Client& client_;
  const GlobalOptions& global_;
  const BenchOptions& o_;
  std::string prefix_;
  std::vector<std::string> sessions_;
  std::vector<ArenaBuffer> buffers_;
  uint64_t written_ = 0;
};

}  // namespace

int BenchCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
                 std::ostream& err) {
  BenchOptions o;
  FlagSet flags("kvctl bench", std::string(kBench.summary));
  flags.String("op", &o.op, "put, get (puts first, unmeasured) or both");
  flags.Size("value-bytes", &o.value_bytes, "bytes per value");
  flags.Uint("keys-per-request", &o.keys_per_request, "keys in each put or get");
  flags.Double("seconds", &o.seconds, "length of each phase");
  flags.String("session", &o.session, "tag every put with this session ID (default: untagged)");
  std::vector<std::string> positionals;
  if (auto exit = ParseCommandLine(kBench, &flags, argc, argv, &positionals, out, err)) {
    return *exit;
  }
  if (o.op != "put" && o.op != "get" && o.op != "both") {
    return ReportUsage(err, kBench, "--op must be put, get or both");
  }
  if (o.value_bytes == 0 || o.keys_per_request == 0 || o.keys_per_request > 65536 ||
      o.seconds <= 0) {
    return ReportUsage(err, kBench,
                       "--value-bytes, --keys-per-request (at most 65536) and --seconds must be "
                       "positive");
  }
  const uint64_t arena = o.value_bytes * o.keys_per_request + (16ULL << 20);
  auto client = ConnectAgent(global, arena);
  if (!client.ok()) return ReportFailure(err, "bench", client.status());
  Bench bench(**client, global, o);
  if (Status st = bench.Allocate(); !st.ok()) return ReportFailure(err, "bench", st);
  const uint64_t pool = PoolBytes(**client, global);
  const uint64_t max_keys = pool == 0 ? UINT64_MAX : pool / 2 / o.value_bytes;
  if (max_keys < o.keys_per_request) {
    return ReportFailure(
        err, "bench",
        Status(ErrorCode::kNoSpace, "one request's values (" +
                                        FormatBytes(o.value_bytes * o.keys_per_request) +
                                        ") exceed half of the node pool (" + FormatBytes(pool) +
                                        "); lower --value-bytes or "
                                        "--keys-per-request"));
  }
  int exit = kExitOk;
  auto put = bench.Put(max_keys);
  if (!put.ok()) {
    exit = ReportFailure(err, "bench: put", put.status());
  } else {
    if (o.op != "get") PrintPhase(out, "put", *put, o);
    if (o.op != "put") {
      auto get = bench.Get();
      if (!get.ok()) {
        exit = ReportFailure(err, "bench: get", get.status());
      } else {
        PrintPhase(out, "get", *get, o);
      }
    }
  }
  const uint64_t removed = bench.RemoveAll();
  out << "removed " << removed << " of " << bench.written() << " keys under " << bench.prefix()
      << "\n";
  return exit;
}

}  // namespace kvagent::kvctl

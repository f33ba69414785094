// e2e_client: an SDK client process for the end-to-end tests (tests/e2e/*_test.cc and
// tests/python/test_e2e_*.py), used the way an engine uses the SDK. Values are Pattern bytes
// (value_pattern.h) of ValueSize(i, SIZE) bytes, so any reader can check them.
//
//   write RUN_DIR PREFIX COUNT SIZE SESSION [BATCH]
//       puts PREFIX-0 .. PREFIX-(COUNT-1), BATCH keys per request (default 8), every key tagged
//       SESSION ("" = untagged), values written in place in arena buffers; prints
//       "stored COUNT"; exit 0 iff every key answered OK.
//   check RUN_DIR PREFIX COUNT SIZE
//       gets every key back and compares its bytes; prints "checked COUNT"; exit 0 iff all match.
//   remove RUN_DIR KEY...
//       removes the keys (one request); exit 0 iff every key answered OK.
//   churn RUN_DIR PREFIX SIZE [--master-may-fail]
//       rounds of (put PREFIX-r, get it back, compare, remove it) until its standard input
//       reaches EOF (so it can run for long without filling the pool).
//       Prints "ready" after the first good round; with --master-may-fail, "unavailable" when
//       a call answers MASTER_UNAVAILABLE after a good round (or first) and "recovered" at the
//       first good round after that; a "status" line on its standard input is answered with
//       "good N" (good rounds so far). At the end prints "rounds R ok O unavailable U" and exits 0
//       iff every call gave an allowed answer: OK (a get: with exactly the bytes put), or
//       MASTER_UNAVAILABLE with --master-may-fail. Anything else (another code, a TIMEOUT, short or
//       wrong bytes) is printed on stderr and gives exit 4.
// Exit 1: cannot connect; 2: bad usage.
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "e2e_values.h"
#include "kvagent/client.h"
#include "value_pattern.h"

namespace {

using kvagent::ErrorCode;
using kvagent::testing::Pattern;
using kvagent::testing::ValueSize;

std::string KeyOf(const std::string& prefix, uint64_t i) {
  return prefix + "-" + std::to_string(i);
}

int Write(kvagent::Client& c, const std::string& prefix, uint64_t count, size_t size,
          const std::string& session, uint64_t batch) {
  for (uint64_t first = 0; first < count; first += batch) {
    const uint64_t n = std::min(batch, count - first);
    std::vector<std::string> keys, sessions(n, session);
    std::vector<kvagent::ArenaBuffer> buffers;
    std::vector<kvagent::Value> values;
    for (uint64_t i = first; i < first + n; ++i) {
      keys.push_back(KeyOf(prefix, i));
      const std::string bytes = Pattern(keys.back(), ValueSize(i, size));
      auto b = c.Allocate(bytes.size());
      if (!b.ok()) {
        std::fprintf(stderr, "allocate: %s\n", b.status().ToString().c_str());
        return 3;
      }
      std::memcpy(b->data(), bytes.data(), bytes.size());
      buffers.push_back(std::move(*b));
    }
    for (const auto& b : buffers) values.emplace_back(b);
    kvagent::CallOptions o;
    if (!session.empty()) o.session_ids = sessions;
    const kvagent::Reply r = c.Put(keys, values, o);
    for (uint64_t i = 0; i < n; ++i) {
      if (i >= r.keys.size() || r.keys[i].code != ErrorCode::kOk) {
        std::fprintf(stderr, "put %s: %s\n", keys[i].c_str(),
                     i < r.keys.size() ? r.keys[i].message.c_str() : r.status.ToString().c_str());
        return 3;
      }
    }
  }
  std::printf("stored %llu\n", static_cast<unsigned long long>(count));
  return 0;
}

// Reads `key` into `buffer`; an empty string when it holds exactly `want`, else what differs.
std::string CheckOne(kvagent::Client& c, const std::string& key, const std::string& want,
                     const kvagent::ArenaBuffer& buffer, ErrorCode* code) {
  std::vector<std::string> keys = {key};
  std::vector<const kvagent::ArenaBuffer*> targets = {&buffer};
  const kvagent::Reply r = c.Get(keys, targets);
  *code = r.keys.empty() ? r.status.code() : r.keys[0].code;
  if (*code != ErrorCode::kOk) {
    return "get " + key + ": " + (r.keys.empty() ? r.status.ToString() : r.keys[0].message);
  }
  if (r.keys[0].length != want.size()) {
    return "get " + key + ": " + std::to_string(r.keys[0].length) + " bytes, want " +
           std::to_string(want.size());
  }
  if (std::memcmp(buffer.data(), want.data(), want.size()) != 0) {
    return "get " + key + ": other bytes than were put";
  }
  return "";
}

int Check(kvagent::Client& c, const std::string& prefix, uint64_t count, size_t size) {
  auto buffer = c.Allocate(size);
  if (!buffer.ok()) return 3;
  for (uint64_t i = 0; i < count; ++i) {
    const std::string key = KeyOf(prefix, i);
    ErrorCode code;
    const std::string bad = CheckOne(c, key, Pattern(key, ValueSize(i, size)), *buffer, &code);
    if (!bad.empty()) {
      std::fprintf(stderr, "%s\n", bad.c_str());
      return 3;
    }
  }
  std::printf("checked %llu\n", static_cast<unsigned long long>(count));
  return 0;
}

int RemoveKeys(kvagent::Client& c, std::vector<std::string> keys) {
  const kvagent::Reply r = c.Remove(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i >= r.keys.size() || r.keys[i].code != ErrorCode::kOk) {
      std::fprintf(stderr, "remove %s: %s\n", keys[i].c_str(),
                   i < r.keys.size() ? r.keys[i].message.c_str() : r.status.ToString().c_str());
      return 3;
    }
  }
  return 0;
}

// Reads what stdin has without blocking: true once it is closed; each "status" line asks for a
// "good N" line (the rounds that succeeded so far).
bool InputClosed(uint64_t good) {
  pollfd p = {0, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char buf[64];
  const ssize_t n = read(0, buf, sizeof(buf));
  if (n <= 0) return true;
  for (ssize_t i = 0; i < n; ++i) {
    if (buf[i] == '\n') {
      std::printf("good %llu\n", static_cast<unsigned long long>(good));
      std::fflush(stdout);
    }
  }
  return false;
}

class Churn {
 public:
  Churn(kvagent::Client& c, bool master_may_fail) : c_(c), master_may_fail_(master_may_fail) {}

  int Run(const std::string& prefix, size_t size) {
    auto buffer = c_.Allocate(size);
    auto target = c_.Allocate(size);
    if (!buffer.ok() || !target.ok()) return 3;
    for (uint64_t round = 0; !InputClosed(ok_); ++round) {
      const std::string key = KeyOf(prefix, round);
      const std::string bytes = Pattern(key, size);
      std::memcpy(buffer->data(), bytes.data(), size);
      std::vector<std::string> keys = {key};
      std::vector<kvagent::Value> values = {kvagent::Value(*buffer)};
      const kvagent::Reply put = c_.Put(keys, values);
      const ErrorCode put_code = put.keys.empty() ? put.status.code() : put.keys[0].code;
      bool good = false;
      if (put_code == ErrorCode::kOk) {
        ErrorCode get_code;
        const std::string bad = CheckOne(c_, key, bytes, *target, &get_code);
        good = bad.empty() && Remove(key);
        if (!bad.empty() && !Allowed(get_code)) Fail(bad);
      } else if (!Allowed(put_code)) {
        Fail("put " + key + ": " +
             (put.keys.empty() ? put.status.ToString() : put.keys[0].message));
      }
      ++rounds_;
      if (good) Good();
    }
    std::printf("rounds %llu ok %llu unavailable %llu\n", static_cast<unsigned long long>(rounds_),
                static_cast<unsigned long long>(ok_),
                static_cast<unsigned long long>(unavailable_));
    return failures_ == 0 ? 0 : 4;
  }

 private:
  // Removes `key` (forced: our get holds a read lease); true when it answered OK.
  bool Remove(const std::string& key) {
    std::vector<std::string> keys = {key};
    kvagent::CallOptions force;
    force.force = true;
    const kvagent::Reply r = c_.Remove(keys, force);
    const ErrorCode code = r.keys.empty() ? r.status.code() : r.keys[0].code;
    if (code == ErrorCode::kOk) return true;
    if (!Allowed(code)) {
      Fail("remove " + key + ": " + (r.keys.empty() ? r.status.ToString() : r.keys[0].message));
    }
    return false;
  }
  bool Allowed(ErrorCode code) {
    if (code != ErrorCode::kMasterUnavailable || !master_may_fail_) return false;
    ++unavailable_;
    if (!waiting_for_recovery_) Say("unavailable");
    waiting_for_recovery_ = true;
    return true;
  }
  void Good() {
    if (ok_++ == 0) Say("ready");
    if (waiting_for_recovery_) Say("recovered");
    waiting_for_recovery_ = false;
  }
  void Fail(const std::string& what) {
    if (failures_++ < 10) std::fprintf(stderr, "%s\n", what.c_str());
  }
  static void Say(const char* line) {
    std::printf("%s\n", line);
    std::fflush(stdout);
  }

  kvagent::Client& c_;
  const bool master_may_fail_;
  uint64_t rounds_ = 0, ok_ = 0, unavailable_ = 0, failures_ = 0;
  bool waiting_for_recovery_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 2) {
    std::fprintf(stderr, "usage: e2e_client write|check|remove|churn RUN_DIR ...\n");
    return 2;
  }
  kvagent::ClientOptions options;
  options.run_dir = args[1];
  options.arena_bytes = 64 << 20;
  // A hang shows as TIMEOUT (a failure) long before ctest's limit.
  options.call_timeout = std::chrono::milliseconds(30000);
  auto client = kvagent::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  kvagent::Client& c = **client;
  const std::string& mode = args[0];
  if (mode == "write" && (args.size() == 6 || args.size() == 7)) {
    return Write(c, args[2], std::stoull(args[3]), std::stoull(args[4]), args[5],
                 args.size() == 7 ? std::stoull(args[6]) : 8);
  }
  if (mode == "check" && args.size() == 5) {
    return Check(c, args[2], std::stoull(args[3]), std::stoull(args[4]));
  }
  if (mode == "remove" && args.size() >= 3) return RemoveKeys(c, {args.begin() + 2, args.end()});
  if (mode == "churn" && (args.size() == 4 || args.size() == 5)) {
    const bool may_fail = args.size() == 5 && args[4] == "--master-may-fail";
    if (args.size() == 5 && !may_fail) return 2;
    return Churn(c, may_fail).Run(args[2], std::stoull(args[3]));
  }
  std::fprintf(stderr, "e2e_client: bad arguments for '%s'\n", mode.c_str());
  return 2;
}

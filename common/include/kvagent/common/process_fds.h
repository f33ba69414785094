// File descriptors of a daemon: its limit, how many are open, and a loud word when they run out.
//
// Every agent's connection to kvmaster, every event subscriber, every engine client and every
// data-plane peer holds a descriptor. Out of them, a listener cannot accept: libzmq then retries
// its accept at once, again and again (a whole CPU per listener, nothing logged), and new agents
// or subscribers cannot connect until descriptors are freed. systemd's default soft limit is 1,024
// (the hard one 524,288), which a cluster of a few hundred nodes reaches at kvmaster.
//
// So both daemons raise their soft limit to the hard one at start (RaiseFdLimit, logged), export
// process_open_fds and process_max_fds on /metrics (the names Prometheus client libraries use),
// and watch their use from a thread of their own (FdUseWatch): one ERROR line when it reaches 90 %
// of the limit, one INFO line when it is back under 80 %.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "kvagent/common/metrics.h"

namespace kvagent {

struct FdLimit {
  uint64_t soft_before = 0;  // the soft limit the process started with
  uint64_t soft = 0;         // the soft limit now
  uint64_t hard = 0;
};

// The most RaiseFdLimit sets the soft limit to (a hard limit of "unlimited" is not copied).
constexpr uint64_t kMaxFdLimit = uint64_t{1} << 20;

// Raises RLIMIT_NOFILE's soft limit to its hard limit (at most kMaxFdLimit); returns the limits
// before and after (after == before when the kernel refuses).
FdLimit RaiseFdLimit();

// "file descriptors: up to 65536 (raised from 1024; hard limit 65536)", for the start-up log.
std::string DescribeFdLimit(const FdLimit& limit);

// RLIMIT_NOFILE's soft limit now.
uint64_t FdSoftLimit();

// The descriptors this process has open (entries of /proc/self/fd); -1 when unreadable.
int64_t OpenFdCount();

// Adds the gauges process_open_fds and process_max_fds (Prometheus' process collector's names).
void AppendFdMetrics(metrics::Exposition* out);

// What a look at the descriptors in use says, given whether the last word was a warning.
enum class FdUseWord { kNone, kWarn, kRecovered };
// kWarn when `open` reaches 90 % of `limit` and no warning stands; kRecovered when a warning
// stands and `open` is under 80 %; kNone otherwise. Updates *warned.
FdUseWord JudgeFdUse(int64_t open, uint64_t limit, bool* warned);

// Looks at this process's descriptors every `period` from a thread of its own and logs the
// JudgeFdUse words, naming `daemon`. Stops (and joins) on destruction.
class FdUseWatch {
 public:
  explicit FdUseWatch(std::string daemon,
                      std::chrono::milliseconds period = std::chrono::milliseconds(1000));
  ~FdUseWatch();
  FdUseWatch(const FdUseWatch&) = delete;
  FdUseWatch& operator=(const FdUseWatch&) = delete;

 private:
  void Run();

  const std::string daemon_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kvagent

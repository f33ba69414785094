// Yielding the CPU inside a spin-wait, for as long as that stays cheap.
//
// A thread that spin-waits for another (an SDK call for the agent's answer, the agent's service
// thread for its master link and data plane) lets the other runnable threads of its CPU go first
// between rounds (sched_yield): when the thread it waits for shares its CPU (a small host, the
// agent's threads pinned together), that one runs at once instead of after the spin. But any
// runnable thread of the CPU may take it: beside a busy process of another program (a batch job,
// even at nice 10) each yield gave that process ~150 us, a waiting call yielded some six times,
// and 1 MiB puts and gets ran at 1 GB/s instead of 13-17 (e2e_bench's beside_busy_process
// figures). So a thread whose recent yields took long stops yielding for a while: it spins
// without yielding, then sleeps on its futex as before, and tries yields again after the pause.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace kvagent::ipc {

// One thread's choice to yield or not, from how long its recent yields took.
class YieldPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  // Recent yields that took this long on average gave the CPU to a thread of another program:
  // beside a busy process each yield lasted ~150 us (Linux 6.18, EEVDF), where a yield to the
  // agent's or kvmaster's thread on the same CPU comes back within tens of microseconds (at 50
  // us, kvmaster sharing the client's CPU paused the client's yields too, and its single-key
  // puts fell by a third). The average weighs the last yield 1/8, and counts one at most twice
  // this: a rare long one (a tick's work, a page fault) does not pause yields, a run of nine
  // ~150 us yields does.
  static constexpr std::chrono::microseconds kCostly{100};
  // How long the thread then spins without yielding.
  static constexpr std::chrono::milliseconds kPause{1000};

  bool MayYield(Clock::time_point now) const { return now >= paused_until_; }
  // A yield that took `took` and ended at `after`.
  void Yielded(Clock::duration took, Clock::time_point after) {
    const double us = std::min(std::chrono::duration<double, std::micro>(took).count(),
                               2.0 * static_cast<double>(kCostly.count()));
    average_us_ += (us - average_us_) / 8;
    if (average_us_ < static_cast<double>(kCostly.count())) return;
    paused_until_ = after + kPause;
    average_us_ = 0;  // after the pause, a new run of costly yields pauses again
    ++pauses_;
  }
  uint64_t pauses() const { return pauses_; }

 private:
  Clock::time_point paused_until_{};
  double average_us_ = 0;
  uint64_t pauses_ = 0;
};

// The calling thread's policy (each thread judges its own CPU).
YieldPolicy& ThisThreadsYieldPolicy();

// Yields the CPU (sched_yield) when the calling thread's policy allows it; returns whether it
// did.
bool YieldCpu();

}  // namespace kvagent::ipc

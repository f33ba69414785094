// Yielding the CPU inside a spin-wait, for as long as that stays cheap.
//
// A thread that spin-waits for another (an SDK call for the agent's answer, the agent's service
// thread for its copy helpers) lets the other runnable threads of its CPU go first between rounds
// (sched_yield): when the thread it waits for shares its CPU (a small host, the agent's threads
// pinned together), that one runs at once instead of after the spin. But any runnable thread of
// the CPU may take it, for a whole time slice: beside a busy process of another program (a batch
// job, even at nice 10) each yield gave that process about a millisecond, and a 1 MiB put, about
// 60 us, took a millisecond (e2e_bench's beside_busy_process figures). So a thread whose yield
// took long while what it waits for still did not arrive stops yielding for a while: it spins
// without yielding, then sleeps on its futex as before (its wake-up preempts the busy process,
// which ran longer), and tries a yield again after the pause.
#pragma once

#include <chrono>
#include <cstdint>

namespace kvagent::ipc {

// One thread's choice to yield or not, from what its last costly yield did.
class YieldPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  // A yield that took this long, with the awaited work still not there after it, gave the CPU
  // to a thread of another program (a thread the waiter waits for takes tens of microseconds).
  static constexpr std::chrono::microseconds kCostly{200};
  // How long the thread then spins without yielding.
  static constexpr std::chrono::milliseconds kPause{1000};

  bool MayYield(Clock::time_point now) const { return now >= paused_until_; }
  // A yield from `before` to `after`; `done`: what the thread waits for was there after it.
  void Yielded(Clock::time_point before, Clock::time_point after, bool done) {
    if (done || after - before < kCostly) return;
    paused_until_ = after + kPause;
    ++pauses_;
  }
  uint64_t pauses() const { return pauses_; }

 private:
  Clock::time_point paused_until_{};
  uint64_t pauses_ = 0;
};

// The calling thread's policy (each thread judges its own CPU).
YieldPolicy& ThisThreadsYieldPolicy();

// sched_yield() itself.
void SchedYield();

// Yields the CPU when the calling thread's policy allows it; `done()` (what the thread waits for
// is there) is asked after a costly yield only. Returns whether it yielded.
template <typename DoneFn>
bool YieldCpu(DoneFn&& done) {
  YieldPolicy& policy = ThisThreadsYieldPolicy();
  const auto before = YieldPolicy::Clock::now();
  if (!policy.MayYield(before)) return false;
  SchedYield();
  const auto after = YieldPolicy::Clock::now();
  if (after - before >= YieldPolicy::kCostly) policy.Yielded(before, after, done());
  return true;
}

}  // namespace kvagent::ipc

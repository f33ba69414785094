// BootClock: the time since boot with the time the host spent suspended counted in
// (CLOCK_BOOTTIME), as a std::chrono clock.
//
// std::chrono::steady_clock (CLOCK_MONOTONIC) stops while the host is suspended. A deadline
// that another host counts down meanwhile — an etcd lease's TTL, counted by etcd — must use
// this clock: on the steady clock a process that resumes after a suspend would take a lease
// that expired during the suspend for one still valid.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

namespace kvagent {

struct BootClock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<BootClock>;
  static constexpr bool is_steady = true;

  static time_point now() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return time_point(duration(int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec));
  }
};

}  // namespace kvagent

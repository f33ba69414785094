#include "kvagent/common/watchdog.h"

#include <systemd/sd-daemon.h>

namespace kvagent {

std::chrono::microseconds Watchdog::IntervalFromEnvironment() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) <= 0 || usec == 0) {
    return std::chrono::microseconds(0);
  }
  // Half the interval, as sd_watchdog_enabled(3) recommends: a ping is never late by jitter.
  return std::chrono::microseconds(usec / 2 > 0 ? usec / 2 : 1);
}

Watchdog::Watchdog(std::chrono::microseconds ping_interval, std::function<std::string()> status)
    : interval_(ping_interval.count() > 0 ? ping_interval : std::chrono::microseconds(0)),
      status_(std::move(status)),
      next_(enabled() ? Clock::now() : Clock::time_point::max()) {}

void Watchdog::Poll(Clock::time_point now) {
  if (now < next_) return;
  std::string message = "WATCHDOG=1";
  if (status_) message += "\nSTATUS=" + status_();
  NotifyServiceManager(message);
  pings_.fetch_add(1, std::memory_order_relaxed);
  next_ = now + interval_;
}

void NotifyServiceManager(const std::string& message) {
  sd_notify(/*unset_environment=*/0, message.c_str());
}

}  // namespace kvagent

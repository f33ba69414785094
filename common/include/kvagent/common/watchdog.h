// Watchdog: liveness pings to systemd (WatchdogSec= in the unit) and STATUS= lines, sent from
// the thread that does the work, so that a loop that hangs stops pinging and systemd restarts
// the service after WatchdogSec.
//
// The work loop calls Poll(now) on every turn (a compare when no ping is due) and sleeps at most
// until next_due(). Every half watchdog interval, Poll sends "WATCHDOG=1", with "STATUS=<text>"
// when a status function is set (it runs on the loop's thread: keep it cheap).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace kvagent {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // The pings systemd asked for: enabled when $WATCHDOG_USEC is set (and $WATCHDOG_PID, if set,
  // is this process), with half that interval; disabled otherwise.
  static std::chrono::microseconds IntervalFromEnvironment();

  // `ping_interval` 0: disabled (Poll does nothing, next_due() is max).
  explicit Watchdog(std::chrono::microseconds ping_interval = {},
                    std::function<std::string()> status = {});

  bool enabled() const { return interval_.count() > 0; }
  std::chrono::microseconds interval() const { return interval_; }

  // Sends the ping (and status) when one is due at `now`. Loop thread only.
  void Poll(Clock::time_point now);
  // When the next ping is due (time_point::max() when disabled).
  Clock::time_point next_due() const { return next_; }
  // Pings sent so far (any thread); a ping the manager had no room for is not counted.
  uint64_t pings() const { return pings_.load(std::memory_order_relaxed); }

 private:
  std::chrono::microseconds interval_;
  std::function<std::string()> status_;
  Clock::time_point next_;
  std::atomic<uint64_t> pings_{0};
};

// sd_notify(3) of one message ("READY=1\nSTATUS=...", "STOPPING=1", "EXTEND_TIMEOUT_USEC=...");
// does nothing outside systemd (no $NOTIFY_SOCKET).
void NotifyServiceManager(const std::string& message);

// The same for a watchdog ping, without ever blocking: when the manager's queue is full (it is
// stalled, or a test does not read), the ping is dropped and false returned. sd_notify(3) would
// block the calling loop, the very thread whose liveness the ping reports.
bool PingServiceManager(const std::string& message);

}  // namespace kvagent

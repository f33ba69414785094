// The systemd watchdog's ping source (common/watchdog.h): pings go to $NOTIFY_SOCKET from the
// loop that polls them, so a loop that stops stops pinging. systemd itself is not needed: the
// test binds the notification socket systemd would.
#include "kvagent/common/watchdog.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "notify_socket.h"

namespace kvagent::testing {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

std::string TempPath(const std::string& name) {
  return std::string(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") + "/kvagent-watchdog-" +
         std::to_string(getpid()) + "-" + name;
}

TEST(Watchdog, IntervalIsHalfOfWhatSystemdAskedForThisProcess) {
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  EXPECT_EQ(Watchdog::IntervalFromEnvironment().count(), 0);  // not under a watchdog
  setenv("WATCHDOG_USEC", "30000000", 1);
  EXPECT_EQ(Watchdog::IntervalFromEnvironment(), microseconds(15'000'000));
  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  EXPECT_EQ(Watchdog::IntervalFromEnvironment(), microseconds(15'000'000));
  setenv("WATCHDOG_PID", std::to_string(getppid()).c_str(), 1);  // meant for another process
  EXPECT_EQ(Watchdog::IntervalFromEnvironment().count(), 0);
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
}

TEST(Watchdog, DisabledNeverPingsNorWakesTheLoop) {
  Watchdog w;
  EXPECT_FALSE(w.enabled());
  EXPECT_EQ(w.next_due(), Watchdog::Clock::time_point::max());
  w.Poll(Watchdog::Clock::now());
  EXPECT_EQ(w.pings(), 0u);
}

// A work loop as the ring service and the master run it: poll the watchdog on every turn, sleep
// at most until the next ping. `Park()` makes the loop hang (block) until `Resume()`.
class WorkLoop {
 public:
  explicit WorkLoop(microseconds interval)
      : watchdog_(interval, [this] { return "turns " + std::to_string(turns_.load()); }) {
    thread_ = std::thread([this] { Run(); });
  }
  ~WorkLoop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      parked_wanted_ = false;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Park() {
    std::unique_lock<std::mutex> lock(mu_);
    parked_wanted_ = true;
    cv_.wait(lock, [this] { return parked_; });  // the loop is stuck from here on
  }
  void Resume() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      parked_wanted_ = false;
    }
    cv_.notify_all();
  }

 private:
  void Run() {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (stop_) return;
        if (parked_wanted_) {
          parked_ = true;
          cv_.notify_all();
          cv_.wait(lock, [this] { return !parked_wanted_; });
          parked_ = false;
          if (stop_) return;
        }
      }
      ++turns_;
      const auto now = Watchdog::Clock::now();
      watchdog_.Poll(now);
      std::this_thread::sleep_until(std::min(watchdog_.next_due(), now + milliseconds(1)));
    }
  }

  Watchdog watchdog_;
  std::atomic<uint64_t> turns_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool parked_wanted_ = false;
  bool parked_ = false;
  std::thread thread_;
};

TEST(Watchdog, ALoopThatStopsStopsPingingAndPingsAgainWhenItGoesOn) {
  NotifySocket notify(TempPath("notify"));
  ASSERT_TRUE(notify.bound());
  setenv("NOTIFY_SOCKET", notify.path().c_str(), 1);
  const microseconds interval(5000);
  {
    WorkLoop loop(interval);
    // Running: pings arrive, each with the loop's status.
    for (int i = 0; i < 3; ++i) {
      const std::string ping = notify.Next();
      EXPECT_EQ(ping.rfind("WATCHDOG=1\nSTATUS=turns ", 0), 0u) << ping;
    }
    // Hung: once the loop is stuck, nothing more arrives (what was sent before is drained),
    // over forty ping intervals.
    loop.Park();
    notify.Drain();
    EXPECT_EQ(notify.Next(milliseconds(200)), "");
    // Going again: pings again.
    loop.Resume();
    EXPECT_EQ(notify.Next().rfind("WATCHDOG=1", 0), 0u);
  }
  unsetenv("NOTIFY_SOCKET");
}

// systemd stalled (or a test busy elsewhere): its socket's queue fills up. The loop's pings must
// not block it (sd_notify would, in the work loop whose liveness they report): a ping with no
// room is dropped, and pinging resumes once the manager reads again.
TEST(Watchdog, AManagerThatDoesNotReadNeverBlocksTheLoop) {
  NotifySocket notify(TempPath("full"));
  ASSERT_TRUE(notify.bound());
  setenv("NOTIFY_SOCKET", notify.path().c_str(), 1);
  Watchdog w(microseconds(1));
  auto now = Watchdog::Clock::now();
  constexpr int kPolls = 2000;  // far above any datagram queue (net.unix.max_dgram_qlen)
  for (int i = 0; i < kPolls; ++i) {
    now += microseconds(2);
    w.Poll(now);  // returns: the test would hang here if a full queue blocked it
  }
  const uint64_t queued = w.pings();
  EXPECT_GT(queued, 0u);
  EXPECT_LT(queued, static_cast<uint64_t>(kPolls));  // the rest were dropped, not waited for
  EXPECT_EQ(static_cast<uint64_t>(notify.Drain()), queued);
  w.Poll(now + microseconds(2));  // room again: the next ping goes through
  EXPECT_EQ(w.pings(), queued + 1);
  EXPECT_EQ(notify.Next(), "WATCHDOG=1");
  unsetenv("NOTIFY_SOCKET");
}

}  // namespace
}  // namespace kvagent::testing

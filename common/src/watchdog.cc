#include "kvagent/common/watchdog.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

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
  if (PingServiceManager(message)) pings_.fetch_add(1, std::memory_order_relaxed);
  next_ = now + interval_;
}

void NotifyServiceManager(const std::string& message) {
  sd_notify(/*unset_environment=*/0, message.c_str());
}

bool PingServiceManager(const std::string& message) {
  const char* socket_path = std::getenv("NOTIFY_SOCKET");
  if (socket_path == nullptr || socket_path[0] == '\0') return false;
  if (socket_path[0] != '/' && socket_path[0] != '@') {
    // Another address family (vsock: a VM's manager): libsystemd knows it.
    return sd_notify(/*unset_environment=*/0, message.c_str()) > 0;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t length = std::strlen(socket_path);
  if (length >= sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, socket_path, length);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // the abstract namespace
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  // A manager that does not read (its queue full) loses this ping: the loop never waits on it.
  const ssize_t sent = sendto(fd, message.data(), message.size(), MSG_NOSIGNAL | MSG_DONTWAIT,
                              reinterpret_cast<const sockaddr*>(&addr),
                              static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length));
  close(fd);
  return sent == static_cast<ssize_t>(message.size());
}

}  // namespace kvagent

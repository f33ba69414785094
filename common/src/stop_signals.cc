#include "kvagent/common/stop_signals.h"

#include <pthread.h>

namespace kvagent {

namespace {

const char* SignalName(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "signal";
  }
}

}  // namespace

StopSignals::StopSignals(bool also_sigusr1) {
  sigemptyset(&set_);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGINT);
  if (also_sigusr1) sigaddset(&set_, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

const char* StopSignals::Wait() const {
  int sig = 0;
  while (sigwait(&set_, &sig) != 0) {
  }
  return SignalName(sig);
}

const char* StopSignals::WaitFor(std::chrono::milliseconds timeout) const {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000) * 1'000'000;
  const int sig = sigtimedwait(&set_, nullptr, &ts);
  return sig > 0 ? SignalName(sig) : nullptr;
}

}  // namespace kvagent

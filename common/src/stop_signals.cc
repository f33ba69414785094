#include "kvagent/common/stop_signals.h"

#include <pthread.h>

namespace kvagent {

StopSignals::StopSignals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

const char* StopSignals::Wait() const {
  int sig = 0;
  while (sigwait(&set_, &sig) != 0) {
  }
  return sig == SIGTERM ? "SIGTERM" : "SIGINT";
}

}  // namespace kvagent

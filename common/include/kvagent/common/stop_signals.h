// How the daemons (kvagent, kvmaster) stop: SIGTERM or SIGINT, taken by the main thread.
#pragma once

#include <csignal>

namespace kvagent {

// Blocks SIGTERM and SIGINT in the calling thread — and so in every thread it starts afterwards —
// so that only WaitForStopSignal() receives them, and ignores SIGPIPE (a peer closing a socket
// must not kill a daemon). Call at the start of main, before any thread exists.
class StopSignals {
 public:
  StopSignals();
  // Waits for SIGTERM or SIGINT and returns its name ("SIGTERM" or "SIGINT").
  const char* Wait() const;

 private:
  sigset_t set_;
};

}  // namespace kvagent

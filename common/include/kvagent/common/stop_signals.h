// How the daemons (kvagent, kvmaster) stop: SIGTERM or SIGINT, taken by the main thread.
#pragma once

#include <chrono>
#include <csignal>

namespace kvagent {

// Blocks SIGTERM and SIGINT in the calling thread — and so in every thread it starts afterwards —
// so that only WaitForStopSignal() receives them, and ignores SIGPIPE (a peer closing a socket
// must not kill a daemon). Call at the start of main, before any thread exists.
class StopSignals {
 public:
  // With `also_sigusr1`, SIGUSR1 is taken the same way (a standby kvmaster's "promote now").
  explicit StopSignals(bool also_sigusr1 = false);
  // Waits for SIGTERM or SIGINT and returns its name ("SIGTERM" or "SIGINT").
  const char* Wait() const;
  // Waits at most `timeout` for any of the signals; returns its name ("SIGTERM", "SIGINT",
  // "SIGUSR1"), or nullptr when none came.
  const char* WaitFor(std::chrono::milliseconds timeout) const;

 private:
  sigset_t set_;
};

}  // namespace kvagent

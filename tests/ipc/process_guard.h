// A child process that is always reaped: SIGKILL + waitpid on destruction unless Wait() already
// collected it, so a failing test never leaves a process behind.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

namespace kvagent::testing {

class ProcessGuard {
 public:
  explicit ProcessGuard(pid_t pid) : pid_(pid) {}
  ProcessGuard(const ProcessGuard&) = delete;
  ProcessGuard& operator=(const ProcessGuard&) = delete;
  ~ProcessGuard() { Kill(); }

  pid_t pid() const { return pid_; }

  // Waits for the child and returns its raw wait status (-1 if already reaped).
  int Wait() {
    if (pid_ <= 0) return -1;
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0) {
    }
    pid_ = -1;
    return status;
  }

  // SIGKILL and reap.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    Wait();
  }

 private:
  pid_t pid_;
};

}  // namespace kvagent::testing

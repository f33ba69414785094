// A child process that is always reaped: SIGKILL + waitpid on destruction unless it was already
// collected, so a failing test never leaves a process behind.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

namespace kvagent::testing {

class ProcessGuard {
 public:
  explicit ProcessGuard(pid_t pid = -1) : pid_(pid) {}
  ProcessGuard(const ProcessGuard&) = delete;
  ProcessGuard& operator=(const ProcessGuard&) = delete;
  ~ProcessGuard() { Kill(); }

  // The child's pid, or -1 once it has been reaped.
  pid_t pid() const { return pid_; }
  void Reset(pid_t pid) {
    Kill();
    pid_ = pid;
  }

  // True while the child runs; reaps it (without blocking) once it has exited.
  bool Running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return true;
    status_ = status;
    pid_ = -1;
    return false;
  }

  // Waits for the child and returns its raw wait status (the saved one if already reaped).
  int Wait() {
    if (pid_ > 0) {
      int status = 0;
      while (waitpid(pid_, &status, 0) < 0) {
      }
      status_ = status;
      pid_ = -1;
    }
    return status_;
  }

  void Signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  // SIGKILL and reap.
  void Kill() {
    Signal(SIGKILL);
    Wait();
  }

 private:
  pid_t pid_;
  int status_ = -1;
};

}  // namespace kvagent::testing

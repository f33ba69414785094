// A child process that is always reaped: SIGKILL + waitpid on destruction unless it was already
// collected, so a failing test never leaves a process behind.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

  // "running", or how the child ended ("exited with code 1", "killed by signal 9 (Killed)").
  std::string State() {
    if (Running()) return "running";
    if (status_ == -1) return "never started";
    if (WIFEXITED(status_)) return "exited with code " + std::to_string(WEXITSTATUS(status_));
    if (WIFSIGNALED(status_)) {
      return "killed by signal " + std::to_string(WTERMSIG(status_)) + " (" +
             strsignal(WTERMSIG(status_)) + ")";
    }
    return "wait status " + std::to_string(status_);
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

// A command line for execv, built before fork() (the child of a threaded process should not
// allocate): args[0] is the program's path.
class ExecArgs {
 public:
  explicit ExecArgs(std::vector<std::string> args) : args_(std::move(args)) {
    for (auto& a : args_) argv_.push_back(a.data());
    argv_.push_back(nullptr);
  }
  ExecArgs(const ExecArgs&) = delete;
  ExecArgs& operator=(const ExecArgs&) = delete;

  // In the child: becomes the program, or exits 127 when it cannot.
  [[noreturn]] void Exec() const {
    execv(argv_[0], argv_.data());
    _exit(127);
  }

 private:
  std::vector<std::string> args_;
  std::vector<char*> argv_;
};

// Whether the processes tests start keep their logs on stderr: KVAGENT_TEST_AGENT_LOG=1 (by
// default their stderr goes to /dev/null, to keep the test log readable).
inline bool TestProcessLogsWanted() { return std::getenv("KVAGENT_TEST_AGENT_LOG") != nullptr; }

// In a child: its stderr to /dev/null unless `keep` (TestProcessLogsWanted(), asked before fork).
inline void QuietStderr(bool keep = false) {
  if (keep) return;
  const int devnull = open("/dev/null", O_WRONLY);
  dup2(devnull, STDERR_FILENO);
}

// Starts `args` with its stderr quiet unless KVAGENT_TEST_AGENT_LOG is set. Returns its pid
// (hand it to a ProcessGuard), -1 when fork failed.
inline pid_t SpawnQuiet(std::vector<std::string> args) {
  const ExecArgs command(std::move(args));
  const bool keep_log = TestProcessLogsWanted();
  const pid_t pid = fork();
  if (pid == 0) {
    QuietStderr(keep_log);
    command.Exec();
  }
  return pid;
}

}  // namespace kvagent::testing

// Test support: a real `kvagent` process in a fresh run directory, always stopped (SIGKILL +
// waitpid) and cleaned up when the test ends, pass or fail.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "process_guard.h"
#include "temp_dir.h"

#ifndef KVAGENT_BINARY
#error "KVAGENT_BINARY must name the kvagent executable"
#endif

namespace kvagent::testing {

// Polls `condition` every millisecond until it holds or `limit` passes; returns its last value.
// Used to wait for asynchronous effects (a socket appearing, fds returning to a baseline); the
// bound only keeps a broken build from hanging, nothing asserts on the time taken.
inline bool WaitUntil(const std::function<bool()>& condition,
                      std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= end) return condition();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Open file descriptors of process `pid` (-1 if /proc is unreadable).
inline int CountFds(pid_t pid) {
  DIR* dir = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

// True when every thread of `pid` is stopped (after SIGSTOP has been delivered to all).
inline bool IsStopped(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  int seen = 0;
  for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream stat(t.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos || paren + 2 >= line.size()) return false;
    if (line[paren + 2] != 'T' && line[paren + 2] != 't') return false;
    ++seen;
  }
  return seen > 0;
}

// The children of process `pid` (of any of its threads).
inline std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream in(t.path() / "children");
    for (pid_t child; in >> child;) out.push_back(child);
  }
  return out;
}

// A process's state letter from /proc (R, S, T, Z, ...; '?' once it is gone).
inline char ProcessState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() ? line[paren + 2] : '?';
}

// Catches a child that kvmaster forked to write its state (a compaction of its log, a
// follower's snapshot) and stops it (SIGSTOP) once it is set up: holding only stdin, stdout,
// stderr and its file. One stopped earlier is let go and the next one awaited. Such a child
// lives for milliseconds, so this looks without pause, for at most `limit`; 0 when none.
inline pid_t StopAStateWriter(pid_t parent,
                              std::chrono::milliseconds limit = std::chrono::minutes(1)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    for (pid_t p : ChildrenOf(parent)) {
      if (::kill(p, SIGSTOP) != 0) continue;
      for (int i = 0; i < 5000 && ProcessState(p) == 'R'; ++i) {  // stopping takes a moment
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (ProcessState(p) == 'T' && CountFds(p) <= 4) return p;
      ::kill(p, SIGCONT);
    }
  }
  return 0;
}

// Entries in /dev/shm named after agent `pid` ("kvagent.<pid>.").
inline int CountShm(pid_t pid) {
  const std::string prefix = "kvagent." + std::to_string(pid) + ".";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    n += e.path().filename().string().rfind(prefix, 0) == 0;
  }
  return n;
}

// Arguments that make an agent serve degraded: its master is an address nobody listens on, so
// every request other than Ping reaches the request pipeline and fails there with
// MASTER_UNAVAILABLE (for tests of the ring service and the SDK, not of the store).
inline std::vector<std::string> DegradedAgentArgs() {
  return {"--master",
          "tcp://127.0.0.1:1",
          "--master-events",
          "tcp://127.0.0.1:1",
          "--master-events-replay",
          "tcp://127.0.0.1:1",
          "--master-ready-wait-ms",
          "0"};
}

class AgentProcess {
 public:
  // Starts kvagent with --run-dir <fresh dir>, a 64 MiB pool (tests run side by side; the
  // default is 1 GiB) plus `extra_args` (later flags win), and waits for its socket.
  explicit AgentProcess(std::vector<std::string> extra_args = {}) {
    run_dir_ = dir_.path() + "/run";
    std::vector<std::string> args = {KVAGENT_BINARY, "--run-dir", run_dir_, "--pool-size", "64MiB"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    // Quiet by default; KVAGENT_TEST_AGENT_LOG=1 keeps the agent's log on stderr.
    const pid_t pid = SpawnQuiet(std::move(args));
    process_.Reset(pid);
    pid_ = pid;
    started_ = WaitUntil([&] { return access(socket_path().c_str(), F_OK) == 0 || !Running(); });
    started_ = started_ && Running();
  }
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;

  bool started() const { return started_; }
  // The agent's pid (kept after it exits, for counting what it left behind).
  pid_t pid() const { return pid_; }
  const std::string& run_dir() const { return run_dir_; }
  std::string socket_path() const { return run_dir_ + "/agent.sock"; }

  bool Running() { return process_.Running(); }
  void Signal(int sig) { process_.Signal(sig); }
  int WaitExit() { return process_.Wait(); }
  void Kill() { process_.Kill(); }

 private:
  TempDir dir_;  // declared first: removed after the process is gone
  std::string run_dir_;
  ProcessGuard process_;
  pid_t pid_ = -1;
  bool started_ = false;
};

}  // namespace kvagent::testing

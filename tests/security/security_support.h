// Test support for the attack tests: the real kvmaster and kvagent (pipeline_support.h), plus
// what an attacker's test needs — a process's memory high-water mark and CPU time, running
// code as another uid, and a kvagent with its log captured and a lowered descriptor limit.
//
// The binaries are the ones this build made; KVSEC_KVAGENT / KVSEC_KVMASTER / KVSEC_KVCTL
// point the tests at others (e.g. a build of an older commit, to see which attacks it falls
// to).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

namespace kvagent::testing {

inline std::string BinaryFromEnv(const char* variable, const char* built) {
  const char* given = std::getenv(variable);
  return given != nullptr && *given != '\0' ? given : built;
}

}  // namespace kvagent::testing

// The helpers below take the binaries from these.
#define KVAGENT_BINARY ::kvagent::testing::BinaryFromEnv("KVSEC_KVAGENT", KVSEC_BUILT_KVAGENT)
#define KVMASTER_BINARY ::kvagent::testing::BinaryFromEnv("KVSEC_KVMASTER", KVSEC_BUILT_KVMASTER)
#define KVCTL_BINARY ::kvagent::testing::BinaryFromEnv("KVSEC_KVCTL", KVSEC_BUILT_KVCTL)

#include "command_run.h"
#include "pipeline_support.h"

namespace kvagent::testing {

// A "Vm..." line of /proc/<pid>/status in KiB (0 when unreadable).
inline uint64_t ProcStatusKiB(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0)
      return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return 0;
}

// User + system CPU time of `pid` (or of one of its threads: `/proc/PID/task/TID/stat`), in
// clock ticks (100 per second).
inline uint64_t CpuTicksOf(const std::string& stat_path) {
  std::ifstream stat(stat_path);
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(line.substr(paren + 2));
  std::string f;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::strtoull(f.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(f.c_str(), nullptr, 10);
  }
  return utime + stime;
}
inline uint64_t CpuTicks(pid_t pid) { return CpuTicksOf("/proc/" + std::to_string(pid) + "/stat"); }

// The CPU time of the threads of `pid` named `name` (pthread_setname_np), in clock ticks.
inline uint64_t ThreadCpuTicks(pid_t pid, const std::string& name) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task/";
  uint64_t ticks = 0;
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(tasks + e->d_name + "/comm");
    std::string thread_name;
    std::getline(comm, thread_name);
    if (thread_name == name) ticks += CpuTicksOf(tasks + e->d_name + "/stat");
  }
  closedir(dir);
  return ticks;
}

// Whether `pid` has a thread named `name`.
inline bool HasThread(pid_t pid, const std::string& name) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task/";
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return false;
  bool found = false;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(tasks + e->d_name + "/comm");
    std::string thread_name;
    std::getline(comm, thread_name);
    found = found || thread_name == name;
  }
  closedir(dir);
  return found;
}

// Runs `fn` in a child process as `uid`/`gid` (no supplementary groups); returns its exit code
// (fn's return value), 100 when the uid switch failed, -1 when it died of a signal.
inline int RunAs(uid_t uid, gid_t gid, const std::function<int()>& fn) {
  ProcessGuard child(fork());
  if (child.pid() == 0) {
    if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(100);
    _exit(fn());
  }
  const int status = child.Wait();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A kvagent whose stderr goes to a file and whose descriptor limit is `max_fds` (0: unchanged),
// started as `uid` (0: as we are). Stopped (SIGKILL + wait) on destruction.
class LoggedAgent {
 public:
  LoggedAgent(std::vector<std::string> extra, rlim_t max_fds = 0, uid_t uid = 0) {
    ::chmod(dir_.path().c_str(), 0777);
    run_dir_ = dir_.path() + "/run";
    log_ = dir_.path() + "/agent.log";
    std::vector<std::string> args = {KVAGENT_BINARY, "--run-dir", run_dir_,
                                     "--pool-size",  "64MiB",     "--pool-huge-pages=false"};
    args.insert(args.end(), extra.begin(), extra.end());
    const ExecArgs command(std::move(args));
    const pid_t pid = fork();
    if (pid == 0) {
      const int log = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
      if (log >= 0) dup2(log, 2);
      if (max_fds != 0) {
        const rlimit limit{max_fds, max_fds};
        setrlimit(RLIMIT_NOFILE, &limit);
      }
      if (uid != 0 && (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0)) {
        _exit(100);
      }
      command.Exec();
    }
    process_.Reset(pid);
    pid_ = pid;
    started_ = WaitUntil([&] { return access(socket_path().c_str(), F_OK) == 0 || !Running(); }) &&
               Running();
  }

  bool started() const { return started_; }
  pid_t pid() const { return pid_; }
  bool Running() { return process_.Running(); }
  const std::string& run_dir() const { return run_dir_; }
  std::string socket_path() const { return run_dir_ + "/agent.sock"; }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  TempDir dir_;
  std::string run_dir_;
  std::string log_;
  ProcessGuard process_;
  pid_t pid_ = -1;
  bool started_ = false;
};

}  // namespace kvagent::testing

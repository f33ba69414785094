// Support for the end-to-end tests: a store as a user runs it — one kvagent, standalone or
// linked to a real kvmaster process — and SDK client processes (e2e_client) that the test
// drives through their standard input and reads line by line. Every process started here is
// stopped (SIGKILL + waitpid) when its guard goes, pass or fail.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipeline_support.h"

#ifndef E2E_CLIENT_BINARY
#error "E2E_CLIENT_BINARY must name the e2e_client executable"
#endif

namespace kvagent::testing {

enum class Mode { kStandalone, kRemote };

inline std::string ModeName(const ::testing::TestParamInfo<Mode>& info) {
  return info.param == Mode::kStandalone ? "Standalone" : "WithKvmaster";
}
inline void PrintTo(Mode mode, std::ostream* os) {
  *os << (mode == Mode::kStandalone ? "standalone" : "with a kvmaster process");
}

// One kvagent, with its own kvmaster process in kRemote mode (on OS-picked loopback ports).
class Store {
 public:
  explicit Store(Mode mode, Args agent_args = {}, Args master_args = {}) {
    if (mode == Mode::kRemote) {
      master_.emplace(std::move(master_args));
      if (!master_->started()) return;
      agent_args = Concat(master_->AgentArgs(), agent_args);
    }
    agent_.emplace(std::move(agent_args));
  }
  bool started() const { return agent_ && agent_->started(); }
  AgentProcess& agent() { return *agent_; }
  KvmasterProcess& master() { return *master_; }
  const std::string& run_dir() const { return agent_->run_dir(); }

 private:
  std::optional<KvmasterProcess> master_;  // declared first: outlives the agent
  std::optional<AgentProcess> agent_;
};

// An e2e_client child. Its standard input stays open until CloseInput() (churn stops at EOF);
// its standard output is read line by line with a bound.
class ClientProcess {
 public:
  explicit ClientProcess(std::vector<std::string> args) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0) return;
    if (pipe2(out, O_CLOEXEC) != 0) {
      close(in[0]);
      close(in[1]);
      return;
    }
    args.insert(args.begin(), E2E_CLIENT_BINARY);
    const ExecArgs command(std::move(args));
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      command.Exec();
    }
    close(in[0]);
    close(out[1]);
    input_ = in[1];
    output_ = out[0];
    process_.Reset(pid);
  }
  ~ClientProcess() {
    process_.Kill();
    CloseInput();
    if (output_ >= 0) close(output_);
  }
  ClientProcess(const ClientProcess&) = delete;
  ClientProcess& operator=(const ClientProcess&) = delete;

  pid_t pid() const { return process_.pid(); }

  // Writes `line` and a newline to its standard input.
  void WriteLine(const std::string& line) {
    if (input_ < 0) return;
    const std::string text = line + "\n";
    (void)!write(input_, text.data(), text.size());
  }

  // The next line of its output without the newline; "" at EOF or when `limit` passed first.
  std::string ReadLine(std::chrono::milliseconds limit = std::chrono::seconds(60)) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (true) {
      const size_t nl = buffered_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      pollfd p = {output_, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return "";
      char buf[4096];
      const ssize_t n = read(output_, buf, sizeof(buf));
      if (n <= 0) return "";
      buffered_.append(buf, static_cast<size_t>(n));
    }
  }

  // Reads lines until one equals `want`; false at EOF or after `limit`.
  bool WaitForLine(const std::string& want,
                   std::chrono::milliseconds limit = std::chrono::seconds(60)) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      const std::string line = ReadLine(std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now()));
      if (line == want) return true;
      if (line.empty()) return false;
    }
    return false;
  }

  void CloseInput() {
    if (input_ >= 0) close(input_);
    input_ = -1;
  }

  // Waits for it to exit: its exit code, or -1 when a signal ended it.
  int Wait() {
    const int status = process_.Wait();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  bool Running() { return process_.Running(); }
  void Kill() { process_.Kill(); }

 private:
  ProcessGuard process_;
  int input_ = -1;
  int output_ = -1;
  std::string buffered_;
};

// Runs an e2e_client to completion; its exit code (-1: killed by a signal, or hung past `limit`
// and killed).
inline int RunClient(std::vector<std::string> args,
                     std::chrono::milliseconds limit = std::chrono::seconds(90)) {
  ClientProcess p(std::move(args));
  p.CloseInput();
  const auto end = std::chrono::steady_clock::now() + limit;
  while (p.Running()) {
    if (std::chrono::steady_clock::now() >= end) return -1;  // the guard kills it
    // Drains its output so it never blocks on a full pipe.
    if (p.ReadLine(std::chrono::milliseconds(100)).empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return p.Wait();
}

// Mappings of the agent's client segments still in the agent's address space (a client's
// segment that outlives the client leaks memory even once its name is gone from /dev/shm).
inline int CountSegmentMappings(pid_t agent_pid) {
  std::ifstream maps("/proc/" + std::to_string(agent_pid) + "/maps");
  const std::string name = "/memfd:kvagent-client-";  // ipc::Segment::Create's memfd
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find(name) != std::string::npos;
  return n;
}

// Every key of the store (List, all pages) with its session tag.
inline std::map<std::string, std::string> ListedSessions(Client& c) {
  std::map<std::string, std::string> out;
  ListOptions o;
  for (int pages = 0; pages < 100000; ++pages) {
    Reply r = c.List(o);
    if (!r.ok()) break;
    for (const auto& k : r.listed) out[k.key] = k.session_id;
    if (r.next_cursor == 0) break;
    o.cursor = r.next_cursor;
  }
  return out;
}

}  // namespace kvagent::testing

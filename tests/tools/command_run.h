// Test support: runs a program to completion with given standard input and collects its exit
// status, standard output and standard error. The child is always reaped (ProcessGuard), and
// killed when it outlives the limit, so a hung program fails the test instead of hanging it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "kvagent/common/unique_fd.h"
#include "process_guard.h"

namespace kvagent::testing {

struct CommandOutput {
  int exit_code = -1;  // the program's exit status; -1 when it died from a signal
  bool killed_at_limit = false;
  std::string out;
  std::string err;
};

// Runs argv[0] (a path) with `args`, feeding `input` on its standard input.
inline CommandOutput RunCommand(const std::vector<std::string>& args, const std::string& input = "",
                                std::chrono::seconds limit = std::chrono::seconds(60)) {
  CommandOutput result;
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    result.err = "pipe2 failed";
    return result;
  }
  kvagent::UniqueFd in_r(in[0]), in_w(in[1]), out_r(out[0]), out_w(out[1]), err_r(err[0]),
      err_w(err[1]);
  const ExecArgs command(args);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    command.Exec();
  }
  ProcessGuard child(pid);
  in_r.Reset();
  out_w.Reset();
  err_w.Reset();
  signal(SIGPIPE, SIG_IGN);  // a child that does not read its input must not kill the test
  size_t written = 0;
  if (input.empty()) in_w.Reset();
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool out_open = true, err_open = true;
  while (out_open || err_open) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.killed_at_limit = true;
      break;
    }
    pollfd fds[3] = {{out_r.get(), POLLIN, 0}, {err_r.get(), POLLIN, 0}, {in_w.get(), POLLOUT, 0}};
    if (!out_open) fds[0].fd = -1;
    if (!err_open) fds[1].fd = -1;
    if (poll(fds, 3, static_cast<int>(left.count())) < 0) continue;
    char buf[65536];
    if (fds[0].revents != 0) {
      const ssize_t n = read(out_r.get(), buf, sizeof(buf));
      if (n > 0) result.out.append(buf, static_cast<size_t>(n));
      out_open = n > 0 || (n < 0 && errno == EINTR);
    }
    if (fds[1].revents != 0) {
      const ssize_t n = read(err_r.get(), buf, sizeof(buf));
      if (n > 0) result.err.append(buf, static_cast<size_t>(n));
      err_open = n > 0 || (n < 0 && errno == EINTR);
    }
    if (fds[2].revents != 0) {
      const ssize_t n = write(in_w.get(), input.data() + written, input.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      if (n < 0 && errno != EINTR) written = input.size();  // the child closed its input
      if (written == input.size()) in_w.Reset();
    }
  }
  if (result.killed_at_limit) child.Kill();
  const int status = child.Wait();
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace kvagent::testing

// Test support: runs kvagent_test_client (test_client_main.cc) as a child process whose stdout
// the test reads line by line.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "process_guard.h"

#ifndef KVAGENT_TEST_CLIENT
#error "KVAGENT_TEST_CLIENT must name the kvagent_test_client executable"
#endif

namespace kvagent::testing {

// Starts kvagent_test_client with `args`; its stdout is readable from *out_fd. Returns the pid
// (hand it to a ProcessGuard), or -1.
inline pid_t SpawnTestClient(std::vector<std::string> args, int* out_fd) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return -1;
  args.insert(args.begin(), KVAGENT_TEST_CLIENT);
  const ExecArgs command(std::move(args));
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], 1);
    command.Exec();
  }
  close(pipe_fds[1]);
  *out_fd = pipe_fds[0];
  return pid;
}

// One line from `fd` without its newline ("" at EOF).
inline std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

}  // namespace kvagent::testing

// ForkedWriter: a child process (fork) that writes one file from its copy of this process's
// memory, so that the caller's thread goes on while the whole state is written out (the log's
// compaction, a follower's snapshot).
//
// fork gives the child the memory as it was at the call, copied on write, for the price of the
// page tables; only the calling thread exists in the child. So the child's `body` must not log
// nor take a lock another thread may hold (malloc is safe: glibc resets its locks in the child).
// The child holds none of its parent's descriptors but the file (a restarted kvmaster must bind
// the same ports, and a copy of a connection would keep it open), takes the signals its parent's
// threads had blocked (a SIGTERM ends it), and dies with its parent (PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kvagent/common/status.h"

namespace kvagent::master {

class ForkedWriter {
 public:
  // What the child runs: writes `fd` and returns 0, or the errno that stopped it.
  using Body = std::function<int(int fd)>;

  // Starts a child that runs `body` on `fd` (a descriptor of the caller's, which it keeps).
  // INTERNAL when fork fails. `what` names the work in messages ("rewriting FILE").
  static Result<std::unique_ptr<ForkedWriter>> Start(int fd, const Body& body, std::string what);
  // Kills the child if it still runs, and waits for it.
  ~ForkedWriter();
  ForkedWriter(const ForkedWriter&) = delete;
  ForkedWriter& operator=(const ForkedWriter&) = delete;

  // False while the child runs. Once it ended: true, with `*status` OK when `body` returned 0,
  // else why not (its errno, the signal that killed it).
  bool Done(Status* status);
  pid_t pid() const { return pid_; }

  // write(2) of all of `data` (in the child): 0, or the errno that stopped it.
  static int WriteAll(int fd, std::string_view data);

 private:
  ForkedWriter(pid_t pid, std::string what) : pid_(pid), what_(std::move(what)) {}
  pid_t pid_;  // -1 once waited for
  std::string what_;
};

}  // namespace kvagent::master

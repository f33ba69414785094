#include "forked_writer.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "kvagent/common/errno_text.h"

namespace kvagent::master {
namespace {

constexpr int kOrphaned = 0xff;  // the child's exit code when its parent was gone

}  // namespace

int ForkedWriter::WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

Result<std::unique_ptr<ForkedWriter>> ForkedWriter::Start(int fd, const Body& body,
                                                          std::string what) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Internal("cannot start a process " + what + ": " + ErrnoText(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(kOrphaned);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGUSR1, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
    // Every descriptor above stderr but `fd` is closed.
    if (fd > 3) ::syscall(SYS_close_range, 3u, static_cast<unsigned>(fd - 1), 0u);
    ::syscall(SYS_close_range, static_cast<unsigned>(fd + 1), ~0u, 0u);
    const int failed = body(fd);
    ::_exit(failed == 0 ? 0 : std::clamp(failed, 1, 0x7f));
  }
  return std::unique_ptr<ForkedWriter>(new ForkedWriter(pid, std::move(what)));
}

ForkedWriter::~ForkedWriter() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

bool ForkedWriter::Done(Status* status) {
  *status = Status::Ok();
  if (pid_ <= 0) return true;
  int wstatus = 0;
  const pid_t r = ::waitpid(pid_, &wstatus, WNOHANG);
  if (r == 0) return false;  // still writing
  const int wait_errno = errno;
  pid_ = -1;  // reaped (or not ours to wait for any more)
  if (r > 0 && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return true;
  const std::string why = r < 0 ? "cannot wait for it: " + ErrnoText(wait_errno)
                          : WIFSIGNALED(wstatus)
                              ? "killed by signal " + std::to_string(WTERMSIG(wstatus))
                          : WEXITSTATUS(wstatus) == kOrphaned ? std::string("its parent was gone")
                                                              : ErrnoText(WEXITSTATUS(wstatus));
  *status = Internal("the process " + what_ + " failed (" + why + ")");
  return true;
}

}  // namespace kvagent::master

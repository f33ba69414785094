// getpid() answered from memory, for the daemons (kvagent, kvmaster) only.
//
// glibc stopped caching the pid in 2.25: every getpid() is a system call. libzmq calls it for
// fork detection each time a socket or its I/O thread looks at its command mailbox, which is
// several times per message: 28 getpid calls per remote put across the agent's master link,
// kvmaster and their ZMQ I/O threads (perf trace). A system call costs ~0.1-0.5 us on bare metal
// and 0.93 us on the paravirtualized VMs the benchmarks run on, where the cache took 20-29 % off
// a ZMQ round trip (docs/benchmarks.md).
//
// An executable that defines getpid interposes it for every shared library it loads (ld exports
// the definition because libzmq.so refers to it). That is safe here because neither daemon
// starts processes: the cache is refreshed in the child of a fork() (pthread_atfork), and the
// daemons never use vfork, posix_spawn or a bare clone (whose children would share or skip it).
// Linked as an object library into the daemons and the test that checks it; never into the SDK,
// which lives in the engine's process.
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace {

std::atomic<pid_t> cached_pid{0};

void ForgetPidInChild() { cached_pid.store(0, std::memory_order_relaxed); }

// Registered before main (static initialization of this object): no fork can precede it.
const bool registered = [] { return pthread_atfork(nullptr, nullptr, ForgetPidInChild) == 0; }();

}  // namespace

extern "C" pid_t getpid() noexcept {
  pid_t pid = cached_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    pid = static_cast<pid_t>(syscall(SYS_getpid));
    cached_pid.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

// For the test: whether the fork handler is in place.
extern "C" bool kvagent_cached_pid_fork_safe() { return registered; }

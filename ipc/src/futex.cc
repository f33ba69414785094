#include "kvagent/ipc/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

namespace kvagent::ipc {
namespace {

int Op(int op, FutexScope scope) {
  return scope == FutexScope::kPrivate ? (op | FUTEX_PRIVATE_FLAG) : op;
}

uint32_t* Addr(const std::atomic<uint32_t>* word) {
  // The kernel only reads the word; the syscall ABI takes a non-const pointer.
  return reinterpret_cast<uint32_t*>(const_cast<std::atomic<uint32_t>*>(word));
}

WaitResult FromErrno(long rc) {
  if (rc == 0) return WaitResult::kWoken;
  switch (errno) {
    case EAGAIN:
      return WaitResult::kChanged;
    case ETIMEDOUT:
      return WaitResult::kTimedOut;
    case ENOSYS:
      return WaitResult::kUnsupported;
    default:
      return WaitResult::kWoken;  // EINTR and friends: the caller re-checks
  }
}

}  // namespace

WaitResult FutexWait(const std::atomic<uint32_t>* word, uint32_t expected,
                     std::chrono::nanoseconds timeout, FutexScope scope) {
  timespec ts{};
  timespec* tsp = nullptr;
  if (timeout.count() >= 0) {
    ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
    ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
    tsp = &ts;  // FUTEX_WAIT takes a relative timeout
  }
  long rc = syscall(SYS_futex, Addr(word), Op(FUTEX_WAIT, scope), expected, tsp, nullptr, 0);
  return FromErrno(rc);
}

int FutexWake(const std::atomic<uint32_t>* word, int count, FutexScope scope) {
  long rc = syscall(SYS_futex, Addr(word), Op(FUTEX_WAKE, scope), count, nullptr, nullptr, 0);
  return rc < 0 ? 0 : static_cast<int>(rc);
}

WaitResult FutexWaitMany(std::span<const FutexWaiter> waiters, std::chrono::nanoseconds timeout) {
  if (waiters.size() > kMaxFutexWaiters) return WaitResult::kTooManyWaiters;
  futex_waitv vec[kMaxFutexWaiters] = {};
  const size_t n = waiters.size();
  for (size_t i = 0; i < n; ++i) {
    vec[i].val = waiters[i].expected;
    vec[i].uaddr = reinterpret_cast<uintptr_t>(Addr(waiters[i].word));
    vec[i].flags = FUTEX_32 | (waiters[i].scope == FutexScope::kPrivate ? FUTEX_PRIVATE_FLAG : 0);
  }
  timespec ts{};
  timespec* tsp = nullptr;
  if (timeout.count() >= 0) {
    // futex_waitv takes an absolute timeout on the given clock.
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = static_cast<long long>(ts.tv_nsec) + timeout.count();
    ts.tv_sec += static_cast<time_t>(ns / 1000000000);
    ts.tv_nsec = static_cast<long>(ns % 1000000000);
    tsp = &ts;
  }
  long rc = syscall(SYS_futex_waitv, vec, static_cast<unsigned>(n), 0u, tsp, CLOCK_MONOTONIC);
  if (rc >= 0) return WaitResult::kWoken;
  return FromErrno(rc);
}

}  // namespace kvagent::ipc

// Futex wait/wake on 32-bit words, shared between processes or private to one.
//
// A futex word lives in memory both sides can see (a shared-memory segment) or in process
// memory (Scope::kPrivate, cheaper to hash in the kernel). These calls never allocate and never
// take a lock; they are the only blocking primitive on the shared-memory path.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>

namespace kvagent::ipc {

enum class FutexScope { kShared, kPrivate };

enum class WaitResult {
  kWoken,           // woken by a wake call (or spuriously: callers re-check their condition)
  kChanged,         // the word no longer held the expected value: the condition may already hold
  kTimedOut,        // the timeout passed
  kUnsupported,     // futex_waitv is not available on this kernel (ENOSYS)
  kTooManyWaiters,  // FutexWaitMany got more than kMaxFutexWaiters words: it did not sleep
};

// Sleeps while `*word == expected`, at most `timeout` (negative: no limit).
WaitResult FutexWait(const std::atomic<uint32_t>* word, uint32_t expected,
                     std::chrono::nanoseconds timeout, FutexScope scope = FutexScope::kShared);

// Wakes up to `count` sleepers on `word`. Returns how many were woken.
int FutexWake(const std::atomic<uint32_t>* word, int count = INT32_MAX,
              FutexScope scope = FutexScope::kShared);

// One entry of a vectorized wait.
struct FutexWaiter {
  const std::atomic<uint32_t>* word;
  uint32_t expected;
  FutexScope scope;
};

// The kernel's limit on entries in one FutexWaitMany call (FUTEX_WAITV_MAX).
inline constexpr size_t kMaxFutexWaiters = 128;

// Sleeps until any of `waiters` is woken or no longer holds its expected value, at most
// `timeout` (negative: no limit). Uses futex_waitv (Linux >= 5.16); returns kUnsupported when
// the kernel lacks it, so the caller can fall back to a timed sleep loop. More than
// kMaxFutexWaiters words is a caller's bug: it returns kTooManyWaiters at once without sleeping
// (watching only some of the words could sleep through a wake of the others).
WaitResult FutexWaitMany(std::span<const FutexWaiter> waiters, std::chrono::nanoseconds timeout);

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

}  // namespace kvagent::ipc

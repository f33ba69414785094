#include "copy_helpers.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "kvagent/ipc/frame_ring.h"
#include "stream_copy.h"

namespace kvagent::agent {
namespace {

// Spins (pause instructions) before a thread sleeps on its futex: a share of a large value takes
// tens of microseconds, a futex wake-up about as long.
constexpr int kSpins = 4000;

// Waits until `word` differs from `seen` (acquire); `stop` ends the wait early when set.
uint32_t AwaitChange(const std::atomic<uint32_t>& word, uint32_t seen,
                     const std::atomic<bool>* stop) {
  for (int spin = 0;; ++spin) {
    const uint32_t now = word.load(std::memory_order_acquire);
    if (now != seen || (stop != nullptr && stop->load(std::memory_order_acquire))) return now;
    if (spin < kSpins) {
      ipc::CpuRelax();
    } else {
      word.wait(seen, std::memory_order_acquire);
    }
  }
}

}  // namespace

CopyHelpers::CopyHelpers(unsigned threads) {
  for (unsigned i = 1; i < std::min(threads, kMaxThreads); ++i) {
    auto h = std::make_unique<Helper>();
    Helper* raw = h.get();
    h->thread = std::thread([this, raw] { Run(raw); });
    helpers_.push_back(std::move(h));
  }
}

CopyHelpers::~CopyHelpers() {
  stop_.store(true, std::memory_order_release);
  for (auto& h : helpers_) {
    h->posted.fetch_add(1, std::memory_order_release);
    h->posted.notify_one();
  }
  for (auto& h : helpers_) h->thread.join();
}

uint32_t CopyHelpers::CopyShare(const Share& s) {
  if (s.n == 0) return 0;  // memcpy's pointers must be valid even for no bytes
  if (s.checksum) return CopyWithCrc32c(s.dst, s.src, s.n, s.stores);
  if (s.stores == CopyStores::kStreaming) {
    StreamCopy(s.dst, s.src, s.n);
  } else {
    std::memcpy(s.dst, s.src, s.n);
  }
  return 0;
}

void CopyHelpers::Run(Helper* h) {
  pthread_setname_np(pthread_self(), "kvagent-copy");  // itself: no /proc descriptor opened
  uint32_t seen = 0;
  while (true) {
    const uint32_t posted = AwaitChange(h->posted, seen, &stop_);
    if (stop_.load(std::memory_order_acquire)) return;
    seen = posted;
    h->share.crc = CopyShare(h->share);
    h->finished.store(seen, std::memory_order_release);
    h->finished.notify_one();
  }
}

uint32_t CopyHelpers::Copy(uint8_t* dst, const uint8_t* src, size_t n, CopyStores stores,
                           bool checksum, PrefetchRange next) {
  if (n == 0) {  // nothing to copy (the pointers may be null); the CRC of no bytes is 0
    PrefetchStart(next);
    return 0;
  }
  const size_t shares = std::min<size_t>(helpers_.size() + 1, n / (kSplitMinBytes / 2));
  if (shares < 2) {
    if (checksum) return CopyWithCrc32c(dst, src, n, stores, 0, next);
    CopyShare(Share{dst, src, n, stores, false, 0});
    PrefetchStart(next);
    return 0;
  }
  // Share boundaries on cache lines of the destination: no line is stored by two threads.
  std::array<size_t, kMaxThreads + 1> bounds;  // on the stack: no allocation per copy
  bounds[0] = 0;
  bounds[shares] = n;
  const auto base = reinterpret_cast<uintptr_t>(dst);
  for (size_t i = 1; i < shares; ++i) {
    const uintptr_t at = (base + n / shares * i) & ~uintptr_t{63};
    bounds[i] = std::max(bounds[i - 1], static_cast<size_t>(at - base));
  }
  // Hand shares 1.. to helpers, copy share 0 here, then collect.
  for (size_t i = 1; i < shares; ++i) {
    Helper& h = *helpers_[i - 1];
    h.share =
        Share{dst + bounds[i], src + bounds[i], bounds[i + 1] - bounds[i], stores, checksum, 0};
    h.posted.fetch_add(1, std::memory_order_release);
    h.posted.notify_one();
  }
  uint32_t crc = CopyShare(Share{dst, src, bounds[1], stores, checksum, 0});
  for (size_t i = 1; i < shares; ++i) {
    Helper& h = *helpers_[i - 1];
    const uint32_t want = h.posted.load(std::memory_order_relaxed);
    uint32_t done = h.finished.load(std::memory_order_acquire);
    while (done != want) done = AwaitChange(h.finished, done, nullptr);
    if (checksum) crc = Crc32cCombine(crc, h.share.crc, bounds[i + 1] - bounds[i]);
  }
  PrefetchStart(next);
  return crc;
}

}  // namespace kvagent::agent

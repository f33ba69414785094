#include "copy_helpers.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "kvagent/ipc/frame_ring.h"
#include "stream_copy.h"

namespace kvagent::agent {
namespace {

// Spins (pause instructions) before a thread sleeps on its futex: a chunk takes microseconds, a
// futex wake-up tens of them.
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

// The claim word: generation (32 bits), chunks of the job (16), next chunk to claim (16).
constexpr uint32_t kMaxChunks = 0xFFFF;
constexpr uint64_t ClaimWord(uint32_t generation, uint32_t chunks, uint32_t next) {
  return (uint64_t{generation} << 32) | (uint64_t{chunks} << 16) | next;
}
constexpr uint32_t ChunksOf(uint64_t w) { return static_cast<uint32_t>(w >> 16) & 0xFFFF; }
constexpr uint32_t NextOf(uint64_t w) { return static_cast<uint32_t>(w) & 0xFFFF; }

// One piece of a copy, on the calling thread.
uint32_t CopyPiece(uint8_t* dst, const uint8_t* src, size_t n, CopyStores stores, bool checksum) {
  if (n == 0) return 0;  // memcpy's pointers must be valid even for no bytes
  if (checksum) return CopyWithCrc32c(dst, src, n, stores);
  if (stores != CopyStores::kCached) {
    StreamCopy(dst, src, n, /*fence=*/stores == CopyStores::kStreaming);
  } else {
    std::memcpy(dst, src, n);
  }
  return 0;
}

}  // namespace

CopyHelpers::CopyHelpers(unsigned threads, Sharing sharing)
    : shifter_(Crc32cShifter(kChunkBytes)), sharing_(sharing) {
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

void CopyHelpers::ChunkBounds(const Job& job, uint32_t i, size_t* begin, size_t* end) {
  const auto base = reinterpret_cast<uintptr_t>(job.dst);
  const auto bound = [&](uint32_t k) -> size_t {
    if (k == 0) return 0;
    if (k >= job.chunks) return job.n;
    return static_cast<size_t>(((base + size_t{k} * kChunkBytes) & ~uintptr_t{63}) - base);
  };
  *begin = bound(i);
  *end = bound(i + 1);
}

void CopyHelpers::Work() {
  uint64_t w = claim_.load(std::memory_order_acquire);
  while (NextOf(w) < ChunksOf(w)) {
    // Only a chunk of the job `w` names: the job stays as it is until that chunk is done.
    if (!claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;
    }
    const uint32_t i = NextOf(w);
    size_t begin = 0, end = 0;
    ChunkBounds(job_, i, &begin, &end);
    job_.crc[i] =
        CopyPiece(job_.dst + begin, job_.src + begin, end - begin, job_.stores, job_.checksum);
    done_.fetch_add(1, std::memory_order_release);
    done_.notify_one();
    w = claim_.load(std::memory_order_acquire);
  }
}

void CopyHelpers::Run(Helper* h) {
  pthread_setname_np(pthread_self(), "kvagent-copy");  // itself: no /proc descriptor opened
  uint32_t seen = 0;
  while (true) {
    seen = AwaitChange(h->posted, seen, &stop_);
    if (stop_.load(std::memory_order_acquire)) return;
    Work();  // a late wake-up may find the copy done, or help with the next one
  }
}

uint32_t CopyHelpers::Copy(uint8_t* dst, const uint8_t* src, size_t n, CopyStores stores,
                           bool checksum, PrefetchRange next) {
  const size_t chunks = (n + kChunkBytes - 1) / kChunkBytes;
  const bool large = !helpers_.empty() && n >= kSplitMinBytes && chunks <= kMaxChunks;
  const bool by_rate = sharing_ == Sharing::kByRate;
  const bool probe =
      large && by_rate && (large_copies_++ < kFirstProbes || large_copies_ % kProbeEvery == 0);
  if (!large || probe ||
      (by_rate && static_cast<double>(n) * alone_ns_per_byte_ < kShareMinNanos)) {
    // Timed only when the rate is wanted: a clock read costs ~30 ns on a VM, a 4 KiB copy ~100.
    const auto start =
        large ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    const uint32_t crc = checksum && n > 0 ? CopyWithCrc32c(dst, src, n, stores, 0, next)
                                           : CopyPiece(dst, src, n, stores, false);
    if (!checksum || n == 0) PrefetchStart(next);
    if (large) {  // the rate of one thread, for the next choice
      const std::chrono::duration<double, std::nano> took =
          std::chrono::steady_clock::now() - start;
      const double sample = took.count() / static_cast<double>(n);
      // A slow sample (the thread preempted, a page fault) raises the rate by a quarter at
      // most; a fast one is taken as is: the rate is what one thread can do.
      alone_ns_per_byte_ =
          alone_ns_per_byte_ == 0 ? sample : std::min(sample, 1.25 * alone_ns_per_byte_);
    }
    return crc;
  }
  // No chunk of the previous copy is left to claim or being copied: the job can change.
  job_.dst = dst;
  job_.src = src;
  job_.n = n;
  job_.chunks = static_cast<uint32_t>(chunks);
  // Each thread fences its own chunks before it counts them done: the bytes of a shared copy are
  // visible when Copy returns, even with kStreamingUnfenced.
  job_.stores = stores == CopyStores::kCached ? stores : CopyStores::kStreaming;
  job_.checksum = checksum;
  if (job_.crc.size() < chunks) job_.crc.resize(chunks);  // grows to the largest value once
  done_.store(0, std::memory_order_relaxed);
  claim_.store(ClaimWord(++generation_, job_.chunks, 0), std::memory_order_release);
  const size_t wake = std::min(helpers_.size(), chunks - 1);
  for (size_t i = 0; i < wake; ++i) {
    helpers_[i]->posted.fetch_add(1, std::memory_order_release);
    helpers_[i]->posted.notify_one();
  }
  Work();
  // The chunks helpers are copying now.
  for (uint32_t d = done_.load(std::memory_order_acquire); d != job_.chunks;) {
    d = AwaitChange(done_, d, nullptr);
  }
  uint32_t crc = 0;
  if (checksum) {
    crc = job_.crc[0];
    for (uint32_t i = 1; i < job_.chunks; ++i) {
      size_t begin = 0, end = 0;
      ChunkBounds(job_, i, &begin, &end);
      const uint32_t shifter = end - begin == kChunkBytes ? shifter_ : Crc32cShifter(end - begin);
      crc = Crc32cShift(crc, shifter) ^ job_.crc[i];
    }
  }
  PrefetchStart(next);
  return crc;
}

}  // namespace kvagent::agent

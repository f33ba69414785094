// Large local copies shared among threads: a value of kSplitMinBytes or more is cut into chunks
// of kChunkBytes, which the service thread and a few helper threads claim one at a time, each
// copying its chunk and taking its CRC32C; the chunks' CRCs are combined in order.
//
// One thread copies at most ~8-20 GB/s (its own load/store bandwidth, or the CRC's rate), below
// a node's memory bandwidth; a put or get of a value of megabytes otherwise holds the service
// thread for hundreds of microseconds. Claiming chunks, rather than handing each thread a fixed
// share, means the caller never waits for a helper that has not started: a helper that wakes
// late (its CPU busy with the engine's thread, a slow futex wake-up) finds fewer chunks left, or
// none, and the caller has copied them itself. The caller waits only for chunks a helper is
// copying at that moment. So a copy with helpers is about as fast as one without when they cannot
// run, and faster when they can.
//
// Whether a large value is shared at all depends on how long one thread would take: sharing
// pays when the copy is long against a helper's wake-up (tens of microseconds on a VM). The
// caller times the large copies it makes alone and shares a value only when that rate says it
// would take kShareMinNanos or more alone (the first few large copies, then one in kProbeEvery,
// are made alone to keep the rate current; a slow sample moves it up a quarter at most, since
// preemption only ever makes a copy look slower). On a VM whose memcpy runs at ~6 GB/s a 1 MiB
// value is shared; at ~20 GB/s it is copied alone and only larger ones are shared.
//
// Threads: Copy() is called from one thread at a time (the service thread); helpers spin briefly
// after a copy, then sleep on a futex (std::atomic::wait), so idle helpers cost nothing.
// Memory order: a helper's non-temporal stores are fenced (sfence) by the copy routine before it
// counts its chunk done (release); the caller acquires the count of every chunk before it
// returns, so a copy's bytes are visible to whoever the caller tells next.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "kvagent/common/checksum.h"

namespace kvagent::agent {

class CopyHelpers {
 public:
  // Values from this size on are shared among the threads.
  static constexpr size_t kSplitMinBytes = 256 * 1024;
  // What a thread claims at a time (chunk boundaries fall on cache lines of the destination).
  static constexpr size_t kChunkBytes = 64 * 1024;
  // The most threads one copy is shared among (the caller included); --copy-threads' cap.
  static constexpr unsigned kMaxThreads = 64;
  // A value is shared when one thread would take this long to copy it (nanoseconds).
  static constexpr double kShareMinNanos = 150'000;
  // The first kFirstProbes copies of kSplitMinBytes or more, then one in kProbeEvery, are made
  // alone and timed.
  static constexpr uint32_t kFirstProbes = 8;
  static constexpr uint32_t kProbeEvery = 64;

  // When a value of kSplitMinBytes or more is shared: by the rate of one thread (as above), or
  // always (tests of the sharing itself).
  enum class Sharing { kByRate, kAlways };

  // `threads` copy a large value together: the caller and threads - 1 helpers (1 or less: the
  // caller alone, no helper thread; more than kMaxThreads: kMaxThreads).
  explicit CopyHelpers(unsigned threads, Sharing sharing = Sharing::kByRate);
  ~CopyHelpers();
  CopyHelpers(const CopyHelpers&) = delete;
  CopyHelpers& operator=(const CopyHelpers&) = delete;

  unsigned threads() const { return static_cast<unsigned>(helpers_.size()) + 1; }

  // Copies n bytes from src to dst (no overlap) with `stores`; returns the CRC32C of the bytes
  // when `checksum` (else 0). Values of kSplitMinBytes or more are shared among the threads.
  // `next` (may be empty) is prefetched as CopyWithCrc32c does. kStreamingUnfenced: a value
  // copied by the caller alone needs its FenceStreamingStores() (checksum.h); a shared one is
  // fenced by every thread that copied a chunk.
  uint32_t Copy(uint8_t* dst, const uint8_t* src, size_t n, CopyStores stores, bool checksum,
                PrefetchRange next = {});

 private:
  // The copy being shared. Written by the caller while no chunk of it can be claimed (before
  // `claim` names its generation), read by whoever claims a chunk of it.
  struct Job {
    uint8_t* dst = nullptr;
    const uint8_t* src = nullptr;
    size_t n = 0;
    uint32_t chunks = 0;
    CopyStores stores = CopyStores::kCached;
    bool checksum = false;
    std::vector<uint32_t> crc;  // per chunk
  };
  struct Helper {
    std::atomic<uint32_t> posted{0};  // the caller's count of copies announced to this helper
    std::thread thread;
  };

  // [begin, end) of chunk i of `job` (boundaries on cache lines of the destination).
  static void ChunkBounds(const Job& job, uint32_t i, size_t* begin, size_t* end);
  // Claims and copies chunks of the current job until none is left.
  void Work();
  void Run(Helper* h);

  std::vector<std::unique_ptr<Helper>> helpers_;
  std::atomic<bool> stop_{false};
  Job job_;
  // (generation << 32) | next chunk to claim. A claim is a compare-and-swap that keeps the
  // generation: a helper that read the job of an earlier copy can never claim a chunk of a later.
  std::atomic<uint64_t> claim_{0};
  std::atomic<uint32_t> done_{0};  // chunks of the current job copied
  uint32_t generation_ = 0;
  uint32_t shifter_ = 0;  // Crc32cShifter(kChunkBytes)
  const Sharing sharing_;
  uint32_t large_copies_ = 0;     // copies of kSplitMinBytes or more
  double alone_ns_per_byte_ = 0;  // of the large copies made alone (moving average; 0: none yet)
};

}  // namespace kvagent::agent

// Large local copies split across threads: the service thread and a few helper threads each copy
// one contiguous share of a value (and take its share's CRC32C), the shares' CRCs are combined.
//
// One thread copies at most ~8-10 GB/s (its own load/store bandwidth, or the CRC's rate), far
// below a node's memory bandwidth; a put or get of a value of megabytes otherwise holds the
// service thread for hundreds of microseconds at that rate. Below kSplitMinBytes the hand-off
// (waking a helper) costs more than it saves, and the caller copies alone.
//
// Threads: Copy() is called from one thread at a time (the service thread); helpers spin briefly
// after a share, then sleep on a futex (std::atomic::wait), so idle helpers cost nothing.
// Memory order: a helper's non-temporal stores are fenced (sfence) by the copy routine before the
// helper publishes its completion (release); the caller acquires every completion before it
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
  // Values from this size on are split (each share at least half of it).
  static constexpr size_t kSplitMinBytes = 256 * 1024;
  // The most threads one copy is split across (the caller included); --copy-threads' cap.
  static constexpr unsigned kMaxThreads = 64;

  // `threads` copy a large value together: the caller and threads - 1 helpers (1 or less: the
  // caller alone, no helper thread; more than kMaxThreads: kMaxThreads).
  explicit CopyHelpers(unsigned threads);
  ~CopyHelpers();
  CopyHelpers(const CopyHelpers&) = delete;
  CopyHelpers& operator=(const CopyHelpers&) = delete;

  unsigned threads() const { return static_cast<unsigned>(helpers_.size()) + 1; }

  // Copies n bytes from src to dst (no overlap) with `stores`; returns the CRC32C of the bytes
  // when `checksum` (else 0). Values of kSplitMinBytes or more are split across the threads.
  // `next` (may be empty) is prefetched as CopyWithCrc32c does.
  uint32_t Copy(uint8_t* dst, const uint8_t* src, size_t n, CopyStores stores, bool checksum,
                PrefetchRange next = {});

 private:
  struct Share {
    uint8_t* dst = nullptr;
    const uint8_t* src = nullptr;
    size_t n = 0;
    CopyStores stores = CopyStores::kCached;
    bool checksum = false;
    uint32_t crc = 0;
  };
  struct Helper {
    Share share;                        // written by the caller before `posted`, read after
    std::atomic<uint32_t> posted{0};    // the caller's count of shares handed over
    std::atomic<uint32_t> finished{0};  // the helper's count of shares done
    std::thread thread;
  };

  static uint32_t CopyShare(const Share& s);
  void Run(Helper* h);

  std::vector<std::unique_ptr<Helper>> helpers_;
  std::atomic<bool> stop_{false};
};

}  // namespace kvagent::agent

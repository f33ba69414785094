// NodePool: the node's share of the store's memory, mounted at the master as its pool.
//
// One anonymous mapping of `--pool-size` bytes, created once at agent start and unmapped by the
// destructor. Every page is faulted in by Create (MADV_POPULATE_WRITE, or a write per page on
// kernels without it), so no request ever pays a page fault: a memcpy into never-touched pages
// runs at ~1.5 GB/s on the reference VM, into resident pages at DRAM speed (research note
// ipc-anchors.md 5.3). Huge pages are used when the system has them (2 MiB MAP_HUGETLB pages from
// the hugetlb pool, else transparent huge pages via MADV_HUGEPAGE); Create logs which in one
// line, and how long pre-faulting took.
//
// The pool holds bytes only; which ranges are in use is the master's allocator's business.
// Thread-safety: the accessors are const and safe from any thread; the bytes themselves are
// written by the data plane and by the agent's pipeline at offsets the master handed out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kvagent/common/format.h"  // FormatBytes, used with pool sizes
#include "kvagent/common/status.h"

namespace kvagent::transfer {

inline constexpr uint64_t kDefaultPoolBytes = uint64_t{1} << 30;  // --pool-size default: 1 GiB

struct NodePoolOptions {
  uint64_t size_bytes = kDefaultPoolBytes;  // --pool-size; rounded up to whole pages
  bool huge_pages = true;  // try MAP_HUGETLB 2 MiB pages, then THP; false: 4 KiB pages only
  bool mlock = false;      // --pool-mlock: pin the pool; fails Create when RLIMIT_MEMLOCK is short
};

// How the pool's pages are backed; named in the startup log line and in stats.
enum class PoolPages {
  kHugetlb2M,        // MAP_HUGETLB, 2 MiB pages reserved from /proc/sys/vm/nr_hugepages
  kTransparentHuge,  // MADV_HUGEPAGE accepted: the kernel backs 2 MiB-aligned ranges with THP
  kSmall,            // 4 KiB pages (huge pages off, or neither mechanism available)
};
std::string_view PoolPagesName(PoolPages pages);

class NodePool {
 public:
  // Maps, pre-faults and (when asked) mlocks the pool. Errors: INVALID_PARAMS for a zero size;
  // NO_SPACE when the mapping or pre-faulting fails for lack of memory (message names the size
  // and suggests a smaller --pool-size); INTERNAL with the RLIMIT_MEMLOCK hint when mlock fails.
  // The caller owns the returned pool; the pool owns the mapping.
  [[nodiscard]] static Result<std::unique_ptr<NodePool>> Create(const NodePoolOptions& options);

  // Create in two steps, so that the agent can bind its ports and check its run dir before
  // spending minutes pre-faulting a large pool: Map reserves the mapping (no page is touched);
  // Prefault faults every page in, in steps of at most 1 GiB, calling `progress(faulted, total)`
  // before the first step and after each (to tell systemd, EXTEND_TIMEOUT_USEC), then mlocks
  // when options.mlock. Errors as Create's.
  using PrefaultProgress = std::function<void(uint64_t faulted_bytes, uint64_t total_bytes)>;
  [[nodiscard]] static Result<std::unique_ptr<NodePool>> Map(const NodePoolOptions& options);
  [[nodiscard]] Status Prefault(const PrefaultProgress& progress = {});

  ~NodePool();  // munmap (which also drops the mlock)
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  // First byte of the pool; valid until the pool is destroyed. Offsets handed out by the master
  // are relative to this address.
  uint8_t* base() const { return base_; }
  // Usable bytes (options.size_bytes rounded up to whole pages of the kind in use).
  uint64_t size() const { return size_; }
  PoolPages pages() const { return pages_; }
  uint64_t page_bytes() const { return page_bytes_; }
  bool locked() const { return locked_; }
  // Wall time Create spent faulting every page in, for the startup log and benchmarks.
  double prefault_seconds() const { return prefault_seconds_; }

  // OK when [offset, offset + length) lies inside the pool and length >= 1 (overflow-safe);
  // otherwise BUFFER_OUT_OF_RANGE naming the range and the pool size.
  [[nodiscard]] Status CheckRange(uint64_t offset, uint64_t length) const;

 private:
  NodePool(uint8_t* base, uint64_t size, uint64_t mapped_bytes, PoolPages pages,
           uint64_t page_bytes);

  uint8_t* base_;
  uint64_t size_;
  uint64_t mapped_bytes_;  // what munmap must release (may exceed size_ for alignment)
  PoolPages pages_;
  uint64_t page_bytes_;
  bool locked_ = false;
  bool mlock_wanted_ = false;
  double prefault_seconds_ = 0;
};

// The pure bounds rule behind NodePool::CheckRange, shared with the data server and the RDMA
// client (which must refuse a range before the NIC sees it). `what` names the range's owner in
// the message, e.g. "pool of tcp://10.0.0.2:7100".
[[nodiscard]] Status CheckPoolRange(uint64_t offset, uint64_t length, uint64_t pool_size,
                                    std::string_view what);

}  // namespace kvagent::transfer

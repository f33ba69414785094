#include "kvagent/transfer/node_pool.h"

#include "kvagent/common/format.h"

#include <glog/logging.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << 26)  // log2(2 MiB) << MAP_HUGE_SHIFT
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL and we touch pages
#endif

namespace kvagent::transfer {
namespace {

constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

uint64_t RoundUp(uint64_t value, uint64_t unit) { return (value + unit - 1) / unit * unit; }

std::string ErrnoText(int err) { return std::strerror(err); }

// The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled ("always [madvise] never"),
// or "" when the file is missing (no THP support in the kernel).
std::string ThpMode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "";
  auto open = line.find('[');
  auto close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

std::string MemlockHint(uint64_t pool_bytes) {
  struct rlimit limit {};
  std::string current = "unknown";
  if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0) {
    current = limit.rlim_cur == RLIM_INFINITY ? "unlimited" : FormatBytes(limit.rlim_cur);
  }
  return "RLIMIT_MEMLOCK is " + current + " and the pool needs " + FormatBytes(pool_bytes) +
         "; set LimitMEMLOCK=infinity in kvagent.service (or `ulimit -l unlimited` before "
         "starting kvagent), or run without --pool-mlock";
}

}  // namespace

std::string_view PoolPagesName(PoolPages pages) {
  switch (pages) {
    case PoolPages::kHugetlb2M:
      return "2 MiB hugetlb pages (MAP_HUGETLB)";
    case PoolPages::kTransparentHuge:
      return "transparent huge pages (MADV_HUGEPAGE)";
    case PoolPages::kSmall:
      return "4 KiB pages";
  }
  return "unknown pages";
}

Status CheckPoolRange(uint64_t offset, uint64_t length, uint64_t pool_size, std::string_view what) {
  if (length == 0) {
    return Status(ErrorCode::kBufferOutOfRange,
                  "zero-length range at offset " + std::to_string(offset) + " in the " +
                      std::string(what) + "; every transfer moves at least one byte");
  }
  if (offset > pool_size || length > pool_size - offset) {
    return Status(ErrorCode::kBufferOutOfRange,
                  "range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                      ") is outside the " + std::string(what) + " (" + std::to_string(pool_size) +
                      " bytes); use the offset and size the master's placement gave");
  }
  return Status::Ok();
}

NodePool::NodePool(uint8_t* base, uint64_t size, uint64_t mapped_bytes, PoolPages pages,
                   uint64_t page_bytes)
    : base_(base),
      size_(size),
      mapped_bytes_(mapped_bytes),
      pages_(pages),
      page_bytes_(page_bytes) {}

NodePool::~NodePool() {
  if (base_ != nullptr) munmap(base_, mapped_bytes_);
}

Status NodePool::CheckRange(uint64_t offset, uint64_t length) const {
  return CheckPoolRange(offset, length, size_, "node pool");
}

Result<std::unique_ptr<NodePool>> NodePool::Map(const NodePoolOptions& options) {
  if (options.size_bytes == 0) {
    return InvalidParams("--pool-size is 0; give the pool at least one page (default 1GiB)");
  }
  std::unique_ptr<NodePool> pool;
  // Why the pool did not get the better kind of page, for the one startup line.
  std::string no_hugetlb;
  std::string no_thp;
  const std::string thp = ThpMode();

  if (options.huge_pages) {
    const uint64_t size = RoundUp(options.size_bytes, kHugePageBytes);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB, -1, 0);
    if (p != MAP_FAILED) {
      pool.reset(new NodePool(static_cast<uint8_t*>(p), size, size, PoolPages::kHugetlb2M,
                              kHugePageBytes));
    } else {
      no_hugetlb =
          "MAP_HUGETLB failed: " + ErrnoText(errno) + "; reserve them with vm.nr_hugepages";
    }
  }

  if (!pool) {
    const uint64_t small_page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t size = RoundUp(options.size_bytes, small_page);
    const bool try_thp = options.huge_pages && (thp == "always" || thp == "madvise");
    // THP backs only 2 MiB-aligned 2 MiB ranges: over-map by one huge page and trim the head and
    // tail so that the pool starts on a huge-page boundary.
    const uint64_t slack = try_thp ? kHugePageBytes : 0;
    void* p =
        mmap(nullptr, size + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return Status(ErrorCode::kNoSpace, "cannot map a " + FormatBytes(size) + " node pool (" +
                                             ErrnoText(errno) + "); lower --pool-size");
    }
    auto* raw = static_cast<uint8_t*>(p);
    uint8_t* base = raw;
    if (slack != 0) {
      base = reinterpret_cast<uint8_t*>(RoundUp(reinterpret_cast<uintptr_t>(raw), slack));
      const uint64_t head = static_cast<uint64_t>(base - raw);
      if (head != 0) munmap(raw, head);
      const uint64_t tail = slack - head;
      if (tail != 0) munmap(base + size, tail);
    }
    PoolPages pages = PoolPages::kSmall;
    if (try_thp && madvise(base, size, MADV_HUGEPAGE) == 0) {
      pages = PoolPages::kTransparentHuge;
    } else if (options.huge_pages) {
      no_thp = thp.empty() ? "not in this kernel"
               : try_thp   ? "MADV_HUGEPAGE failed: " + ErrnoText(errno)
                           : "set to [" + thp + "]";
    }
    pool.reset(new NodePool(base, size, size, pages, small_page));
  }

  std::string line = "NodePool: " + FormatBytes(pool->size_) + " backed by " +
                     std::string(PoolPagesName(pool->pages_));
  if (pool->pages_ == PoolPages::kTransparentHuge) {
    line += " (THP mode [" + thp + "]); no hugetlb pages: " + no_hugetlb;
  } else if (pool->pages_ == PoolPages::kSmall && !options.huge_pages) {
    line += " (huge pages off by configuration)";
  } else if (pool->pages_ == PoolPages::kSmall) {
    line += "; no hugetlb pages: " + no_hugetlb + "; no transparent huge pages: " + no_thp;
  }
  LOG(INFO) << line;

  pool->mlock_wanted_ = options.mlock;
  return pool;
}

Status NodePool::Prefault(const PrefaultProgress& progress) {
  // Pre-fault every page now so that requests never take a fault. MADV_POPULATE_WRITE does it
  // in the kernel, one step of at most 1 GiB at a time (progress in between); without it, write
  // one byte per page (a read would only map the shared zero page).
  constexpr uint64_t kStep = uint64_t{1} << 30;
  const auto start = std::chrono::steady_clock::now();
  const char* method = "MADV_POPULATE_WRITE";
  if (progress) progress(0, size_);
  for (uint64_t done = 0; done < size_;) {
    const uint64_t step = std::min(kStep, size_ - done);
    if (madvise(base_ + done, step, MADV_POPULATE_WRITE) != 0) {
      if (errno != EINVAL) {
        return Status(ErrorCode::kNoSpace, "cannot fault in the " + FormatBytes(size_) +
                                               " node pool (" + ErrnoText(errno) +
                                               "); lower --pool-size or free memory");
      }
      method = "a write per page";
      volatile uint8_t* bytes = base_;
      for (uint64_t off = done; off < done + step; off += page_bytes_) bytes[off] = 0;
    }
    done += step;
    if (progress) progress(done, size_);
  }
  prefault_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double gbps =
      prefault_seconds_ > 0 ? static_cast<double>(size_) / prefault_seconds_ / 1e9 : 0;
  char timing[96];
  std::snprintf(timing, sizeof(timing), "%.3f s (%.2f GB/s)", prefault_seconds_, gbps);
  LOG(INFO) << "NodePool: pre-faulted " << FormatBytes(size_) << " in " << timing << " via "
            << method;

  if (mlock_wanted_) {
    // The raw syscall, not mlock(): sanitizer runtimes replace mlock() with a no-op, and the
    // pool must really be locked (or the failure really reported) in every build.
    if (syscall(SYS_mlock, base_, size_) != 0) {
      return Internal("cannot mlock the " + FormatBytes(size_) + " node pool (" + ErrnoText(errno) +
                      "): " + MemlockHint(size_));
    }
    locked_ = true;
    LOG(INFO) << "NodePool: locked in memory (mlock)";
  }
  return Status::Ok();
}

Result<std::unique_ptr<NodePool>> NodePool::Create(const NodePoolOptions& options) {
  auto pool = Map(options);
  if (!pool.ok()) return pool.status();
  KVAGENT_RETURN_IF_ERROR((*pool)->Prefault());
  return pool;
}

}  // namespace kvagent::transfer

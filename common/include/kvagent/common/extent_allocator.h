// ExtentAllocator: best-fit allocation of byte ranges inside [0, size), by offset only. It never
// touches the memory the ranges name; the client's arena (ipc::ArenaAllocator) and the master's
// map of a mounted pool (master::PoolAllocator) are both this one allocator.
//
// Best fit over the free extents (the smallest extent that fits, the lowest offset on ties)
// keeps large extents whole for large values; an allocation splits an extent, and freeing
// coalesces with both free neighbours, so free extents never touch. A run of same-sized values
// (KV blocks, the common case) freed in any order therefore returns to one extent;
// fragmentation shows only with long-lived mixed sizes, and then largest_free() says how large
// the largest free extent is. Allocate, AllocateAt and Free are O(log f), f = free extents;
// allocated ranges cost no memory here (the caller records them, with their lengths).
//
// Alignment: every offset and every length is a multiple of `alignment` (a power of two).
//
// Not thread-safe: one owner (ArenaAllocator locks around it; the master's single thread owns
// its pools). Movable, not copyable.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace kvagent {

class ExtentAllocator {
 public:
  // [0, size rounded down to `alignment`), all free. `alignment` must be a power of two.
  ExtentAllocator(uint64_t size, uint64_t alignment);

  ExtentAllocator(const ExtentAllocator&) = delete;
  ExtentAllocator& operator=(const ExtentAllocator&) = delete;
  ExtentAllocator(ExtentAllocator&&) = default;
  ExtentAllocator& operator=(ExtentAllocator&&) = default;

  // `length` rounded up to the alignment; 0 counts as one alignment unit.
  uint64_t Rounded(uint64_t length) const {
    return length == 0 ? alignment_ : (length + alignment_ - 1) & ~(alignment_ - 1);
  }

  // Reserves Rounded(length) bytes and returns their offset, or nullopt when no free extent is
  // large enough (there may still be that many free bytes in smaller pieces). Allocates no
  // memory of its own: the chosen extent's index nodes are reused for its remainder.
  [[nodiscard]] std::optional<uint64_t> Allocate(uint64_t length);

  // Reserves exactly [offset, offset + Rounded(length)). Returns false, changing nothing, when
  // `offset` is not aligned or any byte of the range is not free.
  [[nodiscard]] bool AllocateAt(uint64_t offset, uint64_t length);

  // Returns [offset, offset + Rounded(length)) to the free space. The range must have come from
  // Allocate/AllocateAt with the same length and not been freed since (checked in debug
  // builds).
  void Free(uint64_t offset, uint64_t length);

  uint64_t size() const { return size_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t used() const { return size_ - free_bytes_; }
  // The largest single allocation that would succeed now (0 when full).
  uint64_t largest_free() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }
  size_t free_extent_count() const { return by_offset_.size(); }

 private:
  void Insert(uint64_t offset, uint64_t length);
  void Erase(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t alignment_;
  uint64_t size_;
  uint64_t free_bytes_;
  // Invariant: both indexes hold the same free extents; no two extents overlap or touch.
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (length, offset)
};

}  // namespace kvagent

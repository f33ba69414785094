// PoolAllocator: the free-space map of one mounted pool (an agent's memory pool).
//
// Offset-based: the master never touches the pool's memory, it only hands out byte ranges
// [offset, offset + length) inside [0, size). The allocator is common/extent_allocator.h's (the
// client's arena uses the same one): best fit over the free blocks (smallest block that fits,
// lowest offset on ties) keeps large blocks whole for large values; freeing coalesces with both
// free neighbours, so free blocks never touch. Allocate and Free are O(log f), f = number of
// free blocks, and allocate no memory on the put path; allocated ranges cost no memory here (the
// caller records them). This class fixes the alignment, so that Rounded needs no allocator.
//
// Alignment: every offset and every length is a multiple of kAlignment = 64 bytes. 64 B is the
// cache line: values written by different writers never share a line (no false sharing while
// two agents memcpy neighbouring values), memcpy runs on aligned lines, and RDMA needs no more.
// 4 KiB pages would waste up to 4 KiB per small value (KV blocks of small models, metadata
// objects) for no gain: the pool is registered once as a whole, never per value.
//
// Not thread-safe: owned by the master's single thread.
#pragma once

#include <cstdint>
#include <optional>

#include "kvagent/common/extent_allocator.h"

namespace kvagent::master {

class PoolAllocator {
 public:
  static constexpr uint64_t kAlignment = 64;

  // A pool of `size` bytes, all free. `size` is rounded down to kAlignment.
  explicit PoolAllocator(uint64_t size) : extents_(size, kAlignment) {}

  PoolAllocator(const PoolAllocator&) = delete;
  PoolAllocator& operator=(const PoolAllocator&) = delete;
  PoolAllocator(PoolAllocator&&) = default;
  PoolAllocator& operator=(PoolAllocator&&) = default;

  // Rounds `length` up to kAlignment (0 counts as kAlignment).
  static constexpr uint64_t Rounded(uint64_t length) {
    return length == 0 ? kAlignment : (length + kAlignment - 1) / kAlignment * kAlignment;
  }

  // Reserves Rounded(length) bytes and returns their offset, or nullopt when no free block is
  // large enough (the pool may still have that many free bytes in smaller pieces).
  [[nodiscard]] std::optional<uint64_t> Allocate(uint64_t length) {
    return extents_.Allocate(length);
  }

  // Reserves exactly [offset, offset + Rounded(length)) (restoring state from the operation
  // log). Returns false, changing nothing, when any byte of the range is not free.
  [[nodiscard]] bool AllocateAt(uint64_t offset, uint64_t length) {
    return extents_.AllocateAt(offset, length);
  }

  // Returns [offset, offset + Rounded(length)) to the free space. The range must have come from
  // Allocate/AllocateAt with the same length and not been freed since (checked in debug builds).
  void Free(uint64_t offset, uint64_t length) { extents_.Free(offset, length); }

  uint64_t size() const { return extents_.size(); }
  uint64_t used() const { return extents_.used(); }
  uint64_t free_bytes() const { return extents_.free_bytes(); }
  // The largest single allocation that would succeed now.
  uint64_t largest_free() const { return extents_.largest_free(); }
  size_t free_block_count() const { return extents_.free_extent_count(); }

 private:
  ExtentAllocator extents_;
};

}  // namespace kvagent::master

// SegmentAllocator: the free-space map of one mounted segment (an agent's memory pool).
//
// Offset-based: the master never touches the segment's memory, it only hands out byte ranges
// [offset, offset + length) inside [0, size). Best fit over the free blocks (smallest block that
// fits, lowest offset on ties) keeps large blocks whole for large values; freeing coalesces with
// both free neighbours, so free blocks never touch. Allocate and Free are O(log f), f = number
// of free blocks; allocated ranges cost no memory here (the caller records them).
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
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace kvagent::master {

class SegmentAllocator {
 public:
  static constexpr uint64_t kAlignment = 64;

  // A segment of `size` bytes, all free. `size` is rounded down to kAlignment.
  explicit SegmentAllocator(uint64_t size);

  SegmentAllocator(const SegmentAllocator&) = delete;
  SegmentAllocator& operator=(const SegmentAllocator&) = delete;
  SegmentAllocator(SegmentAllocator&&) = default;
  SegmentAllocator& operator=(SegmentAllocator&&) = default;

  // Rounds `length` up to kAlignment (0 counts as kAlignment).
  static uint64_t Rounded(uint64_t length);

  // Reserves Rounded(length) bytes and returns their offset, or nullopt when no free block is
  // large enough (the segment may still have that many free bytes in smaller pieces).
  [[nodiscard]] std::optional<uint64_t> Allocate(uint64_t length);

  // Reserves exactly [offset, offset + Rounded(length)) (restoring state from the operation
  // log). Returns false, changing nothing, when any byte of the range is not free.
  [[nodiscard]] bool AllocateAt(uint64_t offset, uint64_t length);

  // Returns [offset, offset + Rounded(length)) to the free space. The range must have come from
  // Allocate/AllocateAt with the same length and not been freed since (checked in debug builds).
  void Free(uint64_t offset, uint64_t length);

  uint64_t size() const { return size_; }
  uint64_t used() const { return size_ - free_bytes_; }
  uint64_t free_bytes() const { return free_bytes_; }
  // The largest single allocation that would succeed now.
  uint64_t largest_free() const;
  size_t free_block_count() const { return by_offset_.size(); }

 private:
  void Insert(uint64_t offset, uint64_t length);
  void Erase(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t size_;
  uint64_t free_bytes_;
  // Invariant: both indexes hold the same free blocks; no two blocks overlap or touch.
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (length, offset)
};

}  // namespace kvagent::master

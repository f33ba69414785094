#include "kvagent/master/segment_allocator.h"

#include <cassert>

namespace kvagent::master {

SegmentAllocator::SegmentAllocator(uint64_t size)
    : size_(size / kAlignment * kAlignment), free_bytes_(size_) {
  if (size_ > 0) Insert(0, size_);
}

uint64_t SegmentAllocator::Rounded(uint64_t length) {
  if (length == 0) return kAlignment;
  return (length + kAlignment - 1) / kAlignment * kAlignment;
}

void SegmentAllocator::Insert(uint64_t offset, uint64_t length) {
  by_offset_.emplace(offset, length);
  by_size_.emplace(length, offset);
}

void SegmentAllocator::Erase(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

std::optional<uint64_t> SegmentAllocator::Allocate(uint64_t length) {
  const uint64_t need = Rounded(length);
  auto best = by_size_.lower_bound({need, 0});
  if (best == by_size_.end()) return std::nullopt;
  const auto [block_len, offset] = *best;
  // Shrink the block in place: reuse both tree nodes instead of freeing and allocating them.
  auto size_node = by_size_.extract(best);
  auto offset_node = by_offset_.extract(offset);
  if (block_len > need) {
    size_node.value() = {block_len - need, offset + need};
    offset_node.key() = offset + need;
    offset_node.mapped() = block_len - need;
    by_size_.insert(std::move(size_node));
    by_offset_.insert(std::move(offset_node));
  }
  free_bytes_ -= need;
  return offset;
}

bool SegmentAllocator::AllocateAt(uint64_t offset, uint64_t length) {
  const uint64_t need = Rounded(length);
  if (offset % kAlignment != 0 || offset > size_ || need > size_ - offset) return false;
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;
  const uint64_t block_off = it->first;
  const uint64_t block_len = it->second;
  if (offset + need > block_off + block_len) return false;
  Erase(it);
  if (offset > block_off) Insert(block_off, offset - block_off);
  if (block_off + block_len > offset + need) {
    Insert(offset + need, block_off + block_len - offset - need);
  }
  free_bytes_ -= need;
  return true;
}

void SegmentAllocator::Free(uint64_t offset, uint64_t length) {
  uint64_t start = offset;
  uint64_t len = Rounded(length);
  assert(start + len <= size_);
  auto next = by_offset_.lower_bound(start);
  assert(next == by_offset_.end() || next->first >= start + len);
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    assert(prev->first + prev->second <= start);
    if (prev->first + prev->second == start) {
      start = prev->first;
      len += prev->second;
      Erase(prev);
    }
  }
  if (next != by_offset_.end() && next->first == offset + Rounded(length)) {
    len += next->second;
    Erase(next);
  }
  Insert(start, len);
  free_bytes_ += Rounded(length);
}

uint64_t SegmentAllocator::largest_free() const {
  if (by_size_.empty()) return 0;
  return by_size_.rbegin()->first;
}

}  // namespace kvagent::master

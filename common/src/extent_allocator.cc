#include "kvagent/common/extent_allocator.h"

#include <cassert>

namespace kvagent {

ExtentAllocator::ExtentAllocator(uint64_t size, uint64_t alignment)
    : alignment_(alignment), size_(size & ~(alignment - 1)), free_bytes_(size_) {
  assert(alignment != 0 && (alignment & (alignment - 1)) == 0);
  if (size_ > 0) Insert(0, size_);
}

void ExtentAllocator::Insert(uint64_t offset, uint64_t length) {
  by_offset_.emplace(offset, length);
  by_size_.emplace(length, offset);
}

void ExtentAllocator::Erase(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

std::optional<uint64_t> ExtentAllocator::Allocate(uint64_t length) {
  const uint64_t need = Rounded(length);
  auto best = by_size_.lower_bound({need, 0});
  if (best == by_size_.end()) return std::nullopt;
  const auto [extent, offset] = *best;
  // Shrink the extent in place: reuse both tree nodes instead of freeing and allocating them.
  auto size_node = by_size_.extract(best);
  auto offset_node = by_offset_.extract(offset);
  if (extent > need) {
    size_node.value() = {extent - need, offset + need};
    offset_node.key() = offset + need;
    offset_node.mapped() = extent - need;
    by_size_.insert(std::move(size_node));
    by_offset_.insert(std::move(offset_node));
  }
  free_bytes_ -= need;
  return offset;
}

bool ExtentAllocator::AllocateAt(uint64_t offset, uint64_t length) {
  const uint64_t need = Rounded(length);
  if ((offset & (alignment_ - 1)) != 0 || offset > size_ || need > size_ - offset) return false;
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;
  const uint64_t extent_offset = it->first;
  const uint64_t extent = it->second;
  if (offset + need > extent_offset + extent) return false;
  Erase(it);
  if (offset > extent_offset) Insert(extent_offset, offset - extent_offset);
  if (extent_offset + extent > offset + need) {
    Insert(offset + need, extent_offset + extent - offset - need);
  }
  free_bytes_ -= need;
  return true;
}

void ExtentAllocator::Free(uint64_t offset, uint64_t length) {
  const uint64_t freed = Rounded(length);
  uint64_t start = offset;
  uint64_t len = freed;
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
  if (next != by_offset_.end() && next->first == offset + freed) {
    len += next->second;
    Erase(next);
  }
  Insert(start, len);
  free_bytes_ += freed;
}

}  // namespace kvagent

#include "kvagent/ipc/arena_allocator.h"

namespace kvagent::ipc {

ArenaAllocator::ArenaAllocator(uint64_t arena_bytes, uint64_t alignment)
    : arena_bytes_(arena_bytes & ~(alignment - 1)), alignment_(alignment) {
  if (arena_bytes_ > 0) InsertFree(0, arena_bytes_);
}

void ArenaAllocator::InsertFree(uint64_t offset, uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
  free_bytes_ += size;
}

void ArenaAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  free_by_offset_.erase(it);
}

Result<uint64_t> ArenaAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidParams("cannot allocate 0 bytes from the arena");
  if (bytes > arena_bytes_) {
    return Status(ErrorCode::kNoSpace, "a buffer of " + std::to_string(bytes) +
                                           " bytes does not fit the " +
                                           std::to_string(arena_bytes_) +
                                           "-byte arena; connect with a larger arena_bytes");
  }
  const uint64_t size = (bytes + alignment_ - 1) & ~(alignment_ - 1);
  std::lock_guard<std::mutex> lock(mu_);
  auto best = free_by_size_.lower_bound({size, 0});
  if (best == free_by_size_.end()) {
    const uint64_t largest = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
    return Status(ErrorCode::kNoSpace,
                  "the arena has no free extent of " + std::to_string(size) + " bytes (" +
                      std::to_string(free_bytes_) + " bytes free, largest extent " +
                      std::to_string(largest) +
                      "); free buffers you no longer need or connect with a larger arena_bytes");
  }
  const uint64_t offset = best->second;
  const uint64_t extent = best->first;
  EraseFree(free_by_offset_.find(offset));
  if (extent > size) InsertFree(offset + size, extent - size);
  allocated_.emplace(offset, size);
  return offset;
}

void ArenaAllocator::Free(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = allocated_.find(offset);
  if (found == allocated_.end()) return;
  uint64_t start = offset;
  uint64_t size = found->second;
  allocated_.erase(found);
  // Coalesce with the following extent, then with the preceding one.
  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.end() && next->first == start + size) {
    size += next->second;
    EraseFree(next);
  }
  auto after = free_by_offset_.lower_bound(start);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(start, size);
}

uint64_t ArenaAllocator::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_bytes_;
}

uint64_t ArenaAllocator::largest_free_extent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

size_t ArenaAllocator::allocated_ranges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_.size();
}

size_t ArenaAllocator::free_extents() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_by_offset_.size();
}

}  // namespace kvagent::ipc

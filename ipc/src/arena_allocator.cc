#include "kvagent/ipc/arena_allocator.h"

#include <string>

namespace kvagent::ipc {

ArenaAllocator::ArenaAllocator(uint64_t arena_bytes, uint64_t alignment)
    : arena_bytes_(arena_bytes & ~(alignment - 1)), extents_(arena_bytes, alignment) {}

Result<uint64_t> ArenaAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidParams("cannot allocate 0 bytes from the arena");
  if (bytes > arena_bytes_) {
    return Status(ErrorCode::kNoSpace, "a buffer of " + std::to_string(bytes) +
                                           " bytes does not fit the " +
                                           std::to_string(arena_bytes_) +
                                           "-byte arena; connect with a larger arena_bytes");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const std::optional<uint64_t> offset = extents_.Allocate(bytes);
  if (!offset) {
    return Status(ErrorCode::kNoSpace,
                  "the arena has no free extent of " + std::to_string(extents_.Rounded(bytes)) +
                      " bytes (" + std::to_string(extents_.free_bytes()) +
                      " bytes free, largest extent " + std::to_string(extents_.largest_free()) +
                      "); free buffers you no longer need or connect with a larger arena_bytes");
  }
  allocated_.emplace(*offset, bytes);
  return *offset;
}

void ArenaAllocator::Free(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = allocated_.find(offset);
  if (found == allocated_.end()) return;
  extents_.Free(offset, found->second);
  allocated_.erase(found);
}

uint64_t ArenaAllocator::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return extents_.free_bytes();
}

uint64_t ArenaAllocator::largest_free_extent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return extents_.largest_free();
}

size_t ArenaAllocator::allocated_ranges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_.size();
}

size_t ArenaAllocator::free_extents() const {
  std::lock_guard<std::mutex> lock(mu_);
  return extents_.free_extent_count();
}

}  // namespace kvagent::ipc

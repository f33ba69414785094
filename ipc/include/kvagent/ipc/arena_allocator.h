// A process-private allocator of byte ranges inside a client's data arena.
//
// Only the client allocates in its own arena (the agent reads and writes the ranges a request
// names, after bounds checks), so this lives in the client's private memory and a mutex is
// fine. Strategy: best fit over the free extents, split on allocation, and coalesce with both
// neighbours on free. Best fit keeps large extents intact for large values, and immediate
// coalescing means that a run of same-sized KV blocks (the common case) freed in any order
// returns to one extent; fragmentation shows up only with long-lived mixed sizes, and then
// Allocate says how large the largest free extent is.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>

#include "kvagent/common/status.h"

namespace kvagent::ipc {

class ArenaAllocator {
 public:
  // Manages [0, arena_bytes); every allocation starts on an `alignment` boundary (power of two).
  explicit ArenaAllocator(uint64_t arena_bytes, uint64_t alignment = 64);
  ArenaAllocator(const ArenaAllocator&) = delete;
  ArenaAllocator& operator=(const ArenaAllocator&) = delete;

  // Reserves `bytes` (> 0) and returns the range's offset. NO_SPACE when no free extent is
  // large enough (the message gives the largest one); INVALID_PARAMS for 0 bytes.
  [[nodiscard]] Result<uint64_t> Allocate(uint64_t bytes);

  // Returns a range obtained from Allocate. Freeing an unknown offset is ignored (and counted as
  // a bug by the caller's tests through allocated_ranges()).
  void Free(uint64_t offset);

  uint64_t arena_bytes() const { return arena_bytes_; }
  uint64_t free_bytes() const;
  uint64_t largest_free_extent() const;
  size_t allocated_ranges() const;
  size_t free_extents() const;

 private:
  void InsertFree(uint64_t offset, uint64_t size);  // requires mu_; no coalescing
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  const uint64_t arena_bytes_;
  const uint64_t alignment_;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_by_offset_;           // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (size, offset), for best fit
  std::unordered_map<uint64_t, uint64_t> allocated_;      // offset -> size
  uint64_t free_bytes_ = 0;
};

}  // namespace kvagent::ipc

// A process-private allocator of byte ranges inside a client's data arena.
//
// Only the client allocates in its own arena (the agent reads and writes the ranges a request
// names, after bounds checks), so this lives in the client's private memory and a mutex is
// fine. The strategy is common/extent_allocator.h's (best fit, split on allocation, coalesce
// with both neighbours on free; the master's pool map is the same allocator): best fit keeps
// large extents intact for large values, and immediate coalescing means that a run of
// same-sized KV blocks (the common case) freed in any order returns to one extent;
// fragmentation shows up only with long-lived mixed sizes, and then Allocate says how large the
// largest free extent is. On top of it this class locks, remembers each range's size (Free
// takes only the offset) and says in its errors what the caller can do.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "kvagent/common/extent_allocator.h"
#include "kvagent/common/status.h"

namespace kvagent::ipc {

// Thread-safe: every member may be called from any thread.
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
  const uint64_t arena_bytes_;  // arena_bytes rounded down to the alignment
  mutable std::mutex mu_;
  ExtentAllocator extents_;                           // guarded by mu_
  std::unordered_map<uint64_t, uint64_t> allocated_;  // offset -> size; guarded by mu_
};

}  // namespace kvagent::ipc

#include "local_memory.h"

#include <mutex>
#include <string>

namespace kvagent::transfer {

Status LocalMemory::Add(const void* addr, uint64_t length) {
  const auto start = reinterpret_cast<uintptr_t>(addr);
  if (addr == nullptr || length == 0 || start + length < start) {
    return InvalidParams("RegisterMemory needs a non-null, non-empty range (got " +
                         std::to_string(length) + " bytes)");
  }
  std::unique_lock lock(mutex_);
  auto next = ranges_.lower_bound(start);
  const bool overlaps_next = next != ranges_.end() && next->first < start + length;
  const bool overlaps_prev =
      next != ranges_.begin() && std::prev(next)->first + std::prev(next)->second > start;
  if (overlaps_next || overlaps_prev) {
    return InvalidParams("RegisterMemory: range of " + std::to_string(length) +
                         " bytes overlaps a registered range; register each arena once");
  }
  ranges_.emplace(start, length);
  return Status::Ok();
}

Status LocalMemory::Remove(const void* addr) {
  std::unique_lock lock(mutex_);
  if (ranges_.erase(reinterpret_cast<uintptr_t>(addr)) == 0) {
    return InvalidParams("UnregisterMemory: no registered range starts at this address");
  }
  return Status::Ok();
}

bool LocalMemory::Contains(const void* addr, uint64_t length) const {
  const auto start = reinterpret_cast<uintptr_t>(addr);
  if (start + length < start) return false;
  std::shared_lock lock(mutex_);
  auto it = ranges_.upper_bound(start);
  if (it == ranges_.begin()) return false;
  --it;
  return start + length <= it->first + it->second;
}

}  // namespace kvagent::transfer

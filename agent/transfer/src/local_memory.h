// LocalMemory: the ranges of this process's memory that ops may use as their local side (the
// node pool and every client arena given to RegisterMemory). The engine checks every op against
// it on every transport, so a pipeline developed on a TCP-only machine already registers what
// RDMA needs.
#pragma once

#include <cstdint>
#include <map>
#include <shared_mutex>

#include "kvagent/common/status.h"

namespace kvagent::transfer {

class LocalMemory {
 public:
  // INVALID_PARAMS for a null or empty range, an address overflow, or an overlap with a
  // registered range.
  [[nodiscard]] Status Add(const void* addr, uint64_t length);
  // INVALID_PARAMS when `addr` does not start a registered range.
  [[nodiscard]] Status Remove(const void* addr);
  // True when [addr, addr + length) lies inside one registered range.
  bool Contains(const void* addr, uint64_t length) const;

 private:
  mutable std::shared_mutex mutex_;
  std::map<uintptr_t, uint64_t> ranges_;  // start -> length; ranges never overlap
};

}  // namespace kvagent::transfer

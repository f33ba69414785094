// The value sizes of the end-to-end tests' writers: key i of a writer asked for SIZE bytes holds
// ValueSize(i, SIZE) bytes, a size in (SIZE/2, SIZE] that differs from key to key, so a value
// read back with another key's length, or into another key's range, never passes the check.
// Shared by e2e_client (which writes and checks) and the tests (which check too).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvagent::testing {

inline size_t ValueSize(uint64_t i, size_t size) {
  if (size < 2) return size;
  return size - static_cast<size_t>((i * 7919) % (size / 2));
}

}  // namespace kvagent::testing

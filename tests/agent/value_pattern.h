// Deterministic value bytes for tests: `size` bytes that depend on `key` and on every position,
// so a value read back under the wrong key, shifted, or cut short never compares equal. Shared
// by the test processes that write and the tests that read back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace kvagent::testing {

inline std::string Pattern(const std::string& key, size_t size) {
  uint64_t x = std::hash<std::string>{}(key) | 1;
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<char>(x);
  }
  return out;
}

}  // namespace kvagent::testing

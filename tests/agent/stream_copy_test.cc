// StreamCopy (agent/src/stream_copy.h): equal to memcpy for every length and alignment around
// the streaming path's edges, and never writes outside the destination range.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "stream_copy.h"

namespace kvagent::agent {
namespace {

TEST(StreamCopy, CopiesEveryLengthAndAlignmentExactlyAndTouchesNothingElse) {
  std::mt19937 rng(7);
  std::vector<uint8_t> src(70000);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  const std::vector<size_t> lengths = {0,    1,    15,   16,   63,    64,    1023,  1024,
                                       1025, 1039, 1088, 4096, 65535, 65536, 65601, 69000};
  for (size_t length : lengths) {
    for (size_t dst_shift = 0; dst_shift < 17; ++dst_shift) {
      for (size_t src_shift : {0, 1, 9}) {
        std::vector<uint8_t> dst(length + 64, 0xA5);
        StreamCopy(dst.data() + dst_shift, src.data() + src_shift, length);
        for (size_t i = 0; i < dst_shift; ++i) ASSERT_EQ(dst[i], 0xA5) << "before, len " << length;
        ASSERT_EQ(std::memcmp(dst.data() + dst_shift, src.data() + src_shift, length), 0)
            << "length " << length << " dst+" << dst_shift << " src+" << src_shift;
        for (size_t i = dst_shift + length; i < dst.size(); ++i) {
          ASSERT_EQ(dst[i], 0xA5) << "after, len " << length;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvagent::agent

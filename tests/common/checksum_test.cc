#include "kvagent/common/checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace kvagent {
namespace {

// Bit-at-a-time CRC-32C straight from the definition: the reference every fast path must match.
uint32_t Reference(const uint8_t* p, size_t n, uint32_t crc = 0) {
  uint32_t r = ~crc;
  for (size_t i = 0; i < n; ++i) {
    r ^= p[i];
    for (int k = 0; k < 8; ++k) r = (r & 1) ? (r >> 1) ^ 0x82F63B78 : r >> 1;
  }
  return ~r;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(Crc32c, KnownValues) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  const std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
}

// Every length around the lane and block boundaries, every source alignment, both store kinds:
// the checksum equals the reference and the copy equals the source.
TEST(Crc32c, FastPathsMatchTheReferenceAtEveryBoundary) {
  // Lane and block boundaries of every path: 768-byte blocks (sse4.2), 128- and 256-byte
  // strides (the folds), 4,032- and 14,336-byte chunks (avx2+vpclmulqdq), 4 KiB chunks up to
  // 64 KiB (avx512+vpclmulqdq+crc32).
  const std::vector<uint8_t> src = RandomBytes(70000 + 64, 7);
  std::vector<uint8_t> dst(70000 + 64);
  const size_t lengths[] = {0,     1,     7,     8,     15,    63,    64,    255,   256,
                            767,   768,   769,   1024,  1535,  1536,  1537,  2303,  2304,
                            4031,  4032,  4033,  4095,  4096,  4097,  4160,  8064,  8191,
                            8192,  8193,  12543, 14335, 14336, 14337, 18368, 18369, 28672,
                            32768, 40000, 65535, 65536, 65537, 70000};
  for (size_t n : lengths) {
    for (size_t align : {0, 1, 3, 8, 13}) {
      const uint8_t* s = src.data() + align;
      const uint32_t want = Reference(s, n);
      EXPECT_EQ(Crc32c(s, n), want) << "n=" << n << " align=" << align;
      for (CopyStores stores :
           {CopyStores::kCached, CopyStores::kStreaming, CopyStores::kStreamingUnfenced}) {
        std::fill(dst.begin(), dst.end(), 0xAB);
        uint8_t* d = dst.data() + (align * 7) % 32;
        EXPECT_EQ(CopyWithCrc32c(d, s, n, stores), want) << "n=" << n << " align=" << align;
        FenceStreamingStores();
        EXPECT_EQ(std::memcmp(d, s, n), 0) << "n=" << n;
        EXPECT_EQ(d[n], 0xAB) << "wrote past the end, n=" << n;
        // With a next value to fetch ahead, and without one (small values then take the
        // two-pass path: copy, then the CRC of the destination), continuing from a CRC.
        for (PrefetchRange next : {PrefetchRange{}, PrefetchRange{src.data(), 4096}}) {
          std::fill(dst.begin(), dst.end(), 0xAB);
          EXPECT_EQ(CopyWithCrc32c(d, s, n, stores, 0x1234u, next), Reference(s, n, 0x1234u))
              << "n=" << n << " align=" << align << " next=" << next.n;
          EXPECT_EQ(std::memcmp(d, s, n), 0) << "n=" << n;
          EXPECT_EQ(d[n], 0xAB) << "wrote past the end, n=" << n;
        }
      }
    }
  }
}

// Random lengths, offsets, starting CRCs and look-ahead ranges (a short one too) beside the
// boundaries above: every path's copies and checksums against the reference.
TEST(Crc32c, RandomLengthsOffsetsAndLookAheadsMatchTheReference) {
  const std::vector<uint8_t> src = RandomBytes(70000 + 128, 17);
  std::vector<uint8_t> dst(70000 + 128);
  std::mt19937 rng(23);
  for (int i = 0; i < 200; ++i) {
    const size_t n = i % 4 == 0 ? rng() % 70001 : 4096 * (1 + rng() % 16) + rng() % 3;
    const size_t from = rng() % 64, to = rng() % 64;
    const uint32_t crc = static_cast<uint32_t>(rng());
    const CopyStores all[] = {CopyStores::kCached, CopyStores::kStreaming,
                              CopyStores::kStreamingUnfenced};
    const CopyStores stores = all[rng() % 3];
    const PrefetchRange nexts[] = {{}, {src.data(), 4096}, {src.data() + 5, 100}};
    const PrefetchRange next = nexts[rng() % 3];
    const uint8_t* s = src.data() + from;
    const uint32_t want = Reference(s, n, crc);
    ASSERT_EQ(Crc32c(s, n, crc), want) << "n=" << n << " from=" << from;
    std::fill(dst.begin(), dst.end(), 0xCD);
    uint8_t* d = dst.data() + to;
    ASSERT_EQ(CopyWithCrc32c(d, s, n, stores, crc, next), want)
        << "n=" << n << " from=" << from << " to=" << to << " next=" << next.n;
    ASSERT_EQ(std::memcmp(d, s, n), 0) << "n=" << n;
    ASSERT_EQ(d[n], 0xCD) << "wrote past the end, n=" << n;
    if (to > 0) {
      ASSERT_EQ(d[-1], 0xCD) << "wrote before the start, n=" << n;
    }
  }
}

TEST(Crc32c, ExtendingAndCombiningEqualOneChecksumOfTheWhole) {
  const std::vector<uint8_t> v = RandomBytes(5000, 11);
  const uint32_t whole = Crc32c(v.data(), v.size());
  for (size_t cut : {0, 1, 100, 768, 2500, 4999, 5000}) {
    const uint32_t a = Crc32c(v.data(), cut);
    const uint32_t b = Crc32c(v.data() + cut, v.size() - cut);
    EXPECT_EQ(Crc32c(v.data() + cut, v.size() - cut, a), whole) << cut;
    EXPECT_EQ(Crc32cCombine(a, b, v.size() - cut), whole) << cut;
    EXPECT_EQ(Crc32cShift(a, Crc32cShifter(v.size() - cut)) ^ b, whole) << cut;
  }
}

TEST(Crc32c, OneFlippedBitChangesTheChecksum) {
  std::vector<uint8_t> v = RandomBytes(1 << 20, 3);
  const uint32_t before = Crc32c(v.data(), v.size());
  std::mt19937 rng(5);
  for (int i = 0; i < 64; ++i) {
    const size_t at = rng() % v.size();
    const uint8_t bit = static_cast<uint8_t>(1u << (rng() % 8));
    v[at] ^= bit;
    EXPECT_NE(Crc32c(v.data(), v.size()), before);
    v[at] ^= bit;
  }
  EXPECT_EQ(Crc32c(v.data(), v.size()), before);
}

TEST(Crc32c, ReportsItsImplementation) {
  const std::string name = Crc32cImplementation();
  EXPECT_TRUE(name == "avx512+vpclmulqdq+crc32" || name == "avx512+vpclmulqdq" ||
              name == "avx2+vpclmulqdq" || name == "sse4.2+pclmul" || name == "sse4.2" ||
              name == "armv8-crc" || name == "table")
      << name;
  const std::vector<std::string> available = Crc32cImplementationsAvailable();
  ASSERT_FALSE(available.empty());
  EXPECT_EQ(available.back(), "table");
  EXPECT_NE(std::find(available.begin(), available.end(), name), available.end());
}

// `make cross-aarch64` runs these tests under qemu with KVAGENT_EXPECT_CRC32C=armv8-crc, so the
// run proves which path was checked, not only that some path gives the right values.
TEST(Crc32c, IsTheImplementationTheRunExpects) {
  const char* expected = std::getenv("KVAGENT_EXPECT_CRC32C");
  if (expected == nullptr) GTEST_SKIP() << "KVAGENT_EXPECT_CRC32C is not set";
  const std::vector<std::string> available = Crc32cImplementationsAvailable();
  if (std::find(available.begin(), available.end(), expected) == available.end()) {
    GTEST_SKIP() << "this CPU has no " << expected << " path";
  }
  EXPECT_STREQ(Crc32cImplementation(), expected);
}

}  // namespace
}  // namespace kvagent

// CopyHelpers (agent/src/copy_helpers.h): a large value copied by several threads arrives whole,
// with the CRC32C one thread would have taken, whatever the split, alignment or store kind.
#include "copy_helpers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace kvagent::agent {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

constexpr size_t kMin = CopyHelpers::kSplitMinBytes;

// Sizes below, at and above the split, odd ones, and alignments of source and destination that
// put every share boundary inside a cache line of the source.
TEST(CopyHelpers, EveryByteArrivesWithTheOneThreadCrcWhateverTheSplit) {
  const size_t sizes[] = {0,
                          1,
                          4096,
                          kMin / 2 - 1,
                          kMin - 1,
                          kMin,
                          kMin + 1,
                          2 * kMin + 17,
                          3 * kMin + 63,
                          4 * kMin + 4097,
                          (size_t{1} << 20) + 5};
  for (unsigned threads : {1u, 2u, 3u, 4u}) {
    CopyHelpers copier(threads, CopyHelpers::Sharing::kAlways);
    EXPECT_EQ(copier.threads(), threads);
    for (size_t n : sizes) {
      for (size_t src_off : {size_t{0}, size_t{3}}) {
        for (size_t dst_off : {size_t{0}, size_t{5}, size_t{40}}) {
          const std::vector<uint8_t> src = RandomBytes(n + src_off, static_cast<uint32_t>(n));
          for (CopyStores stores :
               {CopyStores::kCached, CopyStores::kStreaming, CopyStores::kStreamingUnfenced}) {
            for (bool checksum : {false, true}) {
              std::vector<uint8_t> dst(n + dst_off + 8, 0xEE);
              const uint32_t crc =
                  copier.Copy(dst.data() + dst_off, src.data() + src_off, n, stores, checksum);
              SCOPED_TRACE(::testing::Message() << "threads " << threads << " n " << n << " src+"
                                                << src_off << " dst+" << dst_off);
              EXPECT_EQ(crc, checksum ? Crc32c(src.data() + src_off, n) : 0u);
              EXPECT_TRUE(std::equal(src.begin() + src_off, src.end(), dst.begin() + dst_off));
              // Nothing written outside the destination.
              for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xEE);
              for (size_t i = n + dst_off; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE);
            }
          }
        }
      }
    }
  }
}

// The helpers take share after share: many large copies in a row (each helper sleeps between
// some of them, spins between others), every one complete when Copy returns.
TEST(CopyHelpers, HelpersServeCopyAfterCopy) {
  CopyHelpers copier(3, CopyHelpers::Sharing::kAlways);
  const size_t n = 3 * kMin + 100;
  const std::vector<uint8_t> src = RandomBytes(n, 7);
  const uint32_t want = Crc32c(src.data(), n);
  std::vector<uint8_t> dst(n);
  for (int round = 0; round < 300; ++round) {
    std::memset(dst.data(), round & 0xff, n);
    ASSERT_EQ(copier.Copy(dst.data(), src.data(), n, CopyStores::kStreaming, true), want);
    ASSERT_EQ(0, std::memcmp(dst.data(), src.data(), n)) << "round " << round;
    if (round % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // asleep
  }
}

// By rate (the agent's choice): whether a large value is copied alone (timed) or shared, it
// arrives whole with the one-thread CRC, copy after copy, including the probes made alone.
TEST(CopyHelpers, SharingByRateCopiesEveryValueWhole) {
  CopyHelpers copier(2);
  for (size_t n : {kMin, 4 * kMin + 4097, size_t{16} << 20}) {
    const std::vector<uint8_t> src = RandomBytes(n, static_cast<uint32_t>(n));
    const uint32_t want = Crc32c(src.data(), n);
    std::vector<uint8_t> dst(n);
    for (int round = 0; round < 2 * static_cast<int>(CopyHelpers::kProbeEvery); ++round) {
      std::memset(dst.data(), round & 0xff, n);
      ASSERT_EQ(copier.Copy(dst.data(), src.data(), n, CopyStores::kCached, true), want) << n;
      ASSERT_EQ(0, std::memcmp(dst.data(), src.data(), n)) << "n " << n << " round " << round;
    }
  }
}

}  // namespace
}  // namespace kvagent::agent

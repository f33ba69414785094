// The pieces the CRC32C paths share (common/src only): GF(2) arithmetic, the table path, the
// crc32-instruction steps, and each hardware path's entry points. checksum.cc picks the path a
// process uses; checksum_x86.cc holds the carry-less-multiplication paths of x86-64.
//
// Every path computes the same register update: no pre- or post-inversion (checksum.cc adds
// them), the reflected CRC-32C polynomial, bit i of a register the coefficient of x^(31 - i).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvagent/common/checksum.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#endif

namespace kvagent::crc32c {

constexpr uint32_t kPoly = 0x82F63B78;  // CRC-32C, reflected

// a * b mod P.
uint32_t MulModP(uint32_t a, uint32_t b);
// x^k mod P.
uint32_t XPowModP(uint64_t k);

// The table path (any CPU): register update over [p, p + n).
uint32_t TableUpdate(uint32_t r, const uint8_t* p, size_t n);

// One way to compute the register update, with and without a copy.
struct Path {
  uint32_t (*update)(uint32_t r, const uint8_t* p, size_t n);
  uint32_t (*copy_update)(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n,
                          CopyStores stores);
  const char* name;
  // copy_update that also prefetches [next, next + next_n) a little at a time while it copies;
  // null for a path that does not (the caller prefetches after the copy).
  uint32_t (*copy_update_ahead)(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n,
                                CopyStores stores, const uint8_t* next, size_t next_n) = nullptr;
};

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The crc32 instruction: one step over 8 bytes or one byte.
#if defined(__x86_64__)
#define KVAGENT_CRC_TARGET __attribute__((target("sse4.2")))
KVAGENT_CRC_TARGET inline uint64_t Step64(uint64_t r, uint64_t v) { return _mm_crc32_u64(r, v); }
KVAGENT_CRC_TARGET inline uint32_t Step8(uint32_t r, uint8_t v) { return _mm_crc32_u8(r, v); }
#elif defined(__aarch64__)
#define KVAGENT_CRC_TARGET __attribute__((target("+crc")))
KVAGENT_CRC_TARGET inline uint64_t Step64(uint64_t r, uint64_t v) {
  return __crc32cd(static_cast<uint32_t>(r), v);
}
KVAGENT_CRC_TARGET inline uint32_t Step8(uint32_t r, uint8_t v) { return __crc32cb(r, v); }
#endif

#if defined(__x86_64__) || defined(__aarch64__)
// One crc32 chain over [p, p + n): for short runs and the ends of long ones.
KVAGENT_CRC_TARGET inline uint32_t HwTail(uint32_t r, const uint8_t* p, size_t n) {
  uint64_t c = r;
  for (; n >= 8; n -= 8, p += 8) c = Step64(c, Load64(p));
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = Step8(c32, *p++);
  return c32;
}
#endif

#if defined(__x86_64__)
// The carry-less-multiplication paths (checksum_x86.cc), each for the CPUs its test admits:
// PCLMULQDQ folding of 16-byte lanes; VPCLMULQDQ on 32-byte lanes beside three crc32 chains
// (AVX2); VPCLMULQDQ on 64-byte lanes (AVX-512).
bool HavePclmul();
bool HaveVpclmul256();
bool HaveVpclmul512();
extern const Path kFoldPath;
extern const Path kHybridPath;
extern const Path kFold512Path;
// The folds of kFold512Path beside eight crc32 chains, for values up to 64 KiB.
extern const Path kHybrid512Path;
// Whether kHybrid512Path computes a CRC faster than kFold512Path on this CPU (timed once).
bool Hybrid512IsFaster();
#endif

}  // namespace kvagent::crc32c

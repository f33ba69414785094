// CRC32C: a table path for any CPU, and a fast path that runs three independent CRC chains over
// three lanes of each 768-byte block (the crc32 instruction has a latency of three cycles and a
// throughput of one, so one chain would leave two thirds of it idle) and joins them with two
// table-driven shifts. The copying variants move the same 16-byte loads to the destination, so
// the source is read from memory once.
#include "kvagent/common/checksum.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <sys/auxv.h>
#endif

namespace kvagent {
namespace {

constexpr uint32_t kPoly = 0x82F63B78;  // CRC-32C, reflected

// ---- GF(2) arithmetic on reflected polynomials (for shifts and Crc32cCombine) --------------

// a * b mod P.
uint32_t MulModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31;
  uint32_t p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^k mod P. Bit i of a register is the coefficient of x^(31 - i).
uint32_t XPowModP(uint64_t k) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t square = 1u << 30;  // x^1
  while (k) {
    if (k & 1) result = MulModP(square, result);
    square = MulModP(square, square);
    k >>= 1;
  }
  return result;
}

// x^(8 * n) mod P: the operator that runs a CRC register over n zero bytes.
uint32_t ZerosOperator(uint64_t n) { return XPowModP(8 * n); }

// ---- the table path ------------------------------------------------------------------------

struct Tables {
  uint32_t byte[8][256];  // slice-by-8
  // Shift of a register across kLane and 2 * kLane zero bytes, one table per register byte.
  uint32_t lane1[4][256];
  uint32_t lane2[4][256];
};

constexpr size_t kLane = 256;  // bytes per lane; a block is three lanes

Tables MakeTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t.byte[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) {
      const uint32_t prev = t.byte[s - 1][i];
      t.byte[s][i] = (prev >> 8) ^ t.byte[0][prev & 0xff];
    }
  }
  const uint32_t op1 = ZerosOperator(kLane);
  const uint32_t op2 = ZerosOperator(2 * kLane);
  for (uint32_t i = 0; i < 256; ++i) {
    for (int b = 0; b < 4; ++b) {
      t.lane1[b][i] = MulModP(op1, i << (8 * b));
      t.lane2[b][i] = MulModP(op2, i << (8 * b));
    }
  }
  return t;
}

const Tables& T() {
  static const Tables tables = MakeTables();
  return tables;
}

uint32_t Shift(const uint32_t (&table)[4][256], uint32_t r) {
  return table[0][r & 0xff] ^ table[1][(r >> 8) & 0xff] ^ table[2][(r >> 16) & 0xff] ^
         table[3][r >> 24];
}

// Register update over [p, p + n) (no pre/post inversion).
uint32_t TableUpdate(uint32_t r, const uint8_t* p, size_t n) {
  const Tables& t = T();
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    v ^= r;
    r = t.byte[7][v & 0xff] ^ t.byte[6][(v >> 8) & 0xff] ^ t.byte[5][(v >> 16) & 0xff] ^
        t.byte[4][(v >> 24) & 0xff] ^ t.byte[3][(v >> 32) & 0xff] ^ t.byte[2][(v >> 40) & 0xff] ^
        t.byte[1][(v >> 48) & 0xff] ^ t.byte[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) r = (r >> 8) ^ t.byte[0][(r ^ *p++) & 0xff];
  return r;
}

uint32_t TableCopyUpdate(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n, CopyStores) {
  std::memcpy(dst, src, n);
  return TableUpdate(r, src, n);
}

// ---- hardware paths --------------------------------------------------------------------------

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

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Copies one 64-byte line from src to dst with the chosen stores.
template <CopyStores kStores>
KVAGENT_CRC_TARGET inline void CopyLine(uint8_t* dst, const uint8_t* src) {
#if defined(__x86_64__)
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
  const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
  if constexpr (kStores == CopyStores::kStreaming) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  }
#else
  std::memcpy(dst, src, 64);
#endif
}

KVAGENT_CRC_TARGET inline uint64_t CrcLine(uint64_t r, const uint8_t* p) {
  for (int i = 0; i < 64; i += 8) r = Step64(r, Load64(p + i));
  return r;
}

KVAGENT_CRC_TARGET uint32_t HwTail(uint32_t r, const uint8_t* p, size_t n) {
  uint64_t c = r;
  for (; n >= 8; n -= 8, p += 8) c = Step64(c, Load64(p));
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = Step8(c32, *p++);
  return c32;
}

// Register update over whole 768-byte blocks, copying when dst != nullptr.
template <bool kCopy, CopyStores kStores>
KVAGENT_CRC_TARGET uint32_t HwBlocks(uint32_t r, uint8_t* dst, const uint8_t* src, size_t blocks) {
  const Tables& t = T();
  for (; blocks > 0; --blocks) {
    uint64_t a = r, b = 0, c = 0;
    for (size_t off = 0; off < kLane; off += 64) {
      if constexpr (kCopy) {
        CopyLine<kStores>(dst + off, src + off);
        CopyLine<kStores>(dst + kLane + off, src + kLane + off);
        CopyLine<kStores>(dst + 2 * kLane + off, src + 2 * kLane + off);
      }
      a = CrcLine(a, src + off);
      b = CrcLine(b, src + kLane + off);
      c = CrcLine(c, src + 2 * kLane + off);
    }
    r = Shift(t.lane2, static_cast<uint32_t>(a)) ^ Shift(t.lane1, static_cast<uint32_t>(b)) ^
        static_cast<uint32_t>(c);
    src += 3 * kLane;
    if constexpr (kCopy) dst += 3 * kLane;
  }
  return r;
}

uint32_t HwUpdate(uint32_t r, const uint8_t* p, size_t n) {
  const size_t blocks = n / (3 * kLane);
  r = HwBlocks<false, CopyStores::kCached>(r, nullptr, p, blocks);
  return HwTail(r, p + blocks * 3 * kLane, n - blocks * 3 * kLane);
}

KVAGENT_CRC_TARGET uint32_t HwCopyUpdate(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n,
                                         CopyStores stores) {
  // Streaming stores want 16-byte aligned destinations: the head goes the ordinary way.
  size_t head = n < 3 * kLane ? n : (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (head) {
    std::memcpy(dst, src, head);
    r = HwTail(r, src, head);
    dst += head;
    src += head;
    n -= head;
  }
  const size_t blocks = n / (3 * kLane);
  if (stores == CopyStores::kStreaming) {
    r = HwBlocks<true, CopyStores::kStreaming>(r, dst, src, blocks);
#if defined(__x86_64__)
    if (blocks) _mm_sfence();  // streaming stores are weakly ordered: finish them first
#endif
  } else {
    r = HwBlocks<true, CopyStores::kCached>(r, dst, src, blocks);
  }
  const size_t done = blocks * 3 * kLane;
  std::memcpy(dst + done, src + done, n - done);
  return HwTail(r, src + done, n - done);
}

#if defined(__x86_64__)
// Folding with carry-less multiplication (PCLMULQDQ): eight 16-byte accumulators move forward
// 128 bytes at a time; at the end they are folded into one, whose CRC the crc32 instruction
// takes. A 16-byte value S (first byte = highest degree) moved forward F bytes is congruent to
// clmul(S.lo, x^(8F+63) mod P) ^ clmul(S.hi, x^(8F-1) mod P): the product of two reflected
// operands comes out one degree low, which the -1 in both exponents makes up for.
#define KVAGENT_FOLD_TARGET __attribute__((target("sse4.2,pclmul")))

struct FoldConstants {
  __m128i by128;    // the loop: 128 bytes
  __m128i by16[8];  // the final fold: by16[i] moves an accumulator 16 * i bytes
};

KVAGENT_FOLD_TARGET __m128i FoldConstant(uint64_t bytes) {
  const uint64_t lo = uint64_t{XPowModP(8 * bytes + 63)} << 32;
  const uint64_t hi = uint64_t{XPowModP(8 * bytes - 1)} << 32;
  return _mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo));
}

KVAGENT_FOLD_TARGET const FoldConstants& Folds() {
  static const FoldConstants constants = [] {
    FoldConstants c;
    c.by128 = FoldConstant(128);
    c.by16[0] = _mm_setzero_si128();
    for (int i = 1; i < 8; ++i) c.by16[i] = FoldConstant(16 * i);
    return c;
  }();
  return constants;
}

KVAGENT_FOLD_TARGET inline __m128i Fold(__m128i x, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

// Register update over n bytes (a multiple of 128, at least 128), copying when kCopy.
template <bool kCopy, CopyStores kStores>
KVAGENT_FOLD_TARGET uint32_t FoldRun(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n) {
  const FoldConstants& k = Folds();
  __m128i x[8];
  for (int i = 0; i < 8; ++i) {
    x[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * i));
  }
  if constexpr (kCopy) CopyLine<kStores>(dst, src), CopyLine<kStores>(dst + 64, src + 64);
  x[0] = _mm_xor_si128(x[0], _mm_cvtsi32_si128(static_cast<int>(r)));
  for (size_t done = 128; done < n; done += 128) {
    const uint8_t* s = src + done;
    for (int i = 0; i < 8; ++i) {
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16 * i));
      if constexpr (kCopy) {
        __m128i* out = reinterpret_cast<__m128i*>(dst + done + 16 * i);
        if constexpr (kStores == CopyStores::kStreaming) {
          _mm_stream_si128(out, d);
        } else {
          _mm_storeu_si128(out, d);
        }
      }
      x[i] = _mm_xor_si128(Fold(x[i], k.by128), d);
    }
  }
  __m128i acc = x[7];
  for (int i = 0; i < 7; ++i) acc = _mm_xor_si128(acc, Fold(x[i], k.by16[7 - i]));
  const uint64_t lo = static_cast<uint64_t>(_mm_cvtsi128_si64(acc));
  const uint64_t hi = static_cast<uint64_t>(_mm_extract_epi64(acc, 1));
  return static_cast<uint32_t>(Step64(Step64(0, lo), hi));
}

constexpr size_t kFoldMin = 256;  // below this one crc32 chain is as fast

KVAGENT_FOLD_TARGET uint32_t FoldUpdate(uint32_t r, const uint8_t* p, size_t n) {
  if (n < kFoldMin) return HwTail(r, p, n);
  const size_t run = n / 128 * 128;
  r = FoldRun<false, CopyStores::kCached>(r, nullptr, p, run);
  return HwTail(r, p + run, n - run);
}

KVAGENT_FOLD_TARGET uint32_t FoldCopyUpdate(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n,
                                            CopyStores stores) {
  if (n < kFoldMin) {
    std::memcpy(dst, src, n);
    return HwTail(r, src, n);
  }
  // Streaming stores want 16-byte aligned destinations: the head goes the ordinary way.
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  std::memcpy(dst, src, head);
  r = HwTail(r, src, head);
  dst += head;
  src += head;
  n -= head;
  const size_t run = n / 128 * 128;
  if (stores == CopyStores::kStreaming) {
    r = FoldRun<true, CopyStores::kStreaming>(r, dst, src, run);
    _mm_sfence();  // streaming stores are weakly ordered: finish them before anyone is told
  } else {
    r = FoldRun<true, CopyStores::kCached>(r, dst, src, run);
  }
  std::memcpy(dst + run, src + run, n - run);
  return HwTail(r, src + run, n - run);
}

bool HavePclmul() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_PCLMUL) != 0 &&
         (ecx & bit_SSE4_2) != 0;
}

// The same folding 64 bytes per instruction (AVX-512 VPCLMULQDQ): four 64-byte accumulators move
// forward 256 bytes at a time, then fold into one 16-byte value as above.
// GCC 12's AVX-512 intrinsics start some results from an "undefined" vector, which
// -Wmaybe-uninitialized reports inside the intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define KVAGENT_FOLD512_TARGET __attribute__((target("sse4.2,pclmul,avx512f,avx512vl,vpclmulqdq")))

KVAGENT_FOLD512_TARGET inline __m512i Fold512(__m512i x, __m512i k) {
  return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00),
                          _mm512_clmulepi64_epi128(x, k, 0x11));
}

KVAGENT_FOLD512_TARGET __m512i Broadcast(__m128i k) { return _mm512_broadcast_i32x4(k); }

// Register update over n bytes (a multiple of 256, at least 256), copying when kCopy (dst
// 64-byte aligned for streaming stores).
template <bool kCopy, CopyStores kStores>
KVAGENT_FOLD512_TARGET uint32_t Fold512Run(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n) {
  static const __m512i by256 = Broadcast(FoldConstant(256));
  static const __m512i by64 = Broadcast(FoldConstant(64));
  static const __m512i by128 = Broadcast(FoldConstant(128));
  static const __m512i by192 = Broadcast(FoldConstant(192));
  const FoldConstants& k = Folds();
  __m512i x[4];
  for (size_t done = 0; done < n; done += 256) {
    for (int i = 0; i < 4; ++i) {
      const __m512i d = _mm512_loadu_si512(src + done + 64 * i);
      if constexpr (kCopy) {
        auto* out = reinterpret_cast<__m512i*>(dst + done + 64 * i);
        if constexpr (kStores == CopyStores::kStreaming) {
          _mm512_stream_si512(out, d);
        } else {
          _mm512_storeu_si512(out, d);
        }
      }
      if (done == 0) {
        x[i] = d;
      } else {
        x[i] = _mm512_xor_si512(Fold512(x[i], by256), d);
      }
    }
    if (done == 0) {
      x[0] = _mm512_xor_si512(x[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(r))));
    }
  }
  __m512i acc = _mm512_xor_si512(x[3], Fold512(x[2], by64));
  acc = _mm512_xor_si512(acc, _mm512_xor_si512(Fold512(x[1], by128), Fold512(x[0], by192)));
  __m128i last = _mm512_extracti32x4_epi32(acc, 3);
  last = _mm_xor_si128(last, Fold(_mm512_extracti32x4_epi32(acc, 2), k.by16[1]));
  last = _mm_xor_si128(last, Fold(_mm512_extracti32x4_epi32(acc, 1), k.by16[2]));
  last = _mm_xor_si128(last, Fold(_mm512_castsi512_si128(acc), k.by16[3]));
  const uint64_t lo = static_cast<uint64_t>(_mm_cvtsi128_si64(last));
  const uint64_t hi = static_cast<uint64_t>(_mm_extract_epi64(last, 1));
  return static_cast<uint32_t>(Step64(Step64(0, lo), hi));
}

KVAGENT_FOLD512_TARGET uint32_t Fold512Update(uint32_t r, const uint8_t* p, size_t n) {
  if (n < kFoldMin) return HwTail(r, p, n);
  const size_t run = n / 256 * 256;
  r = Fold512Run<false, CopyStores::kCached>(r, nullptr, p, run);
  return HwTail(r, p + run, n - run);
}

KVAGENT_FOLD512_TARGET uint32_t Fold512CopyUpdate(uint32_t r, uint8_t* dst, const uint8_t* src,
                                                  size_t n, CopyStores stores) {
  if (n < kFoldMin + 64) {
    std::memcpy(dst, src, n);
    return HwTail(r, src, n);
  }
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63;
  std::memcpy(dst, src, head);
  r = HwTail(r, src, head);
  dst += head;
  src += head;
  n -= head;
  const size_t run = n / 256 * 256;
  if (stores == CopyStores::kStreaming) {
    r = Fold512Run<true, CopyStores::kStreaming>(r, dst, src, run);
    _mm_sfence();
  } else {
    r = Fold512Run<true, CopyStores::kCached>(r, dst, src, run);
  }
  std::memcpy(dst + run, src + run, n - run);
  return HwTail(r, src + run, n - run);
}

#pragma GCC diagnostic pop

bool HaveVpclmul512() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool avx512 = (ebx & bit_AVX512F) != 0 && (ebx & bit_AVX512VL) != 0;
  const bool vpclmul = (ecx & bit_VPCLMULQDQ) != 0;
  // The OS must save the zmm state (XCR0 bits 1, 2, 5, 6, 7).
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  if ((ecx & bit_OSXSAVE) == 0) return false;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return avx512 && vpclmul && (xcr0_lo & 0xE6) == 0xE6 && HavePclmul();
}

#endif

bool HaveHardwareCrc() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_SSE4_2) != 0;
#else
  return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#endif
}

#else
bool HaveHardwareCrc() { return false; }
uint32_t HwUpdate(uint32_t r, const uint8_t* p, size_t n) { return TableUpdate(r, p, n); }
uint32_t HwCopyUpdate(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n, CopyStores s) {
  return TableCopyUpdate(r, dst, src, n, s);
}
#endif

struct Implementation {
  uint32_t (*update)(uint32_t, const uint8_t*, size_t);
  uint32_t (*copy_update)(uint32_t, uint8_t*, const uint8_t*, size_t, CopyStores);
  const char* name;
};

const Implementation& Impl() {
  static const Implementation impl = [] {
    (void)T();  // build the tables before any thread races to them
#if defined(__x86_64__)
    if (HaveVpclmul512()) {
      return Implementation{Fold512Update, Fold512CopyUpdate, "avx512+vpclmulqdq"};
    }
    if (HavePclmul()) return Implementation{FoldUpdate, FoldCopyUpdate, "sse4.2+pclmul"};
#endif
    if (HaveHardwareCrc()) {
#if defined(__x86_64__)
      return Implementation{HwUpdate, HwCopyUpdate, "sse4.2"};
#else
      return Implementation{HwUpdate, HwCopyUpdate, "armv8-crc"};
#endif
    }
    return Implementation{TableUpdate, TableCopyUpdate, "table"};
  }();
  return impl;
}

}  // namespace

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  return ~Impl().update(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t CopyWithCrc32c(void* dst, const void* src, size_t n, CopyStores stores, uint32_t crc) {
  return ~Impl().copy_update(~crc, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n,
                             stores);
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t nb) {
  return MulModP(ZerosOperator(nb), crc_a) ^ crc_b;
}

const char* Crc32cImplementation() { return Impl().name; }

}  // namespace kvagent

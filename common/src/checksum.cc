// CRC32C: the choice of path, a table path for any CPU, and the path of the crc32 instruction
// alone, which runs three independent CRC chains over three lanes of each 768-byte block (the
// instruction has a latency of three cycles and a throughput of one, so one chain would leave
// two thirds of it idle) and joins them with two table-driven shifts. The copying variants move
// the same loads to the destination, so the source is read from memory once. The paths with
// carry-less multiplication are in checksum_x86.cc.
#include "kvagent/common/checksum.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "checksum_internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#endif

namespace kvagent {
namespace crc32c {

// ---- GF(2) arithmetic on reflected polynomials (for shifts and Crc32cCombine) --------------

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

namespace {

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

}  // namespace

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

namespace {

uint32_t TableCopyUpdate(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n, CopyStores) {
  std::memcpy(dst, src, n);
  return TableUpdate(r, src, n);
}

// ---- three crc32 chains ----------------------------------------------------------------------

#if defined(__x86_64__) || defined(__aarch64__)

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
    r = HwBlocks<true, CopyStores::kStreaming>(r, dst, src, blocks);  // fenced by the caller
  } else {
    r = HwBlocks<true, CopyStores::kCached>(r, dst, src, blocks);
  }
  const size_t done = blocks * 3 * kLane;
  std::memcpy(dst + done, src + done, n - done);
  return HwTail(r, src + done, n - done);
}

bool HaveHardwareCrc() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_SSE4_2) != 0;
#else
  return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#endif
}

#endif

// ---- the choice ------------------------------------------------------------------------------

// The paths this CPU runs, fastest first; the table path always last.
std::vector<Path> AvailablePaths() {
  std::vector<Path> paths;
#if defined(__x86_64__)
  if (HaveVpclmul512()) {
    if (Hybrid512IsFaster()) {
      paths.push_back(kHybrid512Path);
      paths.push_back(kFold512Path);
    } else {
      paths.push_back(kFold512Path);
      paths.push_back(kHybrid512Path);
    }
  }
  if (HaveVpclmul256()) paths.push_back(kHybridPath);
  if (HavePclmul()) paths.push_back(kFoldPath);
  if (HaveHardwareCrc()) paths.push_back(Path{HwUpdate, HwCopyUpdate, "sse4.2"});
#elif defined(__aarch64__)
  if (HaveHardwareCrc()) paths.push_back(Path{HwUpdate, HwCopyUpdate, "armv8-crc"});
#endif
  paths.push_back(Path{TableUpdate, TableCopyUpdate, "table"});
  return paths;
}

const Path& Chosen() {
  static const Path path = [] {
    (void)T();  // build the tables before any thread races to them
    const std::vector<Path> paths = AvailablePaths();
    if (const char* wanted = std::getenv("KVAGENT_CRC32C"); wanted != nullptr && *wanted != 0) {
      for (const Path& p : paths) {
        if (std::string(p.name) == wanted) return p;
      }
    }
    return paths.front();
  }();
  return path;
}

}  // namespace
}  // namespace crc32c

namespace {
constexpr size_t kTwoPassCopyMaxBytes = 16 * 1024;

// The largest copy whose fused loop asks for its own lines ahead (source, and the destination
// for writing). Beyond it the hardware prefetchers follow the long sequential streams better on
// their own: 1 MiB gets with the requests ran at 0.82-1.02x the rate of gets without
// checksums (e2e_bench's get.1m.vs_off), 1.02-1.11x without them (three alternating runs each on
// an AMD Zen 5 VM).
constexpr size_t kOwnAheadMaxBytes = 64 * 1024;

// What the paths' copies are told: kCached or kStreaming (they never fence).
CopyStores PathStores(CopyStores stores) {
  return stores == CopyStores::kCached ? CopyStores::kCached : CopyStores::kStreaming;
}

// CopyWithCrc32c with a `next`, its streaming stores unfenced.
uint32_t CopyUnfenced(void* dst, const void* src, size_t n, CopyStores stores, uint32_t crc,
                      PrefetchRange next) {
  // A path that asks for its own lines ahead (copy_update_ahead) copies and checksums in one
  // loop, also with nothing of the caller's to fetch next (a get of one key, the last of a
  // batch): a memcpy and then the CRC of the destination made the CRC wait for the copy's loads
  // (single-key 4 KiB gets from a cold pool, 6 alternating runs on an AMD Zen 5 VM: get p50
  // 0.96x the time with the fused loop on the AVX-512 path, 0.97x on sse4.2+pclmul). A path
  // without it (crc32 chains alone) keeps the two passes: its loads wait for memory one line
  // after another (a cold 4 KiB on AMD Zen 3: ~1.5 us in two passes, ~2.3 us fused).
  const crc32c::Path& path = crc32c::Chosen();
  if (stores == CopyStores::kCached && next.data == nullptr && n <= kTwoPassCopyMaxBytes &&
      path.copy_update_ahead == nullptr) {
    std::memcpy(dst, src, n);
    return Crc32c(dst, n, crc);
  }
  const auto* ahead = static_cast<const uint8_t*>(next.data);
  if (path.copy_update_ahead != nullptr && n <= kOwnAheadMaxBytes) {
    return ~path.copy_update_ahead(~crc, static_cast<uint8_t*>(dst),
                                   static_cast<const uint8_t*>(src), n, stores, ahead, next.n);
  }
  const uint32_t r = path.copy_update(~crc, static_cast<uint8_t*>(dst),
                                      static_cast<const uint8_t*>(src), n, stores);
  PrefetchStart(next);
  return ~r;
}

}  // namespace

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  return ~crc32c::Chosen().update(~crc, static_cast<const uint8_t*>(data), n);
}

void FenceStreamingStores() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

// The paths' copies know cached and streaming stores, and leave streaming ones unfenced: the
// public functions fence them for kStreaming.
uint32_t CopyWithCrc32c(void* dst, const void* src, size_t n, CopyStores stores, uint32_t crc) {
  const uint32_t r = ~crc32c::Chosen().copy_update(
      ~crc, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, PathStores(stores));
  if (stores == CopyStores::kStreaming) FenceStreamingStores();
  return r;
}

uint32_t CopyWithCrc32c(void* dst, const void* src, size_t n, CopyStores stores, uint32_t crc,
                        PrefetchRange next) {
  const uint32_t r = CopyUnfenced(dst, src, n, PathStores(stores), crc, next);
  if (stores == CopyStores::kStreaming) FenceStreamingStores();
  return r;
}

void PrefetchStart(PrefetchRange range) {
  const auto* p = static_cast<const uint8_t*>(range.data);
  for (size_t at = 0; p != nullptr && at < std::min<size_t>(range.n, 4096); at += 64) {
    __builtin_prefetch(p + at);
  }
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t nb) {
  return crc32c::MulModP(crc32c::ZerosOperator(nb), crc_a) ^ crc_b;
}

uint32_t Crc32cShifter(uint64_t nb) { return crc32c::ZerosOperator(nb); }

uint32_t Crc32cShift(uint32_t crc_a, uint32_t shifter) { return crc32c::MulModP(shifter, crc_a); }

const char* Crc32cImplementation() { return crc32c::Chosen().name; }

std::vector<std::string> Crc32cImplementationsAvailable() {
  std::vector<std::string> names;
  for (const crc32c::Path& p : crc32c::AvailablePaths()) names.emplace_back(p.name);
  return names;
}

}  // namespace kvagent

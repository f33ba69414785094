// CRC32C on x86-64 with carry-less multiplication. A 16-byte value S (first byte = highest
// degree) moved forward F bytes is congruent to clmul(S.lo, x^(8F+63) mod P) ^ clmul(S.hi,
// x^(8F-1) mod P): the product of two reflected operands comes out one degree low, which the -1
// in both exponents makes up for. Accumulators of 16, 32 or 64 bytes move forward a stride at a
// time ("folding"); at the end they are folded into one 16-byte value, whose CRC the crc32
// instruction takes. Four paths, chosen by checksum.cc from what the CPU has:
//   sse4.2+pclmul      eight 16-byte accumulators, 128 bytes per step
//   avx2+vpclmulqdq    four 32-byte accumulators over one part of a chunk while three crc32
//                      chains run over the rest, so both the vector unit and the crc32 unit
//                      are busy (on AMD Zen 3 each alone reaches ~8 bytes per cycle)
//   avx512+vpclmulqdq  two sets of four 64-byte accumulators, 512 bytes per step (one set of
//                      four, 256 bytes, for the last step)
//   avx512+vpclmulqdq+crc32
//                      values up to 64 KiB in 4 KiB chunks, half to four 64-byte accumulators,
//                      half to eight crc32 chains (the rest, and streaming copies, as above);
//                      chosen where it is faster (timed once)
// The loops over a path's accumulators carry "#pragma GCC unroll": without it GCC 12 at -O2 keeps
// the accumulator arrays on the stack, a store and a reload per 16 or 64 bytes on top of the copy
// (AVX-512, 1 MiB into a pool with streaming stores: 0.87x of the plain streaming copy before,
// 1.0x after; a 1 MiB cached copy out of the pool 0.89x -> 1.06x of memcpy. SSE, batches of 4 KiB
// gets from a cold pool: 0.38-0.42x -> 0.45-0.49x of memcpy; alternating runs on one VM).
// Compiled on every architecture (one source list); empty on all but x86-64.
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>

#include "checksum_internal.h"

namespace kvagent::crc32c {
namespace {

template <CopyStores kStores>
inline void Store(__m128i* out, __m128i v) {
  if constexpr (kStores == CopyStores::kStreaming) {
    _mm_stream_si128(out, v);
  } else {
    _mm_storeu_si128(out, v);
  }
}

constexpr size_t kAheadBytes = 4096;  // of the caller's next value

inline void Prefetch(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

// PREFETCHW (AMD since K8, Intel since Broadwell, a no-op on the Intel CPUs before): the line
// comes in ready to be written. A get's cached stores into cold lines of the client's buffer
// otherwise each wait for their line to be read first (the avx2 path's 4 KiB get copy went from
// 0.76x to 0.98x of memcpy with it, the AVX-512 path's to 1.15x); memcpy's string stores
// avoid that read. As inline assembly: GCC drops the builtin's write hint without -mprfchw.
inline void PrefetchForWrite(uint8_t* p) { __asm__ volatile("prefetchw %0" : : "m"(*p)); }

constexpr size_t kOwnAhead = 2048;

// What a get's copy asks for before it needs it: its own lines (source, and the destination for
// writing) kOwnAhead bytes ahead, and the caller's next value a few lines a step. A get's
// source is mostly out of cache, and the loads of a fused loop otherwise wait for memory one
// line after another (a 4 KiB get from a cold pool on the AVX-512 path: 1.4x memcpy's time
// before, 0.87x after).
struct Ahead {
  Ahead() = default;
  Ahead(const uint8_t* data, size_t n)
      : at(data), end(data == nullptr ? data : data + std::min<size_t>(n, kAheadBytes)) {}
  // Spreads the next value over `steps` steps.
  void Spread(size_t steps) { per_step = (static_cast<size_t>(end - at) / 64 + steps - 1) / steps; }
  // The next value's lines of one step.
  void Step() {
    for (size_t i = 0; i < per_step && at < end; ++i, at += 64) Prefetch(at);
  }
  // The first lines of a copy of n bytes.
  template <bool kCopy>
  void Begin(const uint8_t* src, uint8_t* dst, size_t n) const {
    for (size_t l = 0; l < std::min(n, kOwnAhead); l += 64) {
      Prefetch(src + l);
      if constexpr (kCopy) PrefetchForWrite(dst + l);
    }
  }
  // The step of `bytes` at `done` of a copy of n bytes: the lines kOwnAhead further, and the
  // next value's.
  template <bool kCopy>
  void Step(const uint8_t* src, uint8_t* dst, size_t done, size_t bytes, size_t n) {
    for (size_t l = done + kOwnAhead; l < std::min(n, done + kOwnAhead + bytes); l += 64) {
      Prefetch(src + l);
      if constexpr (kCopy) PrefetchForWrite(dst + l);
    }
    Step();
  }
  void Rest() const {
    for (const uint8_t* p = at; p < end; p += 64) Prefetch(p);
  }
  const uint8_t* at = nullptr;
  const uint8_t* end = nullptr;
  size_t per_step = 0;
};

// A fold loop that copies: the register update over n bytes (a multiple of its step), storing
// to dst as it loads.
using FoldCopyRun = uint32_t (*)(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n);

// The copy of every fold path: the head, up to a kAlign-aligned destination (streaming stores
// want one), and the tail the ordinary way; whole kStep-byte steps in between by `streaming` or
// `cached` (which may be null when `stores` is kStreaming). Streaming stores are weakly
// ordered and left unfenced here: CopyWithCrc32c fences them for its callers that want it.
template <size_t kAlign, size_t kStep>
KVAGENT_CRC_TARGET uint32_t AlignedFoldCopy(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n,
                                            CopyStores stores, FoldCopyRun streaming,
                                            FoldCopyRun cached) {
  const size_t head = (kAlign - (reinterpret_cast<uintptr_t>(dst) & (kAlign - 1))) & (kAlign - 1);
  std::memcpy(dst, src, head);
  r = HwTail(r, src, head);
  dst += head;
  src += head;
  n -= head;
  const size_t run = n / kStep * kStep;
  if (run > 0) {
    if (stores == CopyStores::kStreaming) {
      r = streaming(r, dst, src, run);
    } else {
      r = cached(r, dst, src, run);
    }
  }
  std::memcpy(dst + run, src + run, n - run);
  return HwTail(r, src + run, n - run);
}

using CopyUpdate = uint32_t (*)(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n,
                                CopyStores stores);
using AheadRun = uint32_t (*)(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n, Ahead* ahead);

// A fold path's cached copy with its Ahead (`run` over whole kStep-byte steps, in a loop of
// kLoopStep-byte steps; the tail by one crc32 chain); streaming copies and values below kMin by
// the path's `plain` copy.
template <size_t kStep, size_t kMin, CopyUpdate kPlain, AheadRun kRun, size_t kLoopStep = kStep>
uint32_t CopyUpdateAheadWith(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n,
                             CopyStores stores, const uint8_t* next, size_t next_n) {
  Ahead ahead(next, next_n);
  if (n < kMin || stores == CopyStores::kStreaming) {
    r = kPlain(r, dst, src, n, stores);
    ahead.Rest();
    return r;
  }
  const size_t run = n / kStep * kStep;
  ahead.Spread(run / kLoopStep + 1);  // the Ahead steps `run` makes
  r = kRun(r, dst, src, run, &ahead);
  std::memcpy(dst + run, src + run, n - run);
  ahead.Rest();
  return HwTail(r, src + run, n - run);
}

// ---- sse4.2+pclmul: eight 16-byte accumulators -----------------------------------------------

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

// A CRC moved forward over n bytes of zeros (the chained paths' joins): shift(c, n) =
// crc32(0, clmul(c, x^(8n-33) mod P)), `k` being x^(8n-33) mod P.
KVAGENT_FOLD_TARGET inline uint32_t ShiftBy(uint32_t c, uint32_t k) {
  const __m128i product = _mm_clmulepi64_si128(_mm_cvtsi32_si128(static_cast<int>(c)),
                                               _mm_cvtsi32_si128(static_cast<int>(k)), 0x00);
  return static_cast<uint32_t>(Step64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(product))));
}

// Register update over n bytes (a multiple of 128, at least 128), copying when kCopy.
template <bool kCopy, CopyStores kStores>
KVAGENT_FOLD_TARGET uint32_t FoldRun(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n,
                                     Ahead* ahead = nullptr) {
  if (ahead != nullptr) ahead->Begin<kCopy>(src, dst, n);
  const FoldConstants& k = Folds();
  __m128i x[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    x[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * i));
  }
  if constexpr (kCopy) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) Store<kStores>(reinterpret_cast<__m128i*>(dst + 16 * i), x[i]);
  }
  x[0] = _mm_xor_si128(x[0], _mm_cvtsi32_si128(static_cast<int>(r)));
  for (size_t done = 128; done < n; done += 128) {
    const uint8_t* s = src + done;
    if (ahead != nullptr) ahead->Step<kCopy>(src, dst, done, 128, n);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16 * i));
      if constexpr (kCopy) Store<kStores>(reinterpret_cast<__m128i*>(dst + done + 16 * i), d);
      x[i] = _mm_xor_si128(Fold(x[i], k.by128), d);
    }
  }
  __m128i acc = x[7];
#pragma GCC unroll 7
  for (int i = 0; i < 7; ++i) acc = _mm_xor_si128(acc, Fold(x[i], k.by16[7 - i]));
  const uint64_t lo = static_cast<uint64_t>(_mm_cvtsi128_si64(acc));
  const uint64_t hi = static_cast<uint64_t>(_mm_extract_epi64(acc, 1));
  return static_cast<uint32_t>(Step64(Step64(0, lo), hi));
}

constexpr size_t kFoldMin = 256;  // below this one crc32 chain is as fast

// FoldRun as a FoldCopyRun: copying, nothing asked for ahead.
template <CopyStores kStores>
KVAGENT_FOLD_TARGET uint32_t FoldCopy(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n) {
  return FoldRun<true, kStores>(r, dst, src, n);
}

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
  return AlignedFoldCopy<16, 128>(r, dst, src, n, stores, FoldCopy<CopyStores::kStreaming>,
                                  FoldCopy<CopyStores::kCached>);
}

// The cached copy of a get, asking for the caller's next value on the way.
KVAGENT_FOLD_TARGET uint32_t FoldCopyUpdateAhead(uint32_t r, uint8_t* dst, const uint8_t* src,
                                                 size_t n, CopyStores stores, const uint8_t* next,
                                                 size_t next_n) {
  return CopyUpdateAheadWith<128, kFoldMin, FoldCopyUpdate, FoldRun<true, CopyStores::kCached>>(
      r, dst, src, n, stores, next, next_n);
}

}  // namespace

bool HavePclmul() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_PCLMUL) != 0 &&
         (ecx & bit_SSE4_2) != 0;
}

namespace {

// The same folding 64 bytes per instruction (AVX-512 VPCLMULQDQ): four 64-byte accumulators move
// forward 256 bytes at a time, then fold into one 16-byte value as above.
// GCC 12's AVX-512 intrinsics start some results from an "undefined" vector, which
// -Wmaybe-uninitialized (and, once inlined into a fully unrolled loop, -Wuninitialized) reports
// inside the intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define KVAGENT_FOLD512_TARGET __attribute__((target("sse4.2,pclmul,avx512f,avx512vl,vpclmulqdq")))

KVAGENT_FOLD512_TARGET inline __m512i Fold512(__m512i x, __m512i k) {
  return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00),
                          _mm512_clmulepi64_epi128(x, k, 0x11));
}

KVAGENT_FOLD512_TARGET __m512i Broadcast(__m128i k) { return _mm512_broadcast_i32x4(k); }

// x moved forward by k, xored with d (one ternary-logic instruction for both xors).
KVAGENT_FOLD512_TARGET inline __m512i FoldInto(__m512i x, __m512i k, __m512i d) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                   _mm512_clmulepi64_epi128(x, k, 0x11), d, 0x96);
}

// The CRC of four 64-byte accumulators (x[3] the last), by64/128/192 the broadcast constants
// that move a lane 64, 128 and 192 bytes.
KVAGENT_FOLD512_TARGET inline uint32_t Reduce512(const __m512i (&x)[4], __m512i by64, __m512i by128,
                                                 __m512i by192) {
  const FoldConstants& k = Folds();
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

// 64 bytes at `at` of src, stored at the same offset of dst when kCopy.
template <bool kCopy, CopyStores kStores>
KVAGENT_FOLD512_TARGET inline __m512i LoadCopy512(uint8_t* dst, const uint8_t* src, size_t at) {
  const __m512i d = _mm512_loadu_si512(src + at);
  if constexpr (kCopy) {
    if constexpr (kStores == CopyStores::kStreaming) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + at), d);
    } else {
      _mm512_storeu_si512(dst + at, d);
    }
  }
  return d;
}

// Register update over n bytes (a multiple of 256, at least 256), copying when kCopy (dst
// 64-byte aligned for streaming stores). Cached: two sets of four 64-byte accumulators, 512
// bytes a step, while at least two steps are left: a fold's latency is longer than the time the
// unit takes to start the next, and with four the loop waited on it (4 KiB: 101 -> 81 ns).
// Streaming (a source from memory, at a few bytes a cycle): one set of four, 256 bytes a step;
// with two sets the copy of 1 MiB from memory ran ~6 % slower (medians of 16 rounds, 0.97 ->
// 1.03x of a plain streaming copy with 16-byte stores).
template <bool kCopy, CopyStores kStores>
KVAGENT_FOLD512_TARGET uint32_t Fold512Run(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n,
                                           Ahead* ahead = nullptr) {
  if (ahead != nullptr) ahead->Begin<kCopy>(src, dst, n);
  static const __m512i by512 = Broadcast(FoldConstant(512));
  static const __m512i by256 = Broadcast(FoldConstant(256));
  static const __m512i by64 = Broadcast(FoldConstant(64));
  static const __m512i by128 = Broadcast(FoldConstant(128));
  static const __m512i by192 = Broadcast(FoldConstant(192));
  if (ahead != nullptr) ahead->Step<kCopy>(src, dst, 0, 256, n);
  __m512i x[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) x[i] = LoadCopy512<kCopy, kStores>(dst, src, 64 * i);
  x[0] = _mm512_xor_si512(x[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(r))));
  size_t done = 256;
  if (kStores == CopyStores::kCached && n >= 512) {
    __m512i y[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) y[i] = LoadCopy512<kCopy, kStores>(dst, src, 256 + 64 * i);
    for (done = 512; done + 512 <= n; done += 512) {
      if (ahead != nullptr) ahead->Step<kCopy>(src, dst, done, 512, n);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        x[i] = FoldInto(x[i], by512, LoadCopy512<kCopy, kStores>(dst, src, done + 64 * i));
        y[i] = FoldInto(y[i], by512, LoadCopy512<kCopy, kStores>(dst, src, done + 256 + 64 * i));
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) x[i] = FoldInto(x[i], by256, y[i]);
  }
  for (; done < n; done += 256) {  // one step of 256 bytes is left at most
    if (ahead != nullptr) ahead->Step<kCopy>(src, dst, done, 256, n);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      x[i] = FoldInto(x[i], by256, LoadCopy512<kCopy, kStores>(dst, src, done + 64 * i));
    }
  }
  return Reduce512(x, by64, by128, by192);
}

// Fold512Run as a FoldCopyRun: copying, nothing asked for ahead.
template <CopyStores kStores>
KVAGENT_FOLD512_TARGET uint32_t Fold512Copy(uint32_t r, uint8_t* dst, const uint8_t* src,
                                            size_t n) {
  return Fold512Run<true, kStores>(r, dst, src, n);
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
  return AlignedFoldCopy<64, 256>(r, dst, src, n, stores, Fold512Copy<CopyStores::kStreaming>,
                                  Fold512Copy<CopyStores::kCached>);
}

// The cached copy of a get, asking for the caller's next value on the way.
KVAGENT_FOLD512_TARGET uint32_t Fold512CopyUpdateAhead(uint32_t r, uint8_t* dst, const uint8_t* src,
                                                       size_t n, CopyStores stores,
                                                       const uint8_t* next, size_t next_n) {
  return CopyUpdateAheadWith<256, kFoldMin + 64, Fold512CopyUpdate,
                             Fold512Run<true, CopyStores::kCached>, 512>(r, dst, src, n, stores,
                                                                         next, next_n);
}

// ---- avx512+vpclmulqdq+crc32: 4 KiB chunks, folds beside eight crc32 chains --------------
//
// On a CPU whose crc32 unit runs beside its carry-less multiplier, the folds alone leave the
// crc32 unit idle. Measured on the AMD Zen 5 VM these figures come from (cycles of the scalar
// clock): a 64-byte VPCLMULQDQ every other cycle, two crc32 a cycle (latency 3), and four of the
// one with twelve of the other in the same 8 cycles as the four alone. A 4 KiB chunk here is 8
// steps: its first 2 KiB go to four 64-byte accumulators (256 bytes a step: 8 multiplications,
// 16 cycles), its second to eight crc32 chains over lanes of 256 bytes (32 bytes each a step: 32
// crc32, 16 cycles; each chain's 4 take 12). A CRC of 4 KiB in L1: 53 ns against the folds'
// 85 ns; with a cached copy 63 against 89 ns. Where crc32 shares a port with the multiplier
// (Intel) it would be slower: checksum.cc times both on this CPU once and runs the faster.
// Chunks only up to kHybridMaxBytes (a longer value's nine streams per chunk would compete
// with the hardware prefetchers, which follow the folds' one stream well); streaming copies
// (a put into the pool) keep the folds: lanes would write partial lines.
constexpr size_t kHybridChunk = 4096;
constexpr size_t kHybridSteps = 8;
constexpr size_t kHybridVector = 256 * kHybridSteps;  // bytes of the accumulators
constexpr size_t kHybridLanes = 8;
constexpr size_t kHybridLaneStep = 32;
constexpr size_t kHybridLane = kHybridLaneStep * kHybridSteps;  // bytes of one chain
constexpr size_t kHybridMaxBytes = 64 * 1024;
static_assert(kHybridVector + kHybridLanes * kHybridLane == kHybridChunk);

struct HybridConstants {
  __m512i by256, by64, by128, by192;
  // x^(8n-33) mod P for the n bytes after the accumulators' part and after each lane but the
  // last (see ShiftBy).
  uint32_t after_vector = 0;
  uint32_t after_lane[kHybridLanes - 1] = {};
};

KVAGENT_FOLD512_TARGET HybridConstants MakeHybridConstants() {
  HybridConstants c;
  c.by256 = Broadcast(FoldConstant(256));
  c.by64 = Broadcast(FoldConstant(64));
  c.by128 = Broadcast(FoldConstant(128));
  c.by192 = Broadcast(FoldConstant(192));
  c.after_vector = XPowModP(8 * kHybridLanes * kHybridLane - 33);
  for (size_t l = 0; l + 1 < kHybridLanes; ++l) {
    c.after_lane[l] = XPowModP(8 * (kHybridLanes - 1 - l) * kHybridLane - 33);
  }
  return c;
}

KVAGENT_FOLD512_TARGET const HybridConstants& Hybrids() {
  static const HybridConstants constants = MakeHybridConstants();
  return constants;
}

// Register update over one 4 KiB chunk, copying it with cached stores when kCopy, and asking for
// the first next_n (at most 4 KiB) bytes at `next` over its steps: the 4 KiB that come after it
// (the rest of its value, or the caller's next value). Its own lines were asked for by the chunk
// or the copy before it. Asking for them again here, and for the destination's lines for writing
// (PREFETCHW), cost 128 more instructions a chunk: a cached copy of 4 KiB in L1 took 96 ns with
// them, 72 without (memcpy 31). Out of a 128 MiB pool into rotating destinations (alternating
// runs, AMD Zen 5 VM), against memcpy: 4 KiB values 0.83-0.89x -> 0.94-0.98x, 16 KiB
// 0.61-0.66x -> 0.92-0.93x, 64 KiB 0.59-0.66x -> 0.86-0.87x.
template <bool kCopy>
KVAGENT_FOLD512_TARGET uint32_t HybridChunk512(uint32_t r, uint8_t* dst, const uint8_t* src,
                                               const uint8_t* next, size_t next_n) {
  const HybridConstants& k = Hybrids();
  const uint8_t* lanes = src + kHybridVector;
  __m512i x[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) x[i] = LoadCopy512<kCopy, CopyStores::kCached>(dst, src, 64 * i);
  x[0] = _mm512_xor_si512(x[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(r))));
  uint64_t c[kHybridLanes];
#pragma GCC unroll 8
  for (size_t l = 0; l < kHybridLanes; ++l) c[l] = 0;
#pragma GCC unroll 8
  for (size_t step = 0; step < kHybridSteps; ++step) {
    for (size_t j = kAheadBytes / kHybridSteps * step;
         j < std::min(next_n, kAheadBytes / kHybridSteps * (step + 1)); j += 64) {
      Prefetch(next + j);
    }
    if (step > 0) {
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        x[i] = FoldInto(x[i], k.by256,
                        LoadCopy512<kCopy, CopyStores::kCached>(dst, src, 256 * step + 64 * i));
      }
    }
    const size_t at = kHybridLaneStep * step;
#pragma GCC unroll 4
    for (size_t q = 0; q < kHybridLaneStep; q += 8) {
#pragma GCC unroll 8
      for (size_t l = 0; l < kHybridLanes; ++l) {
        c[l] = Step64(c[l], Load64(lanes + l * kHybridLane + at + q));
      }
    }
    if constexpr (kCopy) {
      if (step % 2 == 1) {  // a whole line of each lane every other step: half the copy's uops
#pragma GCC unroll 8
        for (size_t l = 0; l < kHybridLanes; ++l) {
          const size_t off = kHybridVector + l * kHybridLane + at - kHybridLaneStep;
          _mm512_storeu_si512(dst + off, _mm512_loadu_si512(src + off));
        }
      }
    }
  }
  uint32_t out = ShiftBy(Reduce512(x, k.by64, k.by128, k.by192), k.after_vector);
#pragma GCC unroll 8
  for (size_t l = 0; l + 1 < kHybridLanes; ++l) {
    out ^= ShiftBy(static_cast<uint32_t>(c[l]), k.after_lane[l]);
  }
  return out ^ static_cast<uint32_t>(c[kHybridLanes - 1]);
}

// Whole chunks of [src, src + n) (n at most kHybridMaxBytes); returns the bytes done. With a
// `next`, each chunk asks for the 4 KiB after it: the rest of the value, then `next` (the
// caller's next value).
template <bool kCopy>
KVAGENT_FOLD512_TARGET size_t HybridChunks512(uint32_t& r, uint8_t* dst, const uint8_t* src,
                                              size_t n, const uint8_t* next = nullptr,
                                              size_t next_n = 0) {
  if (next == nullptr) next_n = 0;
  size_t done = 0;
  for (; done + kHybridChunk <= n; done += kHybridChunk) {
    const size_t after = done + kHybridChunk;
    const bool more = next_n > 0 && after < n;  // what is left of this value comes next
    r = HybridChunk512<kCopy>(r, kCopy ? dst + done : nullptr, src + done,
                              more ? src + after : next,
                              more ? std::min(n - after, kHybridChunk) : next_n);
  }
  return done;
}

KVAGENT_FOLD512_TARGET uint32_t Hybrid512Update(uint32_t r, const uint8_t* p, size_t n) {
  if (n > kHybridMaxBytes) return Fold512Update(r, p, n);
  const size_t done = HybridChunks512<false>(r, nullptr, p, n);
  return Fold512Update(r, p + done, n - done);
}

// Copies run the hybrid chunks only when they ask ahead, that is, when their source is likely in
// the cache: a caller that streams values asks for each one's lines while it copies the one before
// (a get's batch: it passes the next value as `next`). From memory the folds alone are faster:
// cached copies of values of 4-64 KiB read one after another out of a 256 MiB pool ran at 12.4-14.1
// GB/s with the hybrid chunks, 15.7-22.8 GB/s with the folds; the 64 KiB pieces a large get is
// shared in among threads (copy_helpers.h) made e2e_bench's get.16m 1.39x slower.
KVAGENT_FOLD512_TARGET uint32_t Hybrid512CopyUpdateAhead(uint32_t r, uint8_t* dst,
                                                         const uint8_t* src, size_t n,
                                                         CopyStores stores, const uint8_t* next,
                                                         size_t next_n) {
  if (stores == CopyStores::kStreaming || n > kHybridMaxBytes || n < kHybridChunk || next_n == 0) {
    return Fold512CopyUpdateAhead(r, dst, src, n, stores, next, next_n);
  }
  const size_t done = HybridChunks512<true>(r, dst, src, n, next, next_n);
  if (done == n) return r;
  return Fold512CopyUpdateAhead(r, dst + done, src + done, n - done, stores, next, next_n);
}

#pragma GCC diagnostic pop

}  // namespace

bool Hybrid512IsFaster() {
  static const bool faster = [] {
    // Both over the same 4 KiB in L1, alternating, the best of 256 rounds of 16 each: ~0.6 ms
    // once per process. The hybrid must win by a margin to be chosen. With 32 rounds and a
    // margin of 10 %, one kvagent in six on the AMD Zen 5 VM chose the folds: in some processes
    // both run slower for the whole of the first ~0.1 ms, and in some the hybrid's lead is ~15 %
    // instead of ~30 % (hybrid/folds of one process, 32 rounds: 0.68-0.97; 256 rounds:
    // 0.67-0.85). The folds then made 4 KiB batched gets ~5 % slower.
    alignas(64) static uint8_t block[kHybridChunk];
    for (size_t i = 0; i < sizeof(block); ++i) block[i] = static_cast<uint8_t>(i * 131 + 7);
    using Clock = std::chrono::steady_clock;
    auto best = [](uint32_t (*update)(uint32_t, const uint8_t*, size_t), uint32_t& sink) {
      const auto t0 = Clock::now();
      for (int i = 0; i < 16; ++i) sink ^= update(sink, block, sizeof(block));
      return Clock::now() - t0;
    };
    uint32_t sink = 0;
    Clock::duration folds = Clock::duration::max(), hybrid = Clock::duration::max();
    for (int round = 0; round < 256; ++round) {
      folds = std::min(folds, best(Fold512Update, sink));
      hybrid = std::min(hybrid, best(Hybrid512Update, sink));
    }
    __asm__ volatile("" : : "r"(sink));
    return hybrid.count() * 100 < folds.count() * 95;
  }();
  return faster;
}

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

namespace {

// ---- avx2+vpclmulqdq: folding beside three crc32 chains ------------------------------------

#define KVAGENT_HYBRID_TARGET __attribute__((target("sse4.2,pclmul,avx2,vpclmulqdq")))

// A chunk is `steps` steps of 224 bytes: its first 128 * steps bytes go to four 32-byte
// accumulators (128 bytes a step), the rest to three crc32 chains over three lanes of
// 32 * steps bytes each (32 bytes per chain a step). At the end the accumulators are folded into
// one CRC, and the four CRCs are joined by shifting each over the lanes after it: shift(c, n)
// = crc32(0, clmul(c, x^(8n-33) mod P)), one multiplication and one crc32 step.
constexpr size_t kVectorStep = 128;
constexpr size_t kLaneStep = 32;
constexpr size_t kChunkStep = kVectorStep + 3 * kLaneStep;
constexpr size_t kPrefetchAhead = 2048;

struct Chunk {
  size_t steps = 0;
  size_t bytes = 0;
  uint32_t after_vector = 0;  // x^(8 * 3 lanes - 33): the vector part's CRC over the three lanes
  uint32_t after_lane0 = 0;   // over two lanes
  uint32_t after_lane1 = 0;   // over one lane
};

Chunk MakeChunk(size_t steps) {
  Chunk c;
  c.steps = steps;
  c.bytes = steps * kChunkStep;
  const uint64_t lane_bits = 8 * kLaneStep * steps;
  c.after_vector = XPowModP(3 * lane_bits - 33);
  c.after_lane0 = XPowModP(2 * lane_bits - 33);
  c.after_lane1 = XPowModP(lane_bits - 33);
  return c;
}

// Two sizes (an even number of steps: the copy of a lane moves whole lines every other step):
// 18 steps (4,032 bytes: a 4 KiB value is one chunk and 64 bytes) and 256 steps (57,344 bytes:
// long streams for the prefetchers, and the joins cost nothing that shows).
struct Chunks {
  Chunk small = MakeChunk(18);
  Chunk large = MakeChunk(256);
};

const Chunks& HybridChunks() {
  static const Chunks chunks;
  return chunks;
}

KVAGENT_HYBRID_TARGET inline __m256i Fold256(__m256i x, __m256i k) {
  return _mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00),
                          _mm256_clmulepi64_epi128(x, k, 0x11));
}

template <CopyStores kStores>
KVAGENT_HYBRID_TARGET inline void Store256(uint8_t* out, __m256i v) {
  if constexpr (kStores == CopyStores::kStreaming) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out), v);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), v);
  }
}

KVAGENT_HYBRID_TARGET inline __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// The four accumulators folded into one CRC.
KVAGENT_HYBRID_TARGET inline uint32_t Reduce(const __m256i (&x)[4]) {
  const FoldConstants& k = Folds();
  __m128i lanes[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    lanes[2 * i] = _mm256_castsi256_si128(x[i]);
    lanes[2 * i + 1] = _mm256_extracti128_si256(x[i], 1);
  }
  __m128i acc = lanes[7];
  for (int i = 0; i < 7; ++i) acc = _mm_xor_si128(acc, Fold(lanes[i], k.by16[7 - i]));
  const uint64_t lo = static_cast<uint64_t>(_mm_cvtsi128_si64(acc));
  const uint64_t hi = static_cast<uint64_t>(_mm_extract_epi64(acc, 1));
  return static_cast<uint32_t>(Step64(Step64(0, lo), hi));
}

// Register update over n bytes (a multiple of 128) with the four accumulators alone, copying
// with streaming stores (dst 32-byte aligned).
KVAGENT_HYBRID_TARGET uint32_t FoldRun256(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n) {
  const __m256i by128 = _mm256_broadcastsi128_si256(Folds().by128);
  __m256i x[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    x[i] = Load256(src + 32 * i);
    Store256<CopyStores::kStreaming>(dst + 32 * i, x[i]);
  }
  x[0] = _mm256_xor_si256(x[0], _mm256_zextsi128_si256(_mm_cvtsi32_si128(static_cast<int>(r))));
  for (size_t done = kVectorStep; done < n; done += kVectorStep) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m256i d = Load256(src + done + 32 * i);
      Store256<CopyStores::kStreaming>(dst + done + 32 * i, d);
      x[i] = _mm256_xor_si256(Fold256(x[i], by128), d);
    }
  }
  return Reduce(x);
}

// Register update over one chunk (copying when kCopy; for streaming stores dst is 32-byte
// aligned, and so is every store below).
template <bool kCopy, CopyStores kStores>
KVAGENT_HYBRID_TARGET uint32_t HybridChunk(const Chunk& chunk, uint32_t r, uint8_t* dst,
                                           const uint8_t* src, Ahead& ahead) {
  const __m256i by128 = _mm256_broadcastsi128_si256(Folds().by128);  // both halves: 128 bytes
  const size_t vector_bytes = chunk.steps * kVectorStep;
  const size_t lane_bytes = chunk.steps * kLaneStep;
  const uint8_t* lane = src + vector_bytes;
  // Loads wait for memory while the crc32 chains and the folds fill the instruction window, so
  // the hardware prefetcher alone leaves the loop at ~half the speed of memcpy on values fresh
  // from memory. A small chunk is asked for whole at once; a large one its first lines, then
  // each stream kPrefetchAhead bytes ahead (a quarter of that in each lane), within the chunk.
  const bool small = chunk.bytes <= 4096;
  if (small) {
    for (size_t at = 0; at < chunk.bytes; at += 64) {
      Prefetch(src + at);
      if constexpr (kCopy && kStores == CopyStores::kCached) PrefetchForWrite(dst + at);
    }
  } else {
    for (size_t at = 0; at < kPrefetchAhead; at += 64) Prefetch(src + at);
    for (size_t at = 0; at < kPrefetchAhead / 4; at += 64) {
      for (size_t l = 0; l < 3; ++l) Prefetch(lane + l * lane_bytes + at);
    }
  }
  __m256i x[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) x[i] = Load256(src + 32 * i);
  if constexpr (kCopy) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) Store256<kStores>(dst + 32 * i, x[i]);
  }
  x[0] = _mm256_xor_si256(x[0], _mm256_zextsi128_si256(_mm_cvtsi32_si128(static_cast<int>(r))));
  uint64_t c0 = 0, c1 = 0, c2 = 0;
  for (size_t step = 0; step < chunk.steps; ++step) {
    if (step > 0) {
      const uint8_t* v = src + kVectorStep * step;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m256i d = Load256(v + 32 * i);
        if constexpr (kCopy) Store256<kStores>(dst + kVectorStep * step + 32 * i, d);
        x[i] = _mm256_xor_si256(Fold256(x[i], by128), d);
      }
    }
    const size_t at = kLaneStep * step;
    ahead.Step();
    if (!small) {
      const size_t ahead = kVectorStep * step + kPrefetchAhead;
      if (ahead < vector_bytes) Prefetch(src + ahead), Prefetch(src + ahead + 64);
      if (step % 2 == 0 && at + kPrefetchAhead / 4 < lane_bytes) {
        for (size_t l = 0; l < 3; ++l) Prefetch(lane + l * lane_bytes + at + kPrefetchAhead / 4);
      }
    }
    for (size_t q = 0; q < kLaneStep; q += 8) {
      c0 = Step64(c0, Load64(lane + at + q));
      c1 = Step64(c1, Load64(lane + lane_bytes + at + q));
      c2 = Step64(c2, Load64(lane + 2 * lane_bytes + at + q));
    }
    if constexpr (kCopy) {
      // Whole 64-byte lines, every other step: a streaming store of half a line that waits
      // for its other half while three other lanes are written costs a partial line write.
      if (step % 2 == 1) {
        const size_t line = at - kLaneStep;
        for (size_t l = 0; l < 3; ++l) {
          const uint8_t* in = lane + l * lane_bytes + line;
          uint8_t* out = dst + vector_bytes + l * lane_bytes + line;
          Store256<kStores>(out, Load256(in));
          Store256<kStores>(out + 32, Load256(in + 32));
        }
      }
    }
  }
  return ShiftBy(Reduce(x), chunk.after_vector) ^
         ShiftBy(static_cast<uint32_t>(c0), chunk.after_lane0) ^
         ShiftBy(static_cast<uint32_t>(c1), chunk.after_lane1) ^ static_cast<uint32_t>(c2);
}

// Register update over n bytes: whole chunks, then one crc32 chain. For streaming stores dst is
// 32-byte aligned.
template <bool kCopy, CopyStores kStores>
KVAGENT_HYBRID_TARGET uint32_t HybridRun(uint32_t r, uint8_t* dst, const uint8_t* src, size_t n,
                                         Ahead ahead = Ahead()) {
  const Chunks& chunks = HybridChunks();
  if (ahead.at != ahead.end) {  // spread over the first chunk's steps
    ahead.Spread(n >= chunks.large.bytes ? chunks.large.steps : chunks.small.steps);
  }
  for (const Chunk* chunk : {&chunks.large, &chunks.small}) {
    while (n >= chunk->bytes) {
      r = HybridChunk<kCopy, kStores>(*chunk, r, dst, src, ahead);
      src += chunk->bytes;
      if constexpr (kCopy) dst += chunk->bytes;
      n -= chunk->bytes;
    }
  }
  if (n >= kFoldMin) {  // what is left of a value that was not a whole chunk
    const size_t run = n / 128 * 128;
    r = FoldRun<kCopy, kStores>(r, dst, src, run);
    src += run;
    if constexpr (kCopy) dst += run;
    n -= run;
  }
  if constexpr (kCopy) std::memcpy(dst, src, n);
  ahead.Rest();
  return HwTail(r, src, n);
}

KVAGENT_HYBRID_TARGET uint32_t HybridUpdate(uint32_t r, const uint8_t* p, size_t n) {
  return HybridRun<false, CopyStores::kCached>(r, nullptr, p, n);
}

KVAGENT_HYBRID_TARGET uint32_t HybridStreamingCopy(uint32_t r, uint8_t* dst, const uint8_t* src,
                                                   size_t n);

KVAGENT_HYBRID_TARGET uint32_t HybridCopyUpdate(uint32_t r, uint8_t* dst, const uint8_t* src,
                                                size_t n, CopyStores stores) {
  if (n < kFoldMin) {
    std::memcpy(dst, src, n);
    return HwTail(r, src, n);
  }
  if (stores == CopyStores::kCached) return HybridRun<true, CopyStores::kCached>(r, dst, src, n);
  return HybridStreamingCopy(r, dst, src, n);
}

KVAGENT_HYBRID_TARGET uint32_t HybridCopyUpdateAhead(uint32_t r, uint8_t* dst, const uint8_t* src,
                                                     size_t n, CopyStores stores,
                                                     const uint8_t* next, size_t next_n) {
  const Ahead ahead(next, next_n);
  if (n < kFoldMin || stores == CopyStores::kStreaming) {
    r = HybridCopyUpdate(r, dst, src, n, stores);
    ahead.Rest();
    return r;
  }
  return HybridRun<true, CopyStores::kCached>(r, dst, src, n, ahead);
}

KVAGENT_HYBRID_TARGET uint32_t HybridStreamingCopy(uint32_t r, uint8_t* dst, const uint8_t* src,
                                                   size_t n) {
  // Streaming stores: one sequential stream of whole lines, the folds alone (the four streams
  // of a chunk written at once ran at half the speed of a streaming copy).
  return AlignedFoldCopy<32, 128>(r, dst, src, n, CopyStores::kStreaming, FoldRun256,
                                  /*cached=*/nullptr);
}

}  // namespace

bool HaveVpclmul256() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool avx2 = (ebx & bit_AVX2) != 0;
  const bool vpclmul = (ecx & bit_VPCLMULQDQ) != 0;
  // The OS must save the ymm state (XCR0 bits 1 and 2).
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  if ((ecx & bit_OSXSAVE) == 0) return false;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return avx2 && vpclmul && (xcr0_lo & 0x6) == 0x6 && HavePclmul();
}

const Path kFoldPath{FoldUpdate, FoldCopyUpdate, "sse4.2+pclmul", FoldCopyUpdateAhead};
const Path kHybridPath{HybridUpdate, HybridCopyUpdate, "avx2+vpclmulqdq", HybridCopyUpdateAhead};
const Path kFold512Path{Fold512Update, Fold512CopyUpdate, "avx512+vpclmulqdq",
                        Fold512CopyUpdateAhead};
const Path kHybrid512Path{Hybrid512Update, Fold512CopyUpdate, "avx512+vpclmulqdq+crc32",
                          Hybrid512CopyUpdateAhead};

}  // namespace kvagent::crc32c
#endif  // defined(__x86_64__)

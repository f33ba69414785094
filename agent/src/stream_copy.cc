#include "stream_copy.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <cstring>

#include "kvagent/common/checksum.h"

namespace kvagent::agent {
namespace {

// Below this a plain memcpy is as fast (the fence costs more than the saved reads).
constexpr size_t kStreamMinBytes = 1024;

// One 64-byte line from src to dst (16-byte aligned) with non-temporal stores.
inline void StreamLine(uint8_t* dst, const uint8_t* src) {
#if defined(__x86_64__)
  // Four unaligned loads, four streaming stores (SSE2 is part of x86-64).
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
  const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
  _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
  _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
  _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
  _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
#elif defined(__aarch64__)
  // Two pairs of 16-byte loads, two STNP (store pair, non-temporal hint) of two q registers.
  // STNP is ordered like any store for barriers, so no fence is needed after the loop.
  __asm__ volatile(
      "ldp q0, q1, [%[s]]\n\t"
      "ldp q2, q3, [%[s], #32]\n\t"
      "stnp q0, q1, [%[d]]\n\t"
      "stnp q2, q3, [%[d], #32]"
      :
      : [d] "r"(dst), [s] "r"(src)
      : "v0", "v1", "v2", "v3", "memory");
#else
  std::memcpy(dst, src, 64);
#endif
}

}  // namespace

void StreamCopy(uint8_t* dst, const uint8_t* src, size_t n, bool fence) {
  if (n < kStreamMinBytes) {
    std::memcpy(dst, src, n);
    return;
  }
  // Streaming stores want 16-byte aligned destinations: copy the head normally.
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  for (size_t lines = n / 64; lines > 0; --lines) {
    StreamLine(dst, src);
    src += 64;
    dst += 64;
  }
  // Streaming stores are weakly ordered: complete them before anyone is told.
  if (fence) FenceStreamingStores();
  std::memcpy(dst, src, n % 64);
}

}  // namespace kvagent::agent

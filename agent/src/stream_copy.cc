#include "stream_copy.h"

#include <emmintrin.h>

#include <cstring>

namespace kvagent::agent {
namespace {

// Below this a plain memcpy is as fast (the fence costs more than the saved reads).
constexpr size_t kStreamMinBytes = 1024;

}  // namespace

void StreamCopy(uint8_t* dst, const uint8_t* src, size_t n) {
  if (n < kStreamMinBytes) {
    std::memcpy(dst, src, n);
    return;
  }
  // Streaming stores need 16-byte aligned destinations: copy the head normally.
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  // One cache line per iteration: four unaligned loads, four streaming stores.
  for (size_t lines = n / 64; lines > 0; --lines) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
    src += 64;
    dst += 64;
  }
  _mm_sfence();  // streaming stores are weakly ordered: complete them before anyone is told
  std::memcpy(dst, src, n % 64);
}

}  // namespace kvagent::agent

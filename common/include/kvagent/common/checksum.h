// CRC32C (Castagnoli), the checksum every stored value carries end to end, and the copies that
// compute it on the way.
//
// A value's checksum is taken when its bytes enter the system (the agent's copy from the client's
// arena into the node pool), kept by the master with the value's placement, and verified by the
// agent that answers a Get (folded into the copy from the pool into the reader's buffer, or one
// pass over bytes that arrived from a peer). The copies below compute the CRC in the same pass as
// the copy, so checksumming costs no extra trip through memory.
//
// Values: the standard CRC-32C (iSCSI, RFC 3720): Crc32c("123456789") == 0xE3069283. Extend a
// checksum across pieces by passing the previous result as `crc`:
//   Crc32c(b, nb, Crc32c(a, na)) == Crc32c(a ++ b).
// Hardware paths, the fastest the CPU has chosen at run time: on x86-64 AVX-512 VPCLMULQDQ
// folding, alone or (for values up to 64 KiB, where the CPU runs crc32 beside the carry-less
// multiplier: timed once per process) beside eight crc32 chains, AVX2 VPCLMULQDQ folding beside
// three crc32 chains, PCLMULQDQ folding, or the SSE4.2 crc32 instruction (cpuid); on aarch64 the
// ARMv8 CRC32 extension (getauxval HWCAP_CRC32). A table otherwise. All give the same values. The
// environment variable KVAGENT_CRC32C, read once, names another available path (for tests and
// benchmarks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvagent {

// The checksum of [data, data + n), continuing from `crc` (0 to start).
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

enum class CopyStores : uint8_t {
  kCached,  // ordinary stores: the destination is read again soon (a Get into the reader's buffer)
  kStreaming,  // non-temporal stores on x86-64 (ordinary ones elsewhere): the destination is cold
               // memory (a Put into the pool); the bytes are visible to other threads and
               // processes when the call returns
  // As kStreaming, but the stores may still be on their way when the call returns: the caller
  // calls FenceStreamingStores() before it tells anyone the bytes are there. A batch of copies
  // then pays one fence instead of one per copy; each fence waits until the copy's stores have
  // reached memory, where the next copy's loads could have overlapped them (a batch of 128 4 KiB
  // puts: ~6 % of its time on an AMD Zen 5 VM).
  kStreamingUnfenced,
};

// Makes the streaming stores this thread has made so far (kStreamingUnfenced) visible to other
// threads and processes before any store that follows: sfence on x86-64; nothing elsewhere,
// where such stores are ordered like any other.
void FenceStreamingStores();

// Copies n bytes from src to dst (no overlap) and returns Crc32c(src, n, crc), reading src once.
uint32_t CopyWithCrc32c(void* dst, const void* src, size_t n, CopyStores stores, uint32_t crc = 0);

// A range of memory to bring into the cache while a copy runs.
struct PrefetchRange {
  const void* data = nullptr;
  size_t n = 0;
};

// Asks the CPU for the first 4 KiB of `range` (a hint; what CopyWithCrc32c below does with its
// `next` when the copy is done).
void PrefetchStart(PrefetchRange range);

// As above, and asks the CPU for the first 4 KiB of `next` a few lines at a time while it copies
// (a hint). Without a `next`, a small value with ordinary stores (up to 16 KiB) is copied first
// and its CRC taken over dst, then in L1: the same bytes, faster out of cold memory. A caller that
// copies many values out of memory the cache does not hold (a get's parts out of the node pool)
// names the next one, so that its memory latency overlaps this copy and checksum instead of adding
// to the next. A copy of more than 64 KiB leaves its own lines to the hardware prefetchers and
// asks for `next` when it is done.
uint32_t CopyWithCrc32c(void* dst, const void* src, size_t n, CopyStores stores, uint32_t crc,
                        PrefetchRange next);

// The CRC of a ++ b from crc(a), crc(b) and the length of b (GF(2) arithmetic; O(log nb)).
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t nb);

// Crc32cCombine in two steps, for many b of one length: Crc32cShift(crc_a, Crc32cShifter(nb)) ^
// crc_b equals Crc32cCombine(crc_a, crc_b, nb); the shift alone is one multiplication.
uint32_t Crc32cShifter(uint64_t nb);
uint32_t Crc32cShift(uint32_t crc_a, uint32_t shifter);

// The path this process uses (for logs and benchmarks): "avx512+vpclmulqdq+crc32",
// "avx512+vpclmulqdq", "avx2+vpclmulqdq", "sse4.2+pclmul", "sse4.2", "armv8-crc" or "table".
const char* Crc32cImplementation();

// The paths this CPU can run, fastest first ("table" always, last).
std::vector<std::string> Crc32cImplementationsAvailable();

}  // namespace kvagent

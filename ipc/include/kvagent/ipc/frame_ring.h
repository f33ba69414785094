// A lock-free single-producer / single-consumer ring of variable-length frames that lives in
// shared memory, with futex wake words so that either side can sleep instead of spinning.
//
// Layout in shared memory: one RingControl (indices and wake words) and a data area of
// `capacity` bytes (a power of two). Each record is a 16-byte RecordHeader followed by the
// payload, padded so that every record starts and ends on a 16-byte boundary. A record never
// wraps: when it does not fit before the end of the data area, the producer first writes a
// padding record that fills the rest, and the frame starts again at offset 0.
//
// Indices: `tail` (bytes ever published) and `head` (bytes ever consumed) grow monotonically;
// the position in the data area is index & (capacity - 1). Invariant kept by an honest peer:
// 0 <= tail - head <= capacity, and both are multiples of 16. Each side keeps its own index in
// private memory and only publishes it, so a peer scribbling over the shared control block can
// never make us read or write outside the data area: every value read from the peer's side is
// checked, and a violation is reported as kCorrupt (the caller then drops the peer).
//
// Memory orders (rigtorp style):
//  - producer: writes the record, then tail.store(release) publishes it; the consumer's
//    tail.load(acquire) makes the record's bytes visible.
//  - consumer: reads the record, then head.store(release) returns the space; the producer's
//    head.load(acquire) orders its later overwrite after the consumer's reads.
//  - each side caches the other's index and reloads it only when the cached value says the
//    ring is empty (consumer) or full (producer): one shared-line miss per batch, not per frame.
//
// Sleep protocol (the same for "consumer waits for data" and "producer waits for space"):
//  waiter:   seq = wake_seq.load(acquire); sleeping.store(1, seq_cst); fence(seq_cst);
//            re-check the peer's index with a seq_cst load; if still nothing:
//            FUTEX_WAIT(wake_seq, seq)
//  notifier: index.store(seq_cst); if sleeping.load(seq_cst): wake_seq += 1; FUTEX_WAKE.
//  The waiter's flag store and index load and the notifier's index store and flag load are all
//  seq_cst, so they sit in one total order: the waiter cannot miss the index while the notifier
//  misses the flag (Dekker). A wake that lands before FUTEX_WAIT changes wake_seq, so the wait
//  returns at once. The notifier pays one locked store (xchg on x86) and one load per publish,
//  and a syscall only when the peer advertised sleep. NotifyIfSleeping() is the fence-based form
//  for state that is not a ring index (the agent's private control word).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvagent/ipc/cpu_yield.h"
#include "kvagent/ipc/futex.h"

namespace kvagent::ipc {

inline constexpr size_t kCacheLine = 64;
inline constexpr uint64_t kRecordAlign = 16;
inline constexpr uint64_t kMinRingBytes = 4096;

// Shared control block of one ring. Trivially copyable atomics only; zero-initialized memory
// is a valid empty ring.
struct RingControl {
  // Written by the producer only.
  alignas(kCacheLine) std::atomic<uint64_t> tail;
  // Written by the consumer only.
  alignas(kCacheLine) std::atomic<uint64_t> head;
  // Consumer sleeps on data_seq after setting consumer_sleeping; the producer bumps data_seq.
  alignas(kCacheLine) std::atomic<uint32_t> data_seq;
  std::atomic<uint32_t> consumer_sleeping;
  // Producer sleeps on space_seq after setting producer_waiting; the consumer bumps space_seq.
  alignas(kCacheLine) std::atomic<uint32_t> space_seq;
  std::atomic<uint32_t> producer_waiting;
};
static_assert(sizeof(RingControl) == 4 * kCacheLine);

// The header in front of every record in the data area.
struct RecordHeader {
  uint32_t length;  // payload bytes (kFrame) or bytes after this header up to the end (kPadding)
  uint32_t kind;    // RecordKind
  uint64_t request_id;  // the frame's request id (on kvagent's rings); 0 for padding
};
static_assert(sizeof(RecordHeader) == kRecordAlign);
static_assert(offsetof(RecordHeader, request_id) == 8);  // where the former `tag` was

enum RecordKind : uint32_t { kRecordFrame = 0x46524D31, kRecordPadding = 0x50414431 };

// Where a ring lives: its control block and data area, both inside a mapping that outlives
// every FrameProducer/FrameConsumer built on it.
struct RingRef {
  RingControl* control = nullptr;
  uint8_t* data = nullptr;
  uint64_t capacity = 0;  // power of two, >= kMinRingBytes
};

// Largest payload a ring of `capacity` bytes can carry.
constexpr uint64_t MaxFramePayload(uint64_t capacity) { return capacity - sizeof(RecordHeader); }

enum class PushResult {
  kOk,
  kFull,      // not enough free space now; retry after the consumer frees some
  kTooLarge,  // the frame can never fit: payload > MaxFramePayload(capacity)
  kCorrupt,   // the consumer's index is impossible: the peer is broken or hostile
};

class FrameProducer {
 public:
  FrameProducer() = default;
  // Starts at index 0 on a fresh ring, without reading the control block: whatever a peer wrote
  // there before is never trusted (the first reload of its index checks it). The producer must
  // be the only writer of `ring.control->tail`.
  explicit FrameProducer(RingRef ring);

  // Appends one frame and publishes it, waking the consumer if it advertised sleep.
  [[nodiscard]] PushResult TryPush(uint64_t request_id, std::span<const uint8_t> payload);

  // Appends one frame without publishing it: a burst of TryAppend calls followed by one
  // Publish() costs one fence instead of one per frame. Frames stay invisible to the consumer
  // until Publish().
  [[nodiscard]] PushResult TryAppend(uint64_t request_id, std::span<const uint8_t> payload);

  // Publishes everything appended (release store of tail) and wakes a sleeping consumer. Cheap
  // when nothing is pending.
  void Publish();

  // True when TryPush of `payload_bytes` would make progress now: the frame fits, or (near the
  // end of the data area) its wrap padding fits. Reloads the consumer's index when needed.
  // Returns false also when the index is corrupt; TryPush then reports kCorrupt.
  [[nodiscard]] bool HasSpaceFor(uint64_t payload_bytes);

  // First half of the sleep protocol for a producer that found the ring full: advertises the
  // wait and returns the space_seq value to wait on. Call HasSpaceFor() afterwards and sleep on
  // space_word() only if it is still false; EndSpaceWait() once done either way.
  [[nodiscard]] uint32_t BeginSpaceWait();
  void EndSpaceWait();
  const std::atomic<uint32_t>* space_word() const { return &ring_.control->space_seq; }

  // Blocks until a frame of `payload_bytes` fits, spinning `spin` first and then sleeping on the
  // futex in slices of at most `slice`. Returns true when it fits, false after `timeout` or
  // when `should_stop()` returns true (checked after every slice).
  template <typename StopFn>
  [[nodiscard]] bool WaitForSpace(uint64_t payload_bytes, std::chrono::nanoseconds spin,
                                  std::chrono::nanoseconds timeout, std::chrono::nanoseconds slice,
                                  StopFn&& should_stop);

  uint64_t capacity() const { return ring_.capacity; }

 private:
  // Free bytes TryPush needs for its next step from the current tail.
  uint64_t BytesNeeded(uint64_t payload) const;
  // Reads the consumer's index; false when it is impossible (corrupt).
  bool ReloadHead();

  RingRef ring_;
  uint64_t tail_ = 0;         // private copy of what we appended
  uint64_t published_ = 0;    // what the consumer can see
  uint64_t cached_head_ = 0;  // last consumer index we read (validated)
};

struct Frame {
  uint64_t request_id = 0;
  std::span<const uint8_t> payload;  // points into the ring: valid until Pop()
};

enum class PeekResult { kFrame, kEmpty, kCorrupt };

class FrameConsumer {
 public:
  FrameConsumer() = default;
  // Starts at index 0 on a fresh ring, without reading the control block (see FrameProducer).
  // The consumer must be the only writer of `head`.
  explicit FrameConsumer(RingRef ring);

  // Looks at the next frame without consuming it (padding records are skipped). On kCorrupt the
  // producer's index or a record header is impossible; the ring must not be used again.
  [[nodiscard]] PeekResult Peek(Frame* frame);

  // Consumes the frame returned by the last successful Peek(), publishes the new head and wakes
  // the producer if it is waiting for space.
  void Pop();

  // Consumes the frame returned by the last Peek() without publishing: after a burst, one
  // PublishHead() returns all the space at once (one fence instead of one per frame).
  void Consume();
  void PublishHead();

  // True when the producer has published something we have not consumed (one acquire load).
  [[nodiscard]] bool HasData() const;

  // Sleep protocol pieces (see the file comment): BeginDataWait advertises sleep and returns the
  // data_seq value to wait on; re-check HasData() before sleeping; EndDataWait clears the flag.
  [[nodiscard]] uint32_t BeginDataWait();
  void EndDataWait();
  const std::atomic<uint32_t>* data_word() const { return &ring_.control->data_seq; }

  // Blocks until data arrives: spins `spin`, then sleeps on the futex, for at most `timeout`
  // in all. Returns true when data is there; false after the timeout, or when `should_stop()`
  // returns true after a wake (whoever sets the stop condition bumps data_word() and wakes it).
  template <typename StopFn>
  [[nodiscard]] bool WaitForData(std::chrono::nanoseconds spin, std::chrono::nanoseconds timeout,
                                 StopFn&& should_stop);
  [[nodiscard]] bool WaitForData(std::chrono::nanoseconds spin, std::chrono::nanoseconds timeout) {
    return WaitForData(spin, timeout, [] { return false; });
  }

  uint64_t capacity() const { return ring_.capacity; }

 private:
  RingRef ring_;
  uint64_t head_ = 0;           // private copy of what we consumed
  uint64_t published_ = 0;      // what the producer can see
  uint64_t cached_tail_ = 0;    // last producer index we read (validated)
  uint64_t pending_bytes_ = 0;  // size of the record Peek() returned, consumed by Pop()
};

// Raises `sleeping` and returns the value of `seq` to FUTEX_WAIT on: the waiter half of the
// sleep protocol. Re-check the condition after it, before sleeping.
uint32_t AdvertiseSleep(std::atomic<uint32_t>& sleeping, std::atomic<uint32_t>& seq);

// Wakes a sleeper on `seq` if `sleeping` is set: the notifier half of the sleep protocol.
// Call after publishing an index.
void NotifyIfSleeping(std::atomic<uint32_t>& sleeping, std::atomic<uint32_t>& seq);

// A spin-loop hint: `pause` on x86 (the sibling hyperthread gets the core, and leaving the loop
// costs no memory-order mis-speculation), `yield` on aarch64; elsewhere only a compiler barrier.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

// What a waiter spins before it lets other runnable threads of its CPU go first between rounds
// (FrameConsumer::WaitForData; cpu_yield.h says when it does not): a call answered sooner (the
// agent's own, ~4 us) never yields.
inline constexpr std::chrono::microseconds kYieldAfter{10};

// ---- template implementation --------------------------------------------------------------

template <typename StopFn>
bool FrameProducer::WaitForSpace(uint64_t payload_bytes, std::chrono::nanoseconds spin,
                                 std::chrono::nanoseconds timeout, std::chrono::nanoseconds slice,
                                 StopFn&& should_stop) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto spin_until = start + spin;
  const auto deadline = start + timeout;
  while (true) {
    if (HasSpaceFor(payload_bytes)) return true;
    const auto now = Clock::now();
    if (now >= deadline || should_stop()) return false;
    if (now < spin_until) {
      CpuRelax();
      continue;
    }
    const uint32_t seq = BeginSpaceWait();
    if (HasSpaceFor(payload_bytes)) {
      EndSpaceWait();
      return true;
    }
    auto wait = std::min<std::chrono::nanoseconds>(slice, deadline - now);
    (void)FutexWait(space_word(), seq, wait);
    EndSpaceWait();
  }
}

template <typename StopFn>
bool FrameConsumer::WaitForData(std::chrono::nanoseconds spin, std::chrono::nanoseconds timeout,
                                StopFn&& should_stop) {
  using Clock = std::chrono::steady_clock;
  if (HasData()) return true;
  const auto start = Clock::now();
  for (auto now = start; now - start < spin; now = Clock::now()) {
    for (int i = 0; i < 64; ++i) {
      if (HasData()) return true;
      CpuRelax();
    }
    // Past the first kYieldAfter, a thread runnable on this CPU (the agent's, kvmaster's on a
    // small host) gets it between rounds instead of waiting for the spin to end.
    if (now - start >= kYieldAfter) YieldCpu();
  }
  // A wake may be stale (meant for an earlier sleep of ours) or spurious: sleep again until data
  // is really there, the time is up or the caller wants to stop.
  while (true) {
    const uint32_t seq = BeginDataWait();
    if (HasData()) {
      EndDataWait();
      return true;
    }
    const auto left = timeout - (Clock::now() - start);
    if (left.count() <= 0 || should_stop()) {
      EndDataWait();
      return false;
    }
    (void)FutexWait(data_word(), seq, left);
    EndDataWait();
    if (HasData()) return true;
  }
}

}  // namespace kvagent::ipc

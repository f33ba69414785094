#include "kvagent/ipc/frame_ring.h"

#include <cstring>

namespace kvagent::ipc {
namespace {

constexpr uint64_t RecordBytes(uint64_t payload) {
  return (sizeof(RecordHeader) + payload + kRecordAlign - 1) & ~(kRecordAlign - 1);
}

}  // namespace

// The waiter half of the sleep protocol: read the word to sleep on, then raise the flag. The
// seq_cst store and fence pair with either notifier form below (the waiter's path is the slow
// one, so it pays for both).
uint32_t AdvertiseSleep(std::atomic<uint32_t>& sleeping, std::atomic<uint32_t>& seq) {
  const uint32_t value = seq.load(std::memory_order_acquire);
  sleeping.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return value;
}

namespace {

void Wake(std::atomic<uint32_t>& seq) {
  seq.fetch_add(1, std::memory_order_release);
  FutexWake(&seq);
}

// The ring's notifier: the index store and the flag load are both seq_cst, so they cannot pass
// each other, nor the waiter's seq_cst flag store and index re-load (all four sit in one total
// order). On x86 this is one xchg and a plain load: cheaper than store + mfence.
void PublishIndex(std::atomic<uint64_t>& index, uint64_t value, std::atomic<uint32_t>& sleeping,
                  std::atomic<uint32_t>& seq) {
  index.store(value, std::memory_order_seq_cst);
  if (sleeping.load(std::memory_order_seq_cst) != 0) Wake(seq);
}

}  // namespace

void NotifyIfSleeping(std::atomic<uint32_t>& sleeping, std::atomic<uint32_t>& seq) {
  // Pairs with the waiter's fence between "sleeping = 1" and its re-check of our state.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping.load(std::memory_order_relaxed) != 0) Wake(seq);
}

// ---- producer -----------------------------------------------------------------------------

FrameProducer::FrameProducer(RingRef ring) : ring_(ring) {}

uint64_t FrameProducer::BytesNeeded(uint64_t payload) const {
  // From a tail near the end, progress is first the padding (to_end bytes); the frame itself
  // then needs its record size from offset 0.
  const uint64_t record = RecordBytes(payload);
  const uint64_t to_end = ring_.capacity - (tail_ & (ring_.capacity - 1));
  return record <= to_end ? record : to_end;
}

bool FrameProducer::ReloadHead() {
  // seq_cst: this is also the re-check of the sleep protocol (see AdvertiseSleep).
  const uint64_t head = ring_.control->head.load(std::memory_order_seq_cst);
  // An honest consumer's head is behind our tail by at most the capacity, and never ahead of it.
  if (tail_ - head > ring_.capacity || (head & (kRecordAlign - 1)) != 0) return false;
  cached_head_ = head;
  return true;
}

bool FrameProducer::HasSpaceFor(uint64_t payload_bytes) {
  if (payload_bytes > MaxFramePayload(ring_.capacity)) return false;
  const uint64_t need = BytesNeeded(payload_bytes);
  if (ring_.capacity - (tail_ - cached_head_) >= need) return true;
  if (!ReloadHead()) return false;
  return ring_.capacity - (tail_ - cached_head_) >= need;
}

void FrameProducer::Publish() {
  if (published_ == tail_) return;
  published_ = tail_;
  PublishIndex(ring_.control->tail, tail_, ring_.control->consumer_sleeping,
               ring_.control->data_seq);
}

PushResult FrameProducer::TryPush(uint64_t request_id, std::span<const uint8_t> payload) {
  const PushResult r = TryAppend(request_id, payload);
  if (r == PushResult::kOk) Publish();
  return r;
}

PushResult FrameProducer::TryAppend(uint64_t request_id, std::span<const uint8_t> payload) {
  const uint64_t cap = ring_.capacity;
  if (payload.size() > MaxFramePayload(cap)) return PushResult::kTooLarge;
  const uint64_t record = RecordBytes(payload.size());
  if (cap - (tail_ - cached_head_) < BytesNeeded(payload.size()) && !ReloadHead()) {
    return PushResult::kCorrupt;
  }
  uint64_t pos = tail_ & (cap - 1);
  const uint64_t to_end = cap - pos;
  if (record > to_end) {
    // The frame does not fit before the end: pad to the end, and start it again at offset 0.
    if (cap - (tail_ - cached_head_) < to_end) return PushResult::kFull;
    RecordHeader pad{static_cast<uint32_t>(to_end - sizeof(RecordHeader)), kRecordPadding, 0};
    std::memcpy(ring_.data + pos, &pad, sizeof(pad));
    tail_ += to_end;
    pos = 0;
    if (cap - (tail_ - cached_head_) < record && !ReloadHead()) return PushResult::kCorrupt;
    if (cap - (tail_ - cached_head_) < record) {
      // Publish the padding alone so the consumer moves past it while we wait for space.
      Publish();
      return PushResult::kFull;
    }
  } else if (cap - (tail_ - cached_head_) < record) {
    return PushResult::kFull;
  }
  RecordHeader header{static_cast<uint32_t>(payload.size()), kRecordFrame, request_id};
  std::memcpy(ring_.data + pos, &header, sizeof(header));
  if (!payload.empty()) {
    std::memcpy(ring_.data + pos + sizeof(header), payload.data(), payload.size());
  }
  tail_ += record;
  return PushResult::kOk;
}

uint32_t FrameProducer::BeginSpaceWait() {
  return AdvertiseSleep(ring_.control->producer_waiting, ring_.control->space_seq);
}

void FrameProducer::EndSpaceWait() {
  ring_.control->producer_waiting.store(0, std::memory_order_relaxed);
}

// ---- consumer -----------------------------------------------------------------------------

FrameConsumer::FrameConsumer(RingRef ring) : ring_(ring) {}

bool FrameConsumer::HasData() const {
  // seq_cst: this is also the re-check of the sleep protocol (see AdvertiseSleep).
  return ring_.control->tail.load(std::memory_order_seq_cst) != head_;
}

PeekResult FrameConsumer::Peek(Frame* frame) {
  const uint64_t cap = ring_.capacity;
  while (true) {
    if (cached_tail_ == head_) {
      cached_tail_ = ring_.control->tail.load(std::memory_order_acquire);
      if (cached_tail_ == head_) return PeekResult::kEmpty;
    }
    const uint64_t avail = cached_tail_ - head_;
    if (avail > cap || (avail & (kRecordAlign - 1)) != 0) return PeekResult::kCorrupt;
    const uint64_t pos = head_ & (cap - 1);
    const uint64_t to_end = cap - pos;
    // Copy the header out once: the producer's memory may change under us (hostile peer), so
    // every check below works on this private copy.
    RecordHeader header;
    std::memcpy(&header, ring_.data + pos, sizeof(header));
    if (header.kind == kRecordPadding) {
      // A producer pads only a frame that does not fit before the end: never at offset 0 (any
      // frame fits a whole ring). A padding there would let a hostile producer, moving its tail
      // a ring ahead as fast as this loop skips, keep Peek from ever returning; with it refused
      // a Peek skips one padding at most.
      if (header.length != to_end - sizeof(RecordHeader) || to_end > avail || pos == 0) {
        return PeekResult::kCorrupt;
      }
      // Skip the padding and publish at once: a producer waiting for the space it frees must
      // not depend on another frame arriving first. Rare (once per wrap).
      head_ += to_end;
      PublishHead();
      continue;
    }
    if (header.kind != kRecordFrame) return PeekResult::kCorrupt;
    const uint64_t record = RecordBytes(header.length);
    if (record > to_end || record > avail) return PeekResult::kCorrupt;
    frame->request_id = header.request_id;
    frame->payload = std::span<const uint8_t>(ring_.data + pos + sizeof(header), header.length);
    pending_bytes_ = record;
    return PeekResult::kFrame;
  }
}

void FrameConsumer::Pop() {
  Consume();
  PublishHead();
}

void FrameConsumer::Consume() {
  head_ += pending_bytes_;
  pending_bytes_ = 0;
}

void FrameConsumer::PublishHead() {
  if (published_ == head_) return;
  published_ = head_;
  PublishIndex(ring_.control->head, head_, ring_.control->producer_waiting,
               ring_.control->space_seq);
}

uint32_t FrameConsumer::BeginDataWait() {
  return AdvertiseSleep(ring_.control->consumer_sleeping, ring_.control->data_seq);
}

void FrameConsumer::EndDataWait() {
  ring_.control->consumer_sleeping.store(0, std::memory_order_relaxed);
}

}  // namespace kvagent::ipc

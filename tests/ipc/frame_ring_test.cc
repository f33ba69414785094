// FrameRing: variable-length frames, wraparound, full/empty, oversized frames and a control
// block scribbled over by a hostile peer.
#include "kvagent/ipc/frame_ring.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace kvagent::ipc {
namespace {

// A ring in private memory: the same code runs on it as on a shared mapping.
class TestRing {
 public:
  explicit TestRing(uint64_t capacity) : data_(capacity) {
    ref_ = RingRef{&control_, data_.data(), capacity};
  }
  RingRef ref() const { return ref_; }
  RingControl& control() { return control_; }
  std::vector<uint8_t>& data() { return data_; }

 private:
  RingControl control_{};
  std::vector<uint8_t> data_;
  RingRef ref_;
};

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST(FrameRing, EmptyRingHasNoFrame) {
  TestRing ring(4096);
  FrameConsumer consumer(ring.ref());
  Frame frame;
  EXPECT_EQ(consumer.Peek(&frame), PeekResult::kEmpty);
  EXPECT_FALSE(consumer.HasData());
}

TEST(FrameRing, FramesOfEveryLengthArriveIntactAndInOrder) {
  TestRing ring(4096);
  FrameProducer producer(ring.ref());
  FrameConsumer consumer(ring.ref());
  for (size_t len = 0; len < 300; ++len) {
    auto payload = Bytes(len, static_cast<uint8_t>(len));
    ASSERT_EQ(producer.TryPush(1000 + len, payload), PushResult::kOk) << len;
    Frame frame;
    ASSERT_EQ(consumer.Peek(&frame), PeekResult::kFrame);
    EXPECT_EQ(frame.request_id, 1000 + len);
    ASSERT_EQ(frame.payload.size(), len);
    EXPECT_TRUE(std::equal(payload.begin(), payload.end(), frame.payload.begin()));
    consumer.Pop();
  }
  Frame frame;
  EXPECT_EQ(consumer.Peek(&frame), PeekResult::kEmpty);
}

TEST(FrameRing, WrapsAroundManyTimesWithPaddingRecords) {
  TestRing ring(4096);
  FrameProducer producer(ring.ref());
  FrameConsumer consumer(ring.ref());
  std::mt19937 rng(7);
  uint64_t pushed = 0;
  for (int round = 0; round < 5000; ++round) {
    const size_t len = rng() % 1500;
    auto payload = Bytes(len, static_cast<uint8_t>(round));
    ASSERT_EQ(producer.TryPush(round, payload), PushResult::kOk);
    pushed += len;
    Frame frame;
    ASSERT_EQ(consumer.Peek(&frame), PeekResult::kFrame);
    ASSERT_EQ(frame.request_id, static_cast<uint64_t>(round));
    ASSERT_EQ(frame.payload.size(), len);
    if (len > 0) {
      ASSERT_EQ(std::memcmp(frame.payload.data(), payload.data(), len), 0);
    }
    consumer.Pop();
  }
  // The indices went round the 4 KiB ring hundreds of times.
  EXPECT_GT(ring.control().tail.load(), 100u * 4096);
  EXPECT_EQ(ring.control().tail.load(), ring.control().head.load());
}

TEST(FrameRing, FullRingRefusesUntilTheConsumerFreesSpace) {
  TestRing ring(4096);
  FrameProducer producer(ring.ref());
  FrameConsumer consumer(ring.ref());
  auto payload = Bytes(100, 1);  // 128-byte records: 32 fit
  int accepted = 0;
  while (producer.TryPush(accepted, payload) == PushResult::kOk) ++accepted;
  EXPECT_EQ(accepted, 32);
  EXPECT_EQ(producer.TryPush(99, payload), PushResult::kFull);
  EXPECT_FALSE(producer.HasSpaceFor(100));
  Frame frame;
  ASSERT_EQ(consumer.Peek(&frame), PeekResult::kFrame);
  EXPECT_EQ(frame.request_id, 0u);
  consumer.Pop();
  EXPECT_TRUE(producer.HasSpaceFor(100));
  EXPECT_EQ(producer.TryPush(32, payload), PushResult::kOk);
  for (int expected = 1; expected <= 32; ++expected) {
    ASSERT_EQ(consumer.Peek(&frame), PeekResult::kFrame);
    EXPECT_EQ(frame.request_id, static_cast<uint64_t>(expected));
    consumer.Pop();
  }
  EXPECT_EQ(consumer.Peek(&frame), PeekResult::kEmpty);
}

TEST(FrameRing, FrameLargerThanTheRingIsAnErrorNotAWait) {
  TestRing ring(4096);
  FrameProducer producer(ring.ref());
  std::vector<uint8_t> big(MaxFramePayload(4096) + 1);
  EXPECT_EQ(producer.TryPush(1, big), PushResult::kTooLarge);
  std::vector<uint8_t> largest(MaxFramePayload(4096));
  EXPECT_EQ(producer.TryPush(2, largest), PushResult::kOk);
}

TEST(FrameRing, LargestFrameFitsEvenFromAnUnalignedTail) {
  TestRing ring(4096);
  FrameProducer producer(ring.ref());
  FrameConsumer consumer(ring.ref());
  ASSERT_EQ(producer.TryPush(1, Bytes(1000, 1)), PushResult::kOk);
  Frame frame;
  ASSERT_EQ(consumer.Peek(&frame), PeekResult::kFrame);
  consumer.Pop();
  std::vector<uint8_t> largest(MaxFramePayload(4096), 0xAB);
  // First attempt publishes the wrap padding and reports full; once the consumer skips the
  // padding, the frame goes in at offset 0.
  PushResult first = producer.TryPush(2, largest);
  ASSERT_EQ(first, PushResult::kFull);
  EXPECT_EQ(consumer.Peek(&frame), PeekResult::kEmpty);  // skips the padding, frees its space
  ASSERT_EQ(producer.TryPush(2, largest), PushResult::kOk);
  ASSERT_EQ(consumer.Peek(&frame), PeekResult::kFrame);
  EXPECT_EQ(frame.request_id, 2u);
  EXPECT_EQ(frame.payload.size(), largest.size());
}

TEST(FrameRing, ConsumerReportsCorruptWhenTheProducerIndexIsImpossible) {
  TestRing ring(4096);
  FrameConsumer consumer(ring.ref());
  Frame frame;
  ring.control().tail.store(4096 * 3);  // more than the capacity ahead of head
  EXPECT_EQ(consumer.Peek(&frame), PeekResult::kCorrupt);
  TestRing ring2(4096);
  FrameConsumer consumer2(ring2.ref());
  ring2.control().tail.store(24);  // not a multiple of the record alignment
  EXPECT_EQ(consumer2.Peek(&frame), PeekResult::kCorrupt);
}

TEST(FrameRing, ConsumerReportsCorruptForGarbageRecordHeaders) {
  for (uint32_t bad_length : {5000u, 4081u, 100000u}) {
    TestRing ring(4096);
    FrameProducer producer(ring.ref());
    FrameConsumer consumer(ring.ref());
    ASSERT_EQ(producer.TryPush(1, Bytes(64, 1)), PushResult::kOk);
    RecordHeader header;
    std::memcpy(&header, ring.data().data(), sizeof(header));
    header.length = bad_length;  // claims more bytes than were published
    std::memcpy(ring.data().data(), &header, sizeof(header));
    Frame frame;
    EXPECT_EQ(consumer.Peek(&frame), PeekResult::kCorrupt) << bad_length;
  }
  TestRing ring(4096);
  FrameProducer producer(ring.ref());
  FrameConsumer consumer(ring.ref());
  ASSERT_EQ(producer.TryPush(1, Bytes(64, 1)), PushResult::kOk);
  ring.data()[4] = 0x77;  // unknown record kind
  Frame frame;
  EXPECT_EQ(consumer.Peek(&frame), PeekResult::kCorrupt);
}

// A padding record at offset 0 pads nothing (a frame of any size fits a whole ring): refused,
// so one Peek never skips more than one padding (a hostile producer republishing a whole-ring
// padding as fast as the consumer skipped it kept the agent's service thread in Peek).
TEST(FrameRing, APaddingAtTheStartOfTheRingIsCorrupt) {
  TestRing ring(4096);
  FrameConsumer consumer(ring.ref());
  RecordHeader pad{4096 - sizeof(RecordHeader), kRecordPadding, 0};
  std::memcpy(ring.data().data(), &pad, sizeof(pad));
  ring.control().tail.store(4096);
  Frame frame;
  EXPECT_EQ(consumer.Peek(&frame), PeekResult::kCorrupt);
}

TEST(FrameRing, ProducerReportsCorruptWhenTheConsumerIndexIsImpossible) {
  TestRing ring(4096);
  FrameProducer producer(ring.ref());
  auto payload = Bytes(1000, 1);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(producer.TryPush(i, payload), PushResult::kOk);
  ring.control().head.store(1ULL << 40);  // ahead of everything ever published
  EXPECT_EQ(producer.TryPush(9, payload), PushResult::kCorrupt);
}

TEST(FrameRing, AppendedFramesStayInvisibleUntilPublished) {
  TestRing ring(4096);
  FrameProducer producer(ring.ref());
  FrameConsumer consumer(ring.ref());
  for (int i = 0; i < 3; ++i) ASSERT_EQ(producer.TryAppend(i, Bytes(40, 1)), PushResult::kOk);
  Frame frame;
  EXPECT_EQ(consumer.Peek(&frame), PeekResult::kEmpty);
  producer.Publish();
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(consumer.Peek(&frame), PeekResult::kFrame);
    EXPECT_EQ(frame.request_id, static_cast<uint64_t>(i));
    consumer.Consume();
  }
  EXPECT_EQ(ring.control().head.load(), 0u);  // consumed, not yet given back
  consumer.PublishHead();
  EXPECT_EQ(ring.control().head.load(), ring.control().tail.load());
}

TEST(FrameRing, WaitForDataReturnsFalseAfterTheTimeoutOnAnEmptyRing) {
  TestRing ring(4096);
  FrameConsumer consumer(ring.ref());
  EXPECT_FALSE(consumer.WaitForData(std::chrono::microseconds(10), std::chrono::milliseconds(5)));
  EXPECT_EQ(ring.control().consumer_sleeping.load(), 0u);  // flag cleared after the wait
}

TEST(FrameRing, ProducerWakesOnlyAConsumerThatAdvertisedSleep) {
  TestRing ring(4096);
  FrameProducer producer(ring.ref());
  FrameConsumer consumer(ring.ref());
  const uint32_t before = ring.control().data_seq.load();
  ASSERT_EQ(producer.TryPush(1, Bytes(8, 1)), PushResult::kOk);
  EXPECT_EQ(ring.control().data_seq.load(), before);  // nobody asleep: no wake
  Frame frame;
  ASSERT_EQ(consumer.Peek(&frame), PeekResult::kFrame);
  consumer.Pop();
  const uint32_t seq = consumer.BeginDataWait();
  EXPECT_FALSE(consumer.HasData());
  ASSERT_EQ(producer.TryPush(2, Bytes(8, 1)), PushResult::kOk);
  EXPECT_EQ(ring.control().data_seq.load(), seq + 1);  // the sleeper's word moved
  // A FUTEX_WAIT with the stale value returns at once instead of sleeping.
  EXPECT_EQ(FutexWait(consumer.data_word(), seq, std::chrono::seconds(5)), WaitResult::kChanged);
  consumer.EndDataWait();
  EXPECT_TRUE(consumer.HasData());
}

}  // namespace
}  // namespace kvagent::ipc

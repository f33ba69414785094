// The wake protocol across two processes: a consumer that sleeps on the futex whenever the ring
// is empty, and a producer that sleeps whenever the ring is full. Every frame must arrive, in
// order, and both sides must really have slept (the test would hang, and hit its ctest timeout,
// if a wake were lost).
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "kvagent/ipc/frame_ring.h"
#include "process_guard.h"

namespace kvagent::ipc {
namespace {

constexpr uint64_t kCapacity = 4096;
constexpr int kFrames = 20000;

struct SharedArea {
  RingControl control;
  std::atomic<uint32_t> consumer_sleeps;
  std::atomic<uint32_t> consumer_errors;
  alignas(64) uint8_t data[kCapacity];
};

class SharedMapping {
 public:
  SharedMapping() {
    void* p = mmap(nullptr, sizeof(SharedArea), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    area_ = static_cast<SharedArea*>(p);
    new (area_) SharedArea{};
  }
  ~SharedMapping() { munmap(area_, sizeof(SharedArea)); }
  SharedArea* get() { return area_; }
  RingRef ring() { return {&area_->control, area_->data, kCapacity}; }

 private:
  SharedArea* area_;
};

// Child: consume kFrames, sleeping (no spin) whenever the ring is empty; slow down now and then
// so that the producer fills the ring and has to sleep too.
[[noreturn]] void RunConsumer(SharedMapping& shm) {
  FrameConsumer consumer(shm.ring());
  for (int expected = 0; expected < kFrames;) {
    Frame frame;
    PeekResult r = consumer.Peek(&frame);
    if (r == PeekResult::kCorrupt) _exit(3);
    if (r == PeekResult::kEmpty) {
      if (!consumer.HasData()) shm.get()->consumer_sleeps.fetch_add(1);
      if (!consumer.WaitForData(std::chrono::nanoseconds(0), std::chrono::seconds(20))) _exit(4);
      continue;
    }
    uint64_t value = 0;
    if (frame.request_id != static_cast<uint64_t>(expected) ||
        frame.payload.size() < sizeof(value)) {
      shm.get()->consumer_errors.fetch_add(1);
    } else {
      std::memcpy(&value, frame.payload.data(), sizeof(value));
      if (value != frame.request_id * 31) shm.get()->consumer_errors.fetch_add(1);
    }
    consumer.Pop();
    ++expected;
    if (expected % 2000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  _exit(0);
}

TEST(FrameRingAcrossProcesses, NoWakeIsLostWhenBothSidesSleep) {
  SharedMapping shm;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) RunConsumer(shm);
  testing::ProcessGuard child(pid);

  FrameProducer producer(shm.ring());
  int producer_sleeps = 0;
  for (int i = 0; i < kFrames; ++i) {
    uint8_t payload[64] = {};
    const uint64_t value = static_cast<uint64_t>(i) * 31;
    std::memcpy(payload, &value, sizeof(value));
    const size_t len = 8 + (i % 57);
    while (true) {
      PushResult r = producer.TryPush(i, std::span<const uint8_t>(payload, len));
      ASSERT_NE(r, PushResult::kCorrupt);
      ASSERT_NE(r, PushResult::kTooLarge);
      if (r == PushResult::kOk) break;
      ++producer_sleeps;
      ASSERT_TRUE(producer.WaitForSpace(len, std::chrono::nanoseconds(0), std::chrono::seconds(20),
                                        std::chrono::seconds(20), [] { return false; }));
    }
    // Pause now and then so the consumer drains the ring and goes to sleep.
    if (i % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const int status = child.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(shm.get()->consumer_errors.load(), 0u);
  EXPECT_GT(shm.get()->consumer_sleeps.load(), 0u);
  EXPECT_GT(producer_sleeps, 0);
}

}  // namespace
}  // namespace kvagent::ipc

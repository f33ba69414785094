// The per-client shared-memory segment: a header, a request ring (client -> agent), a
// completion ring (agent -> client) and the client's data arena.
//
// The agent creates one segment per client as a memfd: sized, its pages allocated up front
// (fallocate), then sealed against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW |
// F_SEAL_SEAL). It hands the client the file descriptor over agent.sock (SCM_RIGHTS) with the
// Welcome; nothing is ever named in /dev/shm. So:
//   - a client cannot truncate the memory under the agent (the agent would die of SIGBUS on its
//     next access): the seals make ftruncate fail;
//   - a lack of memory is an error at attach (fallocate fails), never a SIGBUS later;
//   - a client in another mount or IPC namespace (a container with its own /dev/shm), or under
//     another uid mapping, attaches as long as it can reach agent.sock;
//   - the memory lives exactly as long as the two mappings: a SIGKILL on either side leaves
//     nothing behind.
//
// Layout (offsets from the start of the mapping, every region page-aligned):
//   [0, 4096)           SegmentHeader
//   request control     RingControl (256 B, padded to a page)
//   request data        request_ring_bytes
//   completion control  RingControl
//   completion data     completion_ring_bytes
//   arena               arena_bytes
// The header carries the layout so the client can check it; the agent never re-reads it (a
// client may scribble over its own segment) and keeps its private SegmentLayout instead.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvagent/common/status.h"
#include "kvagent/ipc/frame_ring.h"

namespace kvagent::ipc {

inline constexpr uint64_t kSegmentMagic = 0x314D48535641564BULL;  // "KVAVSHM1"
inline constexpr uint32_t kSegmentLayoutVersion = 1;
inline constexpr uint64_t kPageBytes = 4096;
inline constexpr uint64_t kMaxRingBytes = 256ULL << 20;

// Offsets and sizes of every region; computed, never read back from shared memory by the agent.
struct SegmentLayout {
  uint64_t request_control = 0;
  uint64_t request_data = 0;
  uint64_t request_ring_bytes = 0;
  uint64_t completion_control = 0;
  uint64_t completion_data = 0;
  uint64_t completion_ring_bytes = 0;
  uint64_t arena = 0;
  uint64_t arena_bytes = 0;
  uint64_t total_bytes = 0;

  // Ring sizes must be powers of two in [kMinRingBytes, kMaxRingBytes]; the arena is rounded up
  // to a whole page (0 is allowed). Returns INVALID_PARAMS otherwise.
  static Result<SegmentLayout> Compute(uint64_t request_ring_bytes, uint64_t completion_ring_bytes,
                                       uint64_t arena_bytes);
  friend bool operator==(const SegmentLayout&, const SegmentLayout&) = default;
};

// At offset 0 of every segment. Written once by the agent before the client gets the fd,
// except `agent_shutdown`, which the agent sets when it stops (the client then fails fast).
struct SegmentHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_bytes;
  uint64_t agent_incarnation;
  uint64_t client_id;
  SegmentLayout layout;
  alignas(kCacheLine) std::atomic<uint32_t> agent_shutdown;
};
static_assert(sizeof(SegmentHeader) <= kPageBytes);

// The states of a call's word in the arena (Request.call_word, schemas/agent.fbs), which the
// client and the agent change atomically: the agent moves it open -> moving before it touches
// the call's bytes and back before it answers; a caller that stops waiting moves it open ->
// closed.
inline constexpr uint32_t kCallOpen = 0;
inline constexpr uint32_t kCallMoving = 1;
inline constexpr uint32_t kCallClosed = 2;

// One mapping of a segment. Move-only; unmaps on destruction.
class Segment {
 public:
  // Creates the memfd, sizes it, allocates every page (fallocate), seals it, maps it and writes
  // the header and empty rings. The segment keeps the fd until ReleaseFd/CloseFd. Errors:
  // NO_SPACE when the memory cannot be allocated (the message says how much and what to do),
  // INTERNAL for other system-call failures.
  static Result<Segment> Create(const SegmentLayout& layout, uint64_t agent_incarnation,
                                uint64_t client_id);

  // Maps the segment behind `fd` (received from the agent) and checks it: its size is
  // `expected_bytes`, it is sealed against shrinking, and its header (magic, version, layout)
  // is consistent. Takes ownership of the fd and closes it once mapped.
  static Result<Segment> Open(int fd, uint64_t expected_bytes);

  Segment(Segment&&) noexcept;
  Segment& operator=(Segment&&) noexcept;
  ~Segment();

  const SegmentLayout& layout() const { return layout_; }
  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(base_); }
  RingRef request_ring() const;
  RingRef completion_ring() const;
  std::span<uint8_t> arena() const { return {base_ + layout_.arena, layout_.arena_bytes}; }
  uint8_t* base() const { return base_; }

  // The memfd of a created segment (-1 once closed): what the agent passes to the client.
  int fd() const { return fd_; }
  // Closes the fd (the mapping stays): once the client has it, the agent keeps only the map.
  void CloseFd();

 private:
  Segment(uint8_t* base, uint64_t bytes, const SegmentLayout& layout, int fd);

  uint8_t* base_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  SegmentLayout layout_;
  int fd_ = -1;
};

}  // namespace kvagent::ipc

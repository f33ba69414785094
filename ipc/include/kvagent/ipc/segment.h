// The per-client shared-memory segment: a header, a request ring (client -> agent), a
// completion ring (agent -> client) and the client's data arena.
//
// The agent creates one segment per client with Boost.Interprocess (shared_memory_object +
// mapped_region) under a name "kvagent.<agent pid>.<epoch>.<client id>", tells the client the
// name during the handshake, and unlinks the name as soon as the client has mapped it (the
// client unlinks too, ignoring failures): from then on the memory lives only as long as the
// two mappings, so a SIGKILL on either side leaves nothing in /dev/shm.
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
inline constexpr const char* kSegmentPrefix = "kvagent.";

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

// At offset 0 of every segment. Written once by the agent before the client learns the name,
// except `agent_shutdown`, which the agent sets when it stops (the client then fails fast).
struct SegmentHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_bytes;
  uint64_t agent_epoch;
  uint64_t client_id;
  SegmentLayout layout;
  alignas(kCacheLine) std::atomic<uint32_t> agent_shutdown;
};
static_assert(sizeof(SegmentHeader) <= kPageBytes);

// Who should own the shared-memory object when the creator runs as root (fchown to the peer).
struct SegmentOwner {
  bool set = false;
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// One mapping of a segment. Move-only; unmaps on destruction (the name, if still linked, stays:
// call Unlink()).
class Segment {
 public:
  // Creates the shared-memory object `name` (mode 0600, or owned by `owner` when set), sizes it,
  // maps it and writes the header and empty rings. Fails if the name exists.
  static Result<Segment> Create(const std::string& name, const SegmentLayout& layout,
                                uint64_t agent_epoch, uint64_t client_id, SegmentOwner owner);

  // Opens and maps an existing segment and checks its header: magic, version, that it is
  // `expected_bytes` long and that every region lies inside the mapping.
  static Result<Segment> Open(const std::string& name, uint64_t expected_bytes);

  // Removes the name from /dev/shm; the mappings stay valid. Returns false if it was not there
  // or could not be removed (a client without permission).
  static bool Unlink(const std::string& name);

  Segment(Segment&&) noexcept;
  Segment& operator=(Segment&&) noexcept;
  ~Segment();

  const SegmentLayout& layout() const { return layout_; }
  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(base_); }
  RingRef request_ring() const;
  RingRef completion_ring() const;
  std::span<uint8_t> arena() const { return {base_ + layout_.arena, layout_.arena_bytes}; }
  uint8_t* base() const { return base_; }

 private:
  struct Mapping;
  Segment(std::unique_ptr<Mapping> mapping, const SegmentLayout& layout);

  std::unique_ptr<Mapping> mapping_;
  uint8_t* base_ = nullptr;
  SegmentLayout layout_;
};

// "kvagent.<pid>.<epoch>.<client id>".
std::string SegmentName(int agent_pid, uint64_t agent_epoch, uint64_t client_id);

// Removes segment names left by agents that died between creating a segment and unlinking it:
// every "kvagent.<pid>.*" in /dev/shm whose pid is no live process, and names of our own pid
// from another epoch. Returns how many it removed.
int RemoveStaleSegments(int own_pid, uint64_t own_epoch);

// Counts names in /dev/shm that start with "kvagent.<pid>." (for tests and diagnostics).
int CountSegments(int agent_pid);

}  // namespace kvagent::ipc

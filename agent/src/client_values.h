// The bytes of one key of a request where its client keeps them: a range of the client's arena
// (Request.buffers) or ranges of the client's own memory (Request.memory, process_memory.h).
// A put reads them into the node pool or hands them to the data plane; a get fills them. The
// batches (write_batch.cc, read_batch.cc) move bytes only through this, so both kinds of value
// take the same path. Service thread only.
#pragma once

#include <cstdint>
#include <memory>

#include "data_moves.h"
#include "kvagent/agent/request_handler.h"
#include "pipeline_context.h"
#include "process_memory.h"

namespace kvagent::agent {

// Local memory the data plane reads (put) or writes (get) for a part of a value.
struct PeerBuffer {
  uint8_t* data = nullptr;
  // For process memory: the peer scratch range staging the part (null for an arena range). It
  // must stay allocated until the data plane is done with `data`.
  std::unique_ptr<ProcessMemory::ScratchRange> scratch;
};

class ClientValue {
 public:
  // Key `index` of `request` (checked by CheckRequest).
  ClientValue(const ClientRequest& request, uint32_t index);

  // Put: the value's length. Get: the capacity (the bytes it can hold).
  uint64_t length() const { return length_; }

  // Put: copies bytes [at, at + n) of the value into the node pool at `pool_offset` as part of
  // write `stamp` (admitted by `writes`, as CopyToPool) and returns their CRC32C (0 when
  // ctx.checksums is off). TRANSFER_FAILED when the fence refuses the write,
  // BUFFER_OUT_OF_RANGE when the master's range lies outside the pool; INVALID_PARAMS when the
  // client's memory cannot be read; AGENT_UNAVAILABLE when the client process is gone.
  [[nodiscard]] Result<uint32_t> ToPool(const PipelineContext& ctx,
                                        transfer::PoolFence::LocalWrites& writes,
                                        const OpStamp& stamp, uint64_t at, uint64_t pool_offset,
                                        uint64_t n) const;
  // Put: the CRC32C of bytes [at, at + n) of the value (a part with no replica in this pool).
  [[nodiscard]] Result<uint32_t> Checksum(uint64_t at, uint64_t n) const;
  // Get: copies `n` bytes of the pool at `pool_offset` into bytes [at, at + n) of the value and
  // returns their CRC32C (0 when ctx.checksums is off), as CopyFromPool (which prefetches
  // `next`).
  [[nodiscard]] Result<uint32_t> FromPool(const PipelineContext& ctx, uint64_t pool_offset,
                                          uint64_t at, uint64_t n, PrefetchRange next = {}) const;

  // Get: bytes [at, ...) of the value in the arena; null for a value in the client's own memory.
  uint8_t* ArenaRange(uint64_t at) const {
    return arena_bytes_ == nullptr ? nullptr : arena_bytes_ + at;
  }

  // Memory for the data plane for bytes [at, at + n): the arena range itself, or a peer
  // scratch range, filled from the client's memory first when `fill` (a put). NO_SPACE when
  // the scratch is full.
  [[nodiscard]] Result<PeerBuffer> ForPeer(uint64_t at, uint64_t n, bool fill) const;
  // Get: once a peer's bytes arrived in a peer scratch range at `staged` (from ForPeer), moves
  // them into bytes [at, at + n) of the client's memory.
  [[nodiscard]] Status FromPeer(const uint8_t* staged, uint64_t at, uint64_t n) const;

 private:
  const ClientRequest& request_;
  uint8_t* arena_bytes_ = nullptr;  // the value's arena range (arena values)
  ProcessMemory::Ranges ranges_;    // its ranges in the client (process-memory values)
  uint64_t length_ = 0;
};

// The per-key code of a failed copy: the client's own mistakes (INVALID_PARAMS: memory it named
// cannot be read or written), its departure (AGENT_UNAVAILABLE) and a full peer scratch
// (NO_SPACE) keep their code; anything else is TRANSFER_FAILED, as for the arena.
ErrorCode CopyFailureCode(const Status& failed);

// True when a copy failed because of the client's memory (not readable or writable, or the
// client process gone), not because of a replica: the key fails, no replica is blamed.
bool ClientMemoryFailed(const Status& failed);

// Request.memory: the index of each key's first range (prefix sums of memory_counts), for
// ClientRequest::memory_first. Empty for a request without memory ranges.
std::vector<uint32_t> FirstMemoryRanges(const proto::Request& request);

}  // namespace kvagent::agent

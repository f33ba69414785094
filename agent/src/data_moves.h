// The data-plane half of a batch. Ranges in this node's pool are copied at once with one memcpy
// each (arena -> pool on put, pool -> arena on get); ranges in peers' pools are collected and
// handed to the TransferEngine as one Submit per batch, whose results come back on the service
// thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/common/checksum.h"
#include "master_messages.h"
#include "pipeline_context.h"

namespace kvagent::agent {

// The pools a PlacementReply names: which one is this node's pool, and where the others are.
class PoolTable {
 public:
  struct Entry {
    uint32_t id = 0;
    bool local = false;         // this agent's node pool: bytes move with memcpy
    std::string_view endpoint;  // a peer's data endpoint (valid while the reply is)
    uint64_t incarnation = 0;   // the pool's, as the master knows it (data-plane ops carry it)
    // Not OK: the pool is this node's (its id or its endpoint says so) but the placement is not
    // for it as it is now: another incarnation of it (this agent restarted, or a dead agent that
    // had its endpoint), or placed by another master epoch than the one the pool is registered
    // with (pool_fence.h). Its offsets mean nothing here: such a replica is neither read nor
    // written, and no peer is asked in its place.
    Status refused;
  };
  // Reads reply.pools(); a pool is local when it is ours (its id, or the data plane says its
  // endpoint is ours) and the pool fence takes the reply's incarnation and master epoch.
  void Load(const mfb::PlacementReply& reply, const PipelineContext& ctx);
  // One more pool (`endpoint` must outlive the table's use), of a reply of `master_epoch`.
  void Add(uint32_t id, std::string_view endpoint, uint64_t incarnation, uint64_t master_epoch,
           const PipelineContext& ctx);
  // clear, capacity and swap: a table's buffer is kept between batches (scratch_pool.h).
  void clear() { entries_.clear(); }
  size_t capacity() const { return entries_.capacity(); }
  void swap(PoolTable& other) noexcept { entries_.swap(other.entries_); }
  // The entry of `pool_id`; ReadPlacements guarantees every placement's pool is listed.
  const Entry& Find(uint32_t pool_id) const;

 private:
  std::vector<Entry> entries_;
};

// Where one replica of one part of a value goes (a WriteStart's placement, or a reserved
// write's).
struct ReplicaPlace {
  uint32_t part = 0;
  uint32_t pool_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// What a data-plane op carries for the peer's fence (pool_fence.h).
struct OpStamp {
  uint64_t pool_incarnation = 0;
  uint64_t master_epoch = 0;
  uint64_t write_id = 0;  // writes only
  // A write's CRC32C of its bytes, for the peer to check them against as they arrive.
  std::optional<uint32_t> payload_crc = std::nullopt;
};

// Copies [src, src + length) into the node pool at `offset` (a put's local replica) as part of
// write `stamp.write_id` placed by master `stamp.master_epoch`, and returns the bytes' CRC32C
// taken in the same pass (0 when ctx.checksums is off). Streaming stores, left unfenced: the
// caller calls FenceStreamingStores() (checksum.h) before it tells anyone, once for all its
// copies. `writes`: the batch's hold on the pool fence (LocalWritesOf), which admits the write
// first. TRANSFER_FAILED when the pool fence refuses the write (abandoned, or placed by another
// master); BUFFER_OUT_OF_RANGE when the master's range lies outside the pool.
[[nodiscard]] Result<uint32_t> CopyToPool(const PipelineContext& ctx,
                                          transfer::PoolFence::LocalWrites& writes,
                                          const OpStamp& stamp, uint64_t offset, const uint8_t* src,
                                          uint64_t length);
// A batch's hold on the pool fence for its local copies (CopyToPool's, and for copies made another
// way: process_memory.h): the fence waits for them from the first admitted copy until the hold is
// destroyed, so a batch releases it before it tells the master anything.
[[nodiscard]] transfer::PoolFence::LocalWrites LocalWritesOf(const PipelineContext& ctx);
// The reverse for a get (ordinary stores: the reader wants it in cache), with the CRC32C of what
// was copied (0 when ctx.checksums is off). `next`: the pool range the caller copies next (from
// NextPoolRange), asked of the CPU while this copy runs, so that its memory latency overlaps this
// copy instead of adding to the next.
[[nodiscard]] Result<uint32_t> CopyFromPool(const PipelineContext& ctx, uint64_t offset,
                                            uint8_t* dst, uint64_t length, PrefetchRange next = {});
// [offset, offset + length) of the pool as a range to prefetch (empty when it lies outside).
PrefetchRange PoolRange(const PipelineContext& ctx, uint64_t offset, uint64_t length);

// The remote transfers of one batch.
class RemoteMoves {
 public:
  // Called on the service thread with, for every op added, its key (the batch's key position),
  // its result and, for a read, the CRC32C of its bytes as they arrived when the transport took
  // one (transfer::TransferOp::received: over TCP), in the order of Add.
  using DoneFn = std::function<void(std::span<const uint32_t> keys, std::span<const Status> results,
                                    std::span<const transfer::ReceivedChecksum> received)>;

  // One range between the arena of `requests[request]` and a peer's pool.
  void Add(uint32_t key, uint32_t request, transfer::TransferKind kind, std::string_view peer,
           uint64_t remote_offset, uint8_t* local, uint64_t length, const OpStamp& stamp);
  bool empty() const { return ops_.empty(); }

  // Registers the client arenas involved (once per client), submits every op in one batch and
  // arranges for `done` to run on the service thread. The arenas stay mapped until the data
  // plane is done with them, even if the clients leave or the pipeline goes away meanwhile.
  // The bytes of the ops that succeeded are added to `*moved` (a counter) before `done` runs.
  void Submit(PipelineContext& ctx, std::span<const HeldRequest> requests,
              metrics::SingleWriterCounter* moved, DoneFn done);

 private:
  std::vector<transfer::TransferOp> ops_;
  std::vector<uint32_t> keys_;
  std::vector<uint32_t> requests_;
};

}  // namespace kvagent::agent

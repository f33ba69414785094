#include "data_moves.h"

#include <algorithm>
#include <memory>

#include "copy_helpers.h"
#include "kvagent/common/checksum.h"
#include "kvagent/ipc/segment.h"

namespace kvagent::agent {

void PoolTable::Load(const mfb::PlacementReply& reply, const PipelineContext& ctx) {
  entries_.clear();
  if (reply.pools() == nullptr) return;
  for (const mfb::PoolInfo* s : *reply.pools()) {
    if (s->endpoints() == nullptr || s->endpoints()->size() == 0) continue;
    Add(s->pool_id(), s->endpoints()->Get(0)->string_view(), s->incarnation(), reply.master_epoch(),
        ctx);
  }
  // Sorted (first of equal ids kept): Find is a binary search, whatever the reply's size.
  auto by_id = [](const Entry& a, const Entry& b) { return a.id < b.id; };
  if (!std::is_sorted(entries_.begin(), entries_.end(), by_id)) {
    std::stable_sort(entries_.begin(), entries_.end(), by_id);  // its buffer only when needed
  }
}

void PoolTable::Add(uint32_t id, std::string_view endpoint, uint64_t incarnation,
                    uint64_t master_epoch, const PipelineContext& ctx) {
  Entry e;
  e.id = id;
  e.endpoint = endpoint;
  e.incarnation = incarnation;
  // The id is the fast answer; the endpoint check also holds across a master restart that
  // renumbered our pool while this batch was in flight. Either way the fence has the last word,
  // as it has for a peer's op: a copy in our own pool through a stale placement would read or
  // overwrite whatever the pool holds there now. (Checked once per pool and batch; a master
  // change during the batch is caught by the checksums of what it reads, and by the per-copy
  // admission of what it writes.)
  const bool ours = id == ctx.master->identity().pool_id || ctx.engine->IsLocal(endpoint);
  if (ours && ctx.fence != nullptr) e.refused = ctx.fence->CheckRead(incarnation, master_epoch);
  e.local = ours && e.refused.ok();
  entries_.push_back(e);
}

const PoolTable::Entry& PoolTable::Find(uint32_t pool_id) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), pool_id,
                             [](const Entry& e, uint32_t id) { return e.id < id; });
  if (it != entries_.end() && it->id == pool_id) return *it;
  static const Entry kNone;  // unreachable after ReadPlacements
  return kNone;
}

transfer::PoolFence::LocalWrites LocalWritesOf(const PipelineContext& ctx) {
  if (ctx.fence == nullptr) return transfer::PoolFence::LocalWrites();
  return ctx.fence->BeginLocalWrites();
}

Result<uint32_t> CopyToPool(const PipelineContext& ctx, transfer::PoolFence::LocalWrites& writes,
                            const OpStamp& stamp, uint64_t offset, const uint8_t* src,
                            uint64_t length) {
  KVAGENT_RETURN_IF_ERROR(ctx.pool->CheckRange(offset, length));
  KVAGENT_RETURN_IF_ERROR(writes.Admit(stamp.master_epoch, stamp.write_id));
  // The value is read again later, most likely by another process: keep it out of our cache.
  return ctx.copier->Copy(ctx.pool->base() + offset, src, length, CopyStores::kStreamingUnfenced,
                          ctx.checksums);
}

Result<uint32_t> CopyFromPool(const PipelineContext& ctx, uint64_t offset, uint8_t* dst,
                              uint64_t length, PrefetchRange next) {
  KVAGENT_RETURN_IF_ERROR(ctx.pool->CheckRange(offset, length));
  return ctx.copier->Copy(dst, ctx.pool->base() + offset, length, CopyStores::kCached,
                          ctx.checksums, next);
}

PrefetchRange PoolRange(const PipelineContext& ctx, uint64_t offset, uint64_t length) {
  if (!ctx.pool->CheckRange(offset, length).ok()) return {};
  return PrefetchRange{ctx.pool->base() + offset, length};
}

void RemoteMoves::Add(uint32_t key, uint32_t request, transfer::TransferKind kind,
                      std::string_view peer, uint64_t remote_offset, uint8_t* local,
                      uint64_t length, const OpStamp& stamp) {
  ops_.push_back(transfer::TransferOp{.kind = kind,
                                      .peer = std::string(peer),
                                      .remote_offset = remote_offset,
                                      .local = local,
                                      .length = length,
                                      .pool_incarnation = stamp.pool_incarnation,
                                      .master_epoch = stamp.master_epoch,
                                      .write_id = stamp.write_id,
                                      .payload_crc = stamp.payload_crc});
  keys_.push_back(key);
  requests_.push_back(request);
}

namespace {

// What the service thread needs once the data plane answered.
struct Pending {
  std::vector<uint32_t> keys;
  std::vector<Status> results;
  std::vector<transfer::ReceivedChecksum> received;  // per op; the engine writes a read's
  std::vector<size_t> submitted;  // positions in `results` of the ops handed to the engine
  std::vector<uint64_t> lengths;  // of the submitted ops
  metrics::SingleWriterCounter* moved = nullptr;
  std::vector<ClientId> arenas;  // arenas acquired for this batch
  RemoteMoves::DoneFn done;
};

}  // namespace

void RemoteMoves::Submit(PipelineContext& ctx, std::span<const HeldRequest> requests,
                         metrics::SingleWriterCounter* moved, DoneFn done) {
  auto pending = std::make_shared<Pending>();
  pending->moved = moved;
  pending->keys = std::move(keys_);
  pending->results.resize(ops_.size());
  pending->received.resize(ops_.size());  // never resized again: the engine holds pointers
  pending->done = std::move(done);
  std::vector<std::shared_ptr<ipc::Segment>> keep_mapped;
  std::vector<transfer::TransferOp> submit;
  // Per request: 0 not seen, 1 arena registered, 2 registration failed (its ops fail).
  std::vector<uint8_t> arena_state(requests.size(), 0);
  std::vector<Status> arena_error(requests.size());
  for (size_t i = 0; i < ops_.size(); ++i) {
    const uint32_t r = requests_[i];
    if (arena_state[r] == 0) {
      const ClientRequest& request = requests[r].request;
      arena_error[r] = ctx.arenas->Acquire(request);
      arena_state[r] = arena_error[r].ok() ? 1 : 2;
      if (arena_state[r] == 1) {
        pending->arenas.push_back(request.client_id);
        keep_mapped.push_back(request.segment);
      }
    }
    if (arena_state[r] == 2) {
      pending->results[i] = Status(ErrorCode::kTransferFailed, arena_error[r].message());
      continue;
    }
    if (ops_[i].kind == transfer::TransferKind::kRead) ops_[i].received = &pending->received[i];
    pending->lengths.push_back(ops_[i].length);
    submit.push_back(std::move(ops_[i]));
    pending->submitted.push_back(i);
  }
  ops_.clear();
  requests_.clear();
  auto gate = ctx.gate;
  ArenaRegistry* arenas = ctx.arenas.get();
  ctx.engine->Submit(
      std::move(submit), [gate, arenas, pending, keep_mapped = std::move(keep_mapped)](
                             std::vector<Status> results) mutable {
        // Engine thread: only hand over. `keep_mapped` dies with this callback, after the
        // engine is done with every arena range it names.
        gate->Post([arenas, pending, results = std::move(results)]() {
          for (size_t i = 0; i < results.size() && i < pending->submitted.size(); ++i) {
            pending->results[pending->submitted[i]] = results[i];
            if (results[i].ok()) *pending->moved += pending->lengths[i];
          }
          for (ClientId c : pending->arenas) arenas->Release(c);
          pending->done(pending->keys, pending->results, pending->received);
        });
      });
}

}  // namespace kvagent::agent

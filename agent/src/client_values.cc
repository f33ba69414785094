#include "client_values.h"

#include <cstring>

#include "kvagent/common/checksum.h"
#include "request_check.h"

namespace kvagent::agent {

std::vector<uint32_t> FirstMemoryRanges(const proto::Request& request) {
  std::vector<uint32_t> first;
  const auto* counts = request.memory_counts();
  if (counts == nullptr) return first;
  first.reserve(counts->size());
  uint32_t next = 0;
  for (uint32_t c : *counts) {
    first.push_back(next);
    next += c;
  }
  return first;
}

ClientValue::ClientValue(const ClientRequest& request, uint32_t index) : request_(request) {
  const proto::Request& r = request.request();
  if (request.memory == nullptr) {
    const proto::BufferRef* b = r.buffers()->Get(index);
    arena_bytes_ = request.arena().data() + b->offset();
    length_ = b->length();
    return;
  }
  ranges_ = ProcessRanges(r, request.memory_first[index], r.memory_counts()->Get(index));
  for (const proto::MemoryRange& range : ranges_)
    length_ += range.length();  // checked: no overflow
}

Result<uint32_t> ClientValue::ToPool(const PipelineContext& ctx,
                                     transfer::PoolFence::LocalWrites& writes, const OpStamp& stamp,
                                     uint64_t at, uint64_t pool_offset, uint64_t n) const {
  if (request_.memory == nullptr) {
    return CopyToPool(ctx, writes, stamp, pool_offset, arena_bytes_ + at, n);
  }
  KVAGENT_RETURN_IF_ERROR(ctx.pool->CheckRange(pool_offset, n));
  KVAGENT_RETURN_IF_ERROR(writes.Admit(stamp.master_epoch, stamp.write_id));
  return request_.memory->Read(ranges_, at, ctx.pool->base() + pool_offset, n, ctx.checksums);
}

Result<uint32_t> ClientValue::Checksum(uint64_t at, uint64_t n) const {
  if (request_.memory == nullptr) return Crc32c(arena_bytes_ + at, n);
  return request_.memory->Checksum(ranges_, at, n);
}

Result<uint32_t> ClientValue::FromPool(const PipelineContext& ctx, uint64_t pool_offset,
                                       uint64_t at, uint64_t n, PrefetchRange next) const {
  if (request_.memory == nullptr) {
    return CopyFromPool(ctx, pool_offset, arena_bytes_ + at, n, next);
  }
  KVAGENT_RETURN_IF_ERROR(ctx.pool->CheckRange(pool_offset, n));
  return request_.memory->Write(ranges_, at, ctx.pool->base() + pool_offset, n, ctx.checksums);
}

Result<PeerBuffer> ClientValue::ForPeer(uint64_t at, uint64_t n, bool fill) const {
  PeerBuffer out;
  if (request_.memory == nullptr) {
    out.data = arena_bytes_ + at;
    return out;
  }
  auto scratch = request_.memory->AllocatePeerScratch(n);
  KVAGENT_RETURN_IF_ERROR(scratch.status());
  out.data = request_.arena().data() + (*scratch)->arena_offset();
  out.scratch = std::move(*scratch);
  if (fill) {
    KVAGENT_RETURN_IF_ERROR(
        request_.memory->Read(ranges_, at, out.data, n, /*checksum=*/false).status());
  }
  return out;
}

Status ClientValue::FromPeer(const uint8_t* staged, uint64_t at, uint64_t n) const {
  if (request_.memory == nullptr) return Status::Ok();
  return request_.memory->Write(ranges_, at, staged, n).status();
}

bool ClientMemoryFailed(const Status& failed) {
  return failed.code() == ErrorCode::kInvalidParams ||
         failed.code() == ErrorCode::kAgentUnavailable;
}

ErrorCode CopyFailureCode(const Status& failed) {
  switch (failed.code()) {
    case ErrorCode::kInvalidParams:
    case ErrorCode::kAgentUnavailable:
    case ErrorCode::kNoSpace:
      return failed.code();
    default:
      return ErrorCode::kTransferFailed;
  }
}

}  // namespace kvagent::agent

// Put / Upsert: WriteStart -> bytes into every replica -> End or Revoke -> completions.
#include <glog/logging.h>

#include "batch.h"

namespace kvagent::agent {
namespace {

using flatbuffers::uoffset_t;

Status TransferFailed(const Status& cause) {
  if (cause.code() == ErrorCode::kTransferFailed) return cause;
  return Status(ErrorCode::kTransferFailed,
                std::string(ErrorCodeName(cause.code())) + ": " + cause.message());
}

}  // namespace

WriteBatch::WriteBatch(PipelineContext& ctx, MasterMessages& messages, bool upsert,
                       std::vector<HeldRequest> requests)
    : Batch(ctx, messages, std::move(requests)), upsert_(upsert) {}

void WriteBatch::Start() {
  CollectKeys();
  state_.assign(keys_.size(), kNotStarted);
  const proto::Op op = upsert_ ? proto::Op::Upsert : proto::Op::Put;
  CountCall(op, keys_.size());
  ctx_.master->Call(
      messages_.WriteStart(ctx_.NextMasterRequestId(), ctx_.master->identity().agent_id, upsert_,
                           requests_, keys_),
      [this](Result<std::span<const uint8_t>> reply) { OnStarted(reply); });
}

void WriteBatch::OnStarted(Result<std::span<const uint8_t>> reply) {
  if (!reply.ok()) return FailAll(reply.status());
  auto placements = ReadPlacements(*reply, keys_.size(), /*with_sizes=*/false);
  if (!placements.ok()) return FailAll(placements.status());
  const mfb::PlacementReply& p = **placements;
  SegmentTable segments;
  segments.Load(p, ctx_);
  const auto now = std::chrono::steady_clock::now();
  for (uint32_t k = 0; k < keys_.size(); ++k) {
    Status st = KeyStatus(p.codes(), p.messages(), k);
    if (!st.ok()) {
      held(keys_[k]).SetKey(keys_[k].index, st.code(), st.message());
      continue;
    }
    state_[k] = kStarted;
    if (held(keys_[k]).gone) {
      state_[k] = kFailed;  // revoked below: nothing of a departed client becomes readable
      continue;
    }
    if (Expire(k, now, "the value was not stored")) continue;
    CopyKey(k, p, segments);
  }
  if (remote_.empty()) return Finish();
  remote_.Submit(ctx_, requests_, &ctx_.counters.bytes_to_peers,
                 [this](std::span<const uint32_t> keys, std::span<const Status> results) {
                   OnMoved(keys, results);
                 });
}

// Every replica of every part of key `k`, from the client's arena. Parts are in order and each
// part's offset in the value is the sum of the lengths of the parts before it.
void WriteBatch::CopyKey(uint32_t k, const mfb::PlacementReply& reply,
                         const SegmentTable& segments) {
  HeldRequest& h = held(keys_[k]);
  const proto::BufferRef* value = h.request.request().buffers()->Get(keys_[k].index);
  uint8_t* src = h.request.arena().data() + value->offset();
  const uint32_t begin = reply.first()->Get(k);
  const uint32_t end = reply.first()->Get(k + 1);
  uint64_t part_offset = 0;
  uint64_t part_length = 0;
  uint32_t part = 0;
  for (uint32_t i = begin; i < end; ++i) {
    const mfb::Placement* pl = reply.placements()->Get(i);
    if (pl->part() != part) {
      part_offset += part_length;
      part = pl->part();
    }
    part_length = pl->length();
    if (part_offset + pl->length() > value->length() || part_offset + pl->length() < part_offset) {
      state_[k] = kFailed;
      h.SetKey(keys_[k].index, ErrorCode::kInternal,
               "the master placed more bytes than the value holds; check that kvmaster and "
               "kvagent are the same version");
      return;
    }
    const SegmentTable::Entry& seg = segments.Find(pl->segment_id());
    if (seg.local) {
      Status copied = CopyToPool(ctx_, pl->offset(), src + part_offset, pl->length());
      if (!copied.ok()) {
        state_[k] = kFailed;
        h.SetKey(keys_[k].index, ErrorCode::kTransferFailed, copied.message());
        return;
      }
      ctx_.counters.bytes_to_pool += pl->length();
    } else {
      remote_.Add(k, keys_[k].request, transfer::TransferKind::kWrite, seg.endpoint, pl->offset(),
                  src + part_offset, pl->length());
    }
  }
  if (part_offset + part_length != value->length()) {
    state_[k] = kFailed;
    h.SetKey(keys_[k].index, ErrorCode::kInternal,
             "the master's placements do not cover the value; check that kvmaster and kvagent "
             "are the same version");
  }
}

void WriteBatch::OnMoved(std::span<const uint32_t> keys, std::span<const Status> results) {
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t k = keys[i];
    if (!results[i].ok() && state_[k] == kStarted) {
      ++ctx_.counters.transfer_failures;
      state_[k] = kFailed;
      const Status failed = TransferFailed(results[i]);
      held(keys_[k]).SetKey(keys_[k].index, failed.code(), failed.message());
    }
  }
  Finish();
}

// Revokes key `k` (started, not ended) when its caller's deadline has passed at `now`.
bool WriteBatch::Expire(uint32_t k, std::chrono::steady_clock::time_point now,
                        std::string_view skipped) {
  if (state_[k] != kStarted || !held(keys_[k]).Expired(now)) return false;
  state_[k] = kFailed;
  FailExpired(keys_[k], skipped);
  return true;
}

void WriteBatch::Finish() {
  const auto now = std::chrono::steady_clock::now();
  for (uint32_t k = 0; k < keys_.size(); ++k) {
    if (state_[k] == kNotStarted) continue;
    Expire(k, now, "its bytes were copied but the value was revoked, not committed");
    const bool keep = state_[k] == kStarted && !held(keys_[k]).gone;
    (keep ? to_end_ : to_revoke_).push_back(keys_[k]);
  }
  ctx_.counters.revoked_keys += to_revoke_.size();
  finishing_ = (to_end_.empty() ? 0 : 1) + (to_revoke_.empty() ? 0 : 1);
  if (finishing_ == 0) return CompleteAll();
  const uint32_t agent = ctx_.master->identity().agent_id;
  // Both calls are set up before either is sent: an embedded master answers inside Call.
  if (!to_revoke_.empty()) {
    const auto type = upsert_ ? mfb::Body::BatchUpsertRevoke : mfb::Body::BatchPutRevoke;
    ctx_.master->Call(
        messages_.WriteFinish(ctx_.NextMasterRequestId(), agent, type, requests_, to_revoke_),
        [this](Result<std::span<const uint8_t>> reply) { OnFinished(false, reply); });
  }
  if (!to_end_.empty()) {
    const auto type = upsert_ ? mfb::Body::BatchUpsertEnd : mfb::Body::BatchPutEnd;
    ctx_.master->Call(
        messages_.WriteFinish(ctx_.NextMasterRequestId(), agent, type, requests_, to_end_),
        [this](Result<std::span<const uint8_t>> reply) { OnFinished(true, reply); });
  }
}

void WriteBatch::OnFinished(bool end, Result<std::span<const uint8_t>> reply) {
  const std::vector<KeyRef>& keys = end ? to_end_ : to_revoke_;
  Result<const mfb::KeyCodesReply*> codes = reply.ok()
                                                ? ReadKeyCodes(*reply, keys.size(), false)
                                                : Result<const mfb::KeyCodesReply*>(reply.status());
  if (!codes.ok()) {
    // A revoke that never arrived is cleaned up by the master's put timeouts; an End that
    // never arrived leaves the keys unreadable: the writers must be told.
    if (end) finish_error_ = codes.status();
    LOG_IF(WARNING, !end) << "revoking " << keys.size()
                          << " write(s) failed: " << codes.status().ToString();
  } else if (end) {
    for (size_t i = 0; i < keys.size(); ++i) {
      Status st = KeyStatus((*codes)->codes(), (*codes)->messages(), i);
      if (!st.ok()) held(keys[i]).SetKey(keys[i].index, st.code(), st.message());
    }
  }
  if (--finishing_ > 0) return;
  if (!finish_error_.ok()) {
    for (const KeyRef& k : to_end_) held(k).FailAll(finish_error_);
  }
  CompleteAll();
}

}  // namespace kvagent::agent

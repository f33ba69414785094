// Get: BatchGet -> each part from one replica into the client's buffer -> completions.
//
// A part is read from this node's pool when it holds a replica, else from the first peer the
// master lists. When a peer's read fails (its agent died and the master has not expired it yet,
// a network fault), the part's next replica is tried, until one answers or none is left; only
// then does the key fail with TRANSFER_FAILED.
//
// A Get whose read lease expired before its bytes were all in the client's buffer fails with
// TIMEOUT (SEMANTICS: "A Get whose lease expired during the transfer fails"): once the lease is
// gone the master may evict or remove the object and hand its range to a new writer, so bytes
// copied after that moment may be a mix of two values. The lease is measured from when the
// BatchGet was sent, which is never later than when the master granted it, so the check can
// only err on the safe side.
#include "batch.h"

namespace kvagent::agent {

ReadBatch::ReadBatch(PipelineContext& ctx, MasterMessages& messages,
                     std::vector<HeldRequest> requests)
    : Batch(ctx, messages, std::move(requests)) {}

void ReadBatch::Start() {
  CollectKeys();
  copied_.assign(keys_.size(), 0);
  for (HeldRequest& h : requests_) h.result.lengths.assign(h.result.codes.size(), 0);
  CountCall(proto::Op::Get, keys_.size());
  sent_at_ = std::chrono::steady_clock::now();
  ctx_.master->Call(
      messages_.KeyList(ctx_.NextMasterRequestId(), mfb::Body::BatchGet, requests_, keys_),
      [this](Result<std::span<const uint8_t>> reply) { OnPlaced(reply); });
}

void ReadBatch::OnPlaced(Result<std::span<const uint8_t>> reply) {
  if (!reply.ok()) return FailAll(reply.status());
  auto placements = ReadPlacements(*reply, keys_.size(), /*with_sizes=*/true);
  if (!placements.ok()) return FailAll(placements.status());
  const mfb::PlacementReply& p = **placements;
  lease_ = std::chrono::milliseconds(p.lease_ttl_ms());
  SegmentTable segments;
  segments.Load(p, ctx_);
  const auto now = std::chrono::steady_clock::now();
  for (uint32_t k = 0; k < keys_.size(); ++k) {
    HeldRequest& h = held(keys_[k]);
    Status st = KeyStatus(p.codes(), p.messages(), k);
    if (!st.ok()) {
      h.SetKey(keys_[k].index, st.code(), st.message());
      continue;
    }
    const uint64_t size = p.sizes()->Get(k);
    h.result.lengths[keys_[k].index] = size;
    const uint64_t capacity = h.request.request().buffers()->Get(keys_[k].index)->length();
    if (size > capacity) {
      h.SetKey(keys_[k].index, ErrorCode::kBufferOutOfRange,
               "the value is " + std::to_string(size) + " bytes but buffers[" +
                   std::to_string(keys_[k].index) + "] holds " + std::to_string(capacity) +
                   "; pass a buffer of at least lengths[i] bytes");
      continue;
    }
    if (h.gone) continue;
    if (h.Expired(now)) {
      FailExpired(keys_[k], "the value was not copied into the buffer");
      continue;
    }
    CopyKey(k, size, p, segments);
  }
  if (remote_.empty()) return Finish();
  remote_.Submit(ctx_, requests_, &ctx_.counters.bytes_from_peers,
                 [this](std::span<const uint32_t> keys, std::span<const Status> results) {
                   OnMoved(keys, results);
                 });
}

// Each part of key `k` from one of its replicas (this node's pool when it holds one).
void ReadBatch::CopyKey(uint32_t k, uint64_t size, const mfb::PlacementReply& reply,
                        const SegmentTable& segments) {
  HeldRequest& h = held(keys_[k]);
  const proto::BufferRef* target = h.request.request().buffers()->Get(keys_[k].index);
  uint8_t* dst = h.request.arena().data() + target->offset();
  const uint32_t end = reply.first()->Get(k + 1);
  uint64_t part_offset = 0;
  uint32_t i = reply.first()->Get(k);
  while (i < end) {
    // The replicas of one part are adjacent; take a local one if there is one.
    const uint32_t part = reply.placements()->Get(i)->part();
    const uint32_t first = i;
    const mfb::Placement* chosen = reply.placements()->Get(i);
    for (; i < end && reply.placements()->Get(i)->part() == part; ++i) {
      if (segments.Find(reply.placements()->Get(i)->segment_id()).local) {
        chosen = reply.placements()->Get(i);
      }
    }
    const uint64_t length = chosen->length();
    if (part_offset + length > size || part_offset + length < part_offset) {
      h.SetKey(keys_[k].index, ErrorCode::kInternal,
               "the master's parts exceed the value's size; check that kvmaster and kvagent are "
               "the same version");
      return;
    }
    const SegmentTable::Entry& seg = segments.Find(chosen->segment_id());
    if (seg.local) {
      Status copied = CopyFromPool(ctx_, chosen->offset(), dst + part_offset, length);
      if (!copied.ok()) {
        h.SetKey(keys_[k].index, ErrorCode::kTransferFailed, copied.message());
        return;
      }
      ctx_.counters.bytes_from_pool += length;
    } else {
      RemoteRead read{dst + part_offset, length, {}};
      for (uint32_t j = first; j < i; ++j) {
        const mfb::Placement* other = reply.placements()->Get(j);
        if (other == chosen || other->length() != length) continue;
        read.others.emplace_back(segments.Find(other->segment_id()).endpoint, other->offset());
      }
      AddRemoteRead(k, std::move(read), seg.endpoint, chosen->offset());
    }
    part_offset += length;
  }
  if (part_offset != size) {
    h.SetKey(keys_[k].index, ErrorCode::kInternal,
             "the master's parts do not cover the value; check that kvmaster and kvagent are the "
             "same version");
    return;
  }
  copied_[k] = 1;
}

void ReadBatch::AddRemoteRead(uint32_t key, RemoteRead read, std::string_view peer,
                              uint64_t offset) {
  remote_.Add(key, keys_[key].request, transfer::TransferKind::kRead, peer, offset, read.dst,
              read.length);
  reads_.push_back(std::move(read));
}

void ReadBatch::OnMoved(std::span<const uint32_t> keys, std::span<const Status> results) {
  std::vector<RemoteRead> failed = std::move(reads_);
  remote_ = RemoteMoves();
  reads_.clear();
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t k = keys[i];
    if (results[i].ok() || !copied_[k]) continue;
    RemoteRead& read = failed[i];
    if (!read.others.empty() && !held(keys_[k]).gone &&
        !held(keys_[k]).Expired(std::chrono::steady_clock::now())) {
      ++ctx_.counters.replica_fallbacks;
      auto [peer, offset] = std::move(read.others.front());
      read.others.erase(read.others.begin());
      AddRemoteRead(k, std::move(read), peer, offset);
      continue;
    }
    copied_[k] = 0;
    ++ctx_.counters.transfer_failures;
    held(keys_[k]).SetKey(keys_[k].index, ErrorCode::kTransferFailed,
                          "reading the value from its replica failed: " + results[i].message());
  }
  if (remote_.empty()) return Finish();
  remote_.Submit(ctx_, requests_, &ctx_.counters.bytes_from_peers,
                 [this](std::span<const uint32_t> keys, std::span<const Status> results) {
                   OnMoved(keys, results);
                 });
}

void ReadBatch::Finish() {
  const auto elapsed = std::chrono::steady_clock::now() - sent_at_;
  if (elapsed > lease_) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count();
    for (uint32_t k = 0; k < keys_.size(); ++k) {
      if (!copied_[k] || held(keys_[k]).result.codes[keys_[k].index] != ErrorCode::kOk) continue;
      ++ctx_.counters.lease_expired;
      held(keys_[k]).SetKey(keys_[k].index, ErrorCode::kTimeout,
                            "the read took " + std::to_string(ms) + " ms, longer than its " +
                                std::to_string(lease_.count()) +
                                " ms lease, so the bytes may mix two values; retry the get");
    }
  }
  CompleteAll();
}

}  // namespace kvagent::agent

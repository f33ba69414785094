// Put / Upsert: WriteStart -> bytes into every replica -> End or Revoke -> completions. A put
// whose every key has a reserved write (write_reservations.h) skips the WriteStart: its bytes go
// into the reserved placements at once, and one BatchPutCommit (start and End in one message)
// commits them; reserved writes of keys that fail are given back.
//
// Integrity: each part's CRC32C is taken from the client's bytes as they are copied into this
// node's pool (folded into that copy), or in one pass over them when the part has no local
// replica, and the End carries it to the master. Every byte sent to a peer names the peer's pool
// incarnation, the master epoch and the write id, so a peer refuses a write for a pool it no
// longer has, from another master, or that was abandoned; local copies ask the same fence.
//
// Replicas: a key is stored when every part has at least one replica written; the replicas that
// failed are named in the End (the master drops and fences them) and the caller learns how many
// were written (KeyResult::replicas). A key with a part that has no replica written is revoked
// and fails with TRANSFER_FAILED.
//
// Commit: the End is sent with CallUntilAnswered: when the link to the master drops, it is sent
// again after the agent registered again, so a put the master committed is answered OK rather
// than MASTER_UNAVAILABLE (ending twice with the same write id is a no-op at the master). If no
// master answers in time the key fails with TIMEOUT, saying the value may be stored.
#include <glog/logging.h>

#include <algorithm>

#include "batch.h"
#include "client_values.h"
#include "kvagent/common/checksum.h"
#include "write_reservations.h"

namespace kvagent::agent {
namespace {

using flatbuffers::uoffset_t;

Status TransferFailed(const Status& cause) {
  if (cause.code() == ErrorCode::kTransferFailed) return cause;
  return Status(ErrorCode::kTransferFailed,
                std::string(ErrorCodeName(cause.code())) + ": " + cause.message());
}

// How long an End is retried across reconnects when its caller gave no deadline.
constexpr std::chrono::seconds kEndRetryWithoutDeadline{30};
// The retries of an End stop this long before its caller's deadline, so the answer arrives.
constexpr std::chrono::milliseconds kAnswerMargin{200};

}  // namespace

WriteBatch::WriteBatch(PipelineContext& ctx, MasterMessages& messages, bool upsert,
                       std::vector<HeldRequest> requests, ScratchPool<Scratch>* spares)
    : Batch(ctx, messages, std::move(requests)), upsert_(upsert), recycled_(spares, Recycled()) {}

void WriteBatch::Start() {
  CollectKeys();
  state_.assign(keys_.size(), kNotStarted);
  write_ids_.assign(keys_.size(), 0);
  first_part_.assign(keys_.size() + 1, 0);
  for (HeldRequest& h : requests_) h.result.replicas.assign(h.result.codes.size(), 0);
  const proto::Op op = upsert_ ? proto::Op::Upsert : proto::Op::Put;
  CountCall(op, keys_.size());
  const auto started = phase_.Start();
  if (!upsert_ && ctx_.reservations != nullptr && StartReserved(started)) return;
  ctx_.master->Call(
      messages_.WriteStart(ctx_.NextMasterRequestId(), ctx_.master->identity().agent_id, upsert_,
                           requests_, keys_),
      [this](Result<std::span<const uint8_t>> reply) { OnStarted(reply); });
}

void WriteBatch::OnStarted(Result<std::span<const uint8_t>> reply) {
  // The reply's arrival: a deadline that passes while it is decoded is caught at the next check.
  const auto now = phase_.Lap(ctx_.latency.of(PutPhase::kMasterStart));
  if (!reply.ok()) return FailAll(reply.status());
  auto placements = ReadPlacements(*reply, keys_.size(), /*with_sizes=*/false);
  if (!placements.ok()) return FailAll(placements.status());
  const mfb::PlacementReply& p = **placements;
  epoch_ = p.master_epoch();
  PoolTable& pools = pools_;
  pools.Load(p, ctx_);
  auto writes = LocalWritesOf(ctx_);
  for (uint32_t k = 0; k < keys_.size(); ++k) {
    first_part_[k + 1] = first_part_[k];
    Status st = KeyStatus(p.codes(), p.messages(), k);
    if (!st.ok()) {
      held(keys_[k]).SetKey(keys_[k].index, st.code(), st.message());
      continue;
    }
    state_[k] = kStarted;
    write_ids_[k] = p.write_ids()->Get(k);
    if (held(keys_[k]).gone) {
      state_[k] = kFailed;  // revoked below: nothing of a departed client becomes readable
      continue;
    }
    if (MayNotCopy(k, now)) continue;
    places_.clear();
    for (uint32_t i = p.first()->Get(k); i < p.first()->Get(k + 1); ++i) {
      const mfb::Placement* pl = p.placements()->Get(i);
      places_.push_back(ReplicaPlace{pl->part(), pl->pool_id(), pl->offset(), pl->length()});
    }
    CopyKey(k, places_, pools, writes);
  }
  EndLocalWrites(writes);
  if (remote_.empty()) return Finish();
  remote_.Submit(ctx_, requests_, &ctx_.counters.bytes_to_peers,
                 [this](std::span<const uint32_t> keys, std::span<const Status> results,
                        std::span<const transfer::ReceivedChecksum>) { OnMoved(keys, results); });
}

bool WriteBatch::StartReserved(std::chrono::steady_clock::time_point now) {
  std::vector<uint64_t> sizes;
  sizes.reserve(keys_.size());
  for (const KeyRef& k : keys_) {
    sizes.push_back(ClientValue(held(k).request, k.index).length());
  }
  const proto::WriteOptions* o = requests_.front().request.request().options();
  std::vector<WriteReservations::Reserved> taken;
  taken.reserve(keys_.size());
  if (!ctx_.reservations->Take(sizes, o != nullptr ? o->replica_count() : 1, &taken)) return false;
  reserved_ = true;
  epoch_ = ctx_.reservations->epoch();
  const PoolTable& pools = ctx_.reservations->pools();
  auto writes = LocalWritesOf(ctx_);
  for (uint32_t k = 0; k < keys_.size(); ++k) {
    first_part_[k + 1] = first_part_[k];
    state_[k] = kStarted;
    write_ids_[k] = taken[k].write_id;
    if (held(keys_[k]).gone) {
      state_[k] = kFailed;
      continue;
    }
    if (MayNotCopy(k, now)) continue;
    CopyKey(k, taken[k].replicas, pools, writes);
  }
  EndLocalWrites(writes);
  if (remote_.empty()) {
    Finish();
  } else {
    remote_.Submit(ctx_, requests_, &ctx_.counters.bytes_to_peers,
                   [this](std::span<const uint32_t> keys, std::span<const Status> results,
                          std::span<const transfer::ReceivedChecksum>) { OnMoved(keys, results); });
  }
  return true;
}

// The batch's local copies are done: their bytes are made visible before anyone is told, and the
// pool fence may move on.
void WriteBatch::EndLocalWrites(transfer::PoolFence::LocalWrites& writes) {
  FenceStreamingStores();
  writes = {};
}

// Every replica of every part of key `k`, from where the client keeps the value (its arena or
// its own memory: client_values.h). Parts are in order and each part's offset in the value is
// the sum of the lengths of the parts before it; a part's replicas are adjacent in `placements`.
void WriteBatch::CopyKey(uint32_t k, std::span<const ReplicaPlace> placements,
                         const PoolTable& pools, transfer::PoolFence::LocalWrites& writes) {
  HeldRequest& h = held(keys_[k]);
  const ClientValue value(h.request, keys_[k].index);
  const auto end = static_cast<uint32_t>(placements.size());
  const OpStamp base{.master_epoch = epoch_, .write_id = write_ids_[k]};
  uint64_t part_offset = 0;
  uint32_t i = 0;
  while (i < end) {
    const uint32_t part = placements[i].part;
    const uint64_t length = placements[i].length;
    uint32_t group_end = i;
    while (group_end < end && placements[group_end].part == part) ++group_end;
    if (part_offset + length > value.length() || part_offset + length < part_offset) {
      state_[k] = kFailed;
      h.SetKey(keys_[k].index, ErrorCode::kInternal,
               "the master placed more bytes than the value holds; check that kvmaster and "
               "kvagent are the same version");
      return;
    }
    // One entry per part: its checksum, its replica count and its failures.
    parts_.push_back(PartWrite{0, static_cast<uint8_t>(std::min<uint32_t>(group_end - i, 255)), 0});
    const uint32_t part_index = first_part_[k + 1]++;
    bool summed = false;
    // The local replica first: its copy also takes the checksum.
    for (uint32_t j = i; j < group_end; ++j) {
      const ReplicaPlace& pl = placements[j];
      const PoolTable::Entry& pool = pools.Find(pl.pool_id);
      if (!pool.local) continue;
      Result<uint32_t> copied = value.ToPool(ctx_, writes, base, part_offset, pl.offset, length);
      if (!copied.ok()) {
        if (ClientMemoryFailed(copied.status())) return FailCopy(k, copied.status());
        if (copied.status().code() == ErrorCode::kTransferFailed)
          ++ctx_.counters.fenced_local_writes;
        ReplicaFailed(k, part_index, part, pl.pool_id, copied.status());
        continue;
      }
      ctx_.counters.bytes_to_pool += length;
      if (!summed) parts_[part_index].checksum = *copied;
      summed = true;
    }
    if (!summed && ctx_.checksums) {
      Result<uint32_t> sum = value.Checksum(part_offset, length);
      if (!sum.ok()) return FailCopy(k, sum.status());
      parts_[part_index].checksum = *sum;
    }
    PeerBuffer source;  // the part's bytes for the data plane: staged once for all its peers
    for (uint32_t j = i; j < group_end; ++j) {
      const ReplicaPlace& pl = placements[j];
      const PoolTable::Entry& pool = pools.Find(pl.pool_id);
      if (pool.local) continue;
      if (!pool.refused.ok()) {
        ++ctx_.counters.fenced_local_writes;
        ReplicaFailed(k, part_index, part, pl.pool_id, pool.refused);
        continue;
      }
      if (pool.endpoint.empty()) {
        ReplicaFailed(k, part_index, part, pl.pool_id,
                      Status(ErrorCode::kTransferFailed,
                             "pool " + std::to_string(pl.pool_id) + " has no endpoint"));
        continue;
      }
      if (source.data == nullptr) {
        auto staged = value.ForPeer(part_offset, length, /*fill=*/true);
        if (!staged.ok()) return FailCopy(k, staged.status());
        source = std::move(*staged);
      }
      OpStamp stamp = base;
      stamp.pool_incarnation = pool.incarnation;
      if (ctx_.checksums) stamp.payload_crc = parts_[part_index].checksum;
      remote_.Add(k, keys_[k].request, transfer::TransferKind::kWrite, pool.endpoint, pl.offset,
                  source.data, length, stamp);
      remote_parts_.push_back(RemoteReplica{part_index, part, pl.pool_id});
    }
    if (source.scratch) peer_scratch_.push_back(std::move(source.scratch));
    part_offset += length;
    i = group_end;
  }
  if (part_offset != value.length()) {
    state_[k] = kFailed;
    h.SetKey(keys_[k].index, ErrorCode::kInternal,
             "the master's placements do not cover the value; check that kvmaster and kvagent "
             "are the same version");
  }
}

// Key `k` fails because its client's memory could not be read (or staged for a peer): nothing
// of it is committed.
void WriteBatch::FailCopy(uint32_t k, const Status& why) {
  state_[k] = kFailed;
  held(keys_[k]).SetKey(keys_[k].index, CopyFailureCode(why), why.message());
}

void WriteBatch::ReplicaFailed(uint32_t k, uint32_t part_index, uint32_t part, uint32_t pool,
                               const Status& why) {
  ++parts_[part_index].failures;
  failed_.push_back(FailedWrite{k, part, pool});
  if (first_failure_.find(k) == first_failure_.end())
    first_failure_.emplace(k, TransferFailed(why));
}

void WriteBatch::OnMoved(std::span<const uint32_t> keys, std::span<const Status> results) {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (results[i].ok()) continue;
    const RemoteReplica& r = remote_parts_[i];
    ReplicaFailed(keys[i], r.part_index, r.part, r.pool_id, results[i]);
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

// Fails key `k` (started) before its copy when its caller's deadline has passed, or its value
// may not be read at `now` (the caller stopped waiting: HeldRequest::MayTouchClientMemory).
bool WriteBatch::MayNotCopy(uint32_t k, std::chrono::steady_clock::time_point now) {
  if (Expire(k, now, "the value was not stored")) return true;
  if (held(keys_[k]).MayTouchClientMemory(now)) return false;
  state_[k] = kFailed;
  FailExpired(keys_[k], "the value was not stored");
  return true;
}

void WriteBatch::Finish() {
  const auto now = phase_.Lap(ctx_.latency.of(PutPhase::kData));
  peer_scratch_.clear();  // the data plane is done with every staged part
  std::sort(failed_.begin(), failed_.end(),
            [](const FailedWrite& a, const FailedWrite& b) { return a.key < b.key; });
  size_t next_failed = 0;
  for (uint32_t k = 0; k < keys_.size(); ++k) {
    const size_t failed_begin = next_failed;
    while (next_failed < failed_.size() && failed_[next_failed].key == k) ++next_failed;
    if (state_[k] == kNotStarted) continue;
    // A part with no replica written: the value cannot be read, revoke it.
    if (state_[k] == kStarted) {
      for (uint32_t p = first_part_[k]; p < first_part_[k + 1]; ++p) {
        if (parts_[p].failures < parts_[p].replicas) continue;
        state_[k] = kFailed;
        ++ctx_.counters.transfer_failures;
        const Status& why = first_failure_.at(k);
        held(keys_[k]).SetKey(keys_[k].index, why.code(), why.message());
        break;
      }
    }
    Expire(k, now, "its bytes were copied but the value was revoked, not committed");
    const bool keep = state_[k] == kStarted && !held(keys_[k]).gone;
    if (!keep) {
      to_revoke_.push_back(keys_[k]);
      revoke_ids_.push_back(write_ids_[k]);
      continue;
    }
    const auto end_index = static_cast<uint32_t>(to_end_.size());
    to_end_.push_back(keys_[k]);
    end_ids_.push_back(write_ids_[k]);
    end_part_counts_.push_back(first_part_[k + 1] - first_part_[k]);
    for (uint32_t p = first_part_[k]; p < first_part_[k + 1]; ++p) {
      end_checksums_.push_back(parts_[p].checksum);
    }
    for (size_t f = failed_begin; f < next_failed; ++f) {
      end_failed_.emplace_back(end_index, failed_[f].part, failed_[f].pool_id);
    }
  }
  ctx_.counters.revoked_keys += to_revoke_.size();
  const uint32_t agent = ctx_.master->identity().agent_id;
  if (reserved_) {
    // Reserved writes not committed go back to the master (which fences them); the others are
    // committed under their keys with one message.
    if (!to_revoke_.empty()) ctx_.reservations->GiveBack(revoke_ids_);
    if (to_end_.empty()) return CompleteAll();
    finishing_ = 1;
    WriteFinishFields fields{.write_ids = end_ids_, .failed = end_failed_};
    if (ctx_.checksums) {
      fields.part_counts = end_part_counts_;
      fields.checksums = end_checksums_;
    }
    ctx_.master->CallUntilAnswered(
        messages_.WriteCommit(ctx_.NextMasterRequestId(), agent, requests_, to_end_, fields,
                              epoch_),
        [this](Result<std::span<const uint8_t>> reply) { OnFinished(true, reply); },
        EndRetryUntil(now));
    return;
  }
  finishing_ = (to_end_.empty() ? 0 : 1) + (to_revoke_.empty() ? 0 : 1);
  if (finishing_ == 0) return CompleteAll();
  // Both calls are set up before either is sent: an embedded master answers inside Call.
  if (!to_revoke_.empty()) {
    const auto type = upsert_ ? mfb::Body::BatchUpsertRevoke : mfb::Body::BatchPutRevoke;
    ctx_.master->Call(messages_.WriteFinish(ctx_.NextMasterRequestId(), agent, type, requests_,
                                            to_revoke_, {.write_ids = revoke_ids_}),
                      [this](Result<std::span<const uint8_t>> reply) { OnFinished(false, reply); });
  }
  if (!to_end_.empty()) {
    const auto type = upsert_ ? mfb::Body::BatchUpsertEnd : mfb::Body::BatchPutEnd;
    WriteFinishFields fields{.write_ids = end_ids_, .failed = end_failed_};
    if (ctx_.checksums) {
      fields.part_counts = end_part_counts_;
      fields.checksums = end_checksums_;
    }
    ctx_.master->CallUntilAnswered(
        messages_.WriteFinish(ctx_.NextMasterRequestId(), agent, type, requests_, to_end_, fields),
        [this](Result<std::span<const uint8_t>> reply) { OnFinished(true, reply); },
        EndRetryUntil(now));
  }
}

// Shortly before the latest deadline of the requests being ended, so that their callers get
// the agent's answer rather than their own timeout; a fixed window (from `now`) when one of them
// gave none.
MasterPort::Clock::time_point WriteBatch::EndRetryUntil(MasterPort::Clock::time_point now) const {
  auto until = now;
  for (const KeyRef& k : to_end_) {
    const HeldRequest& h = requests_[k.request];
    const auto deadline = h.Deadline();
    if (!deadline) return now + kEndRetryWithoutDeadline;
    until = std::max(until, *deadline - kAnswerMargin);
  }
  return until;
}

void WriteBatch::OnFinished(bool end, Result<std::span<const uint8_t>> reply) {
  const std::vector<KeyRef>& keys = end ? to_end_ : to_revoke_;
  Result<const mfb::KeyCodesReply*> codes = reply.ok()
                                                ? ReadKeyCodes(*reply, keys.size(), false)
                                                : Result<const mfb::KeyCodesReply*>(reply.status());
  if (!codes.ok()) {
    // A revoke that never arrived is cleaned up by the master's put timeouts. An End that was
    // never confirmed (no master answered within the retry window) may still have committed;
    // one the master answered with a request-level error did not.
    if (end) {
      finish_error_ =
          !reply.ok() && (codes.status().code() == ErrorCode::kMasterUnavailable ||
                          codes.status().code() == ErrorCode::kTimeout)
              ? Status(ErrorCode::kTimeout,
                       "the master did not confirm the commit (" + codes.status().message() +
                           "); the value may be stored: check with exist or get")
              : codes.status();
    }
    LOG_IF(WARNING, !end) << "revoking " << keys.size()
                          << " write(s) failed: " << codes.status().ToString();
  } else if (end) {
    const auto* replicas = (*codes)->replicas();
    for (size_t i = 0; i < keys.size(); ++i) {
      Status st = KeyStatus((*codes)->codes(), (*codes)->messages(), i);
      HeldRequest& h = held(keys[i]);
      if (!st.ok()) {
        h.SetKey(keys[i].index, st.code(), st.message());
        continue;
      }
      const auto at = static_cast<uoffset_t>(i);
      if (reserved_) ++ctx_.counters.reserved_puts;
      const uint8_t kept = replicas != nullptr ? replicas->Get(at) : 1;
      h.result.replicas[keys[i].index] = kept;
      const proto::WriteOptions* o = h.request.request().options();
      if (kept < (o != nullptr ? o->replica_count() : 1)) ++ctx_.counters.degraded_puts;
    }
  }
  if (--finishing_ > 0) return;
  phase_.Lap(ctx_.latency.of(PutPhase::kMasterEnd));
  if (!finish_error_.ok()) {
    for (const KeyRef& k : to_end_)
      held(k).SetKey(k.index, finish_error_.code(), finish_error_.message());
  }
  CompleteAll();
}

}  // namespace kvagent::agent

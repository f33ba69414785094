// Get: BatchGet -> each part from one replica into the client's buffer -> completions.
//
// A part is read from this node's pool when it holds a replica, else from the replicas the
// master lists (those on healthy agents first). A read is good only when the bytes in the
// client's buffer match the part's checksum (taken by the writer, kept by the master): the
// check is folded into the copy out of this node's pool, and for bytes from a peer taken by the
// TCP transport as they arrive (TransferOp::received; over RDMA, one pass over the buffer). A
// replica that fails its read or its checksum is followed by the part's next replica; a corrupt one
// is counted, logged and reported to the master, which drops it (and the object with its last
// replica). The key fails only when no replica gave good bytes: with DATA_CORRUPTED when every
// replica was read and was corrupt, else TRANSFER_FAILED (a replica that could not be read may
// still hold the value). A get never answers OK with bytes other than those stored. The client
// can write its buffer too, so no replica is blamed for a CRC taken over that buffer alone
// (Rechecked, TransferOp::received).
//
// A Get whose read lease expired before its bytes were all in the client's buffer fails with
// TIMEOUT (SEMANTICS: "A Get whose lease expired during the transfer fails"): once the lease is
// gone the master may evict or remove the object and hand its range to a new writer (an upsert
// of the same size rewrites the value in place). The lease is measured from when the BatchGet
// was sent, which is never later than when the master granted it, so the check can only err on
// the safe side. Bytes that fail their checksum after that point are such a mix as likely as
// damage: the key fails with TIMEOUT and no replica is blamed (blaming one would drop a good
// replica of the new value, with its last replica the object).
#include <glog/logging.h>

#include "batch.h"
#include "client_values.h"
#include "kvagent/common/checksum.h"

namespace kvagent::agent {

ReadBatch::ReadBatch(PipelineContext& ctx, MasterMessages& messages,
                     std::vector<HeldRequest> requests, ScratchPool<Scratch>* spares)
    : Batch(ctx, messages, std::move(requests)), recycled_(spares, Recycled()) {}

void ReadBatch::Start() {
  CollectKeys();
  copied_.assign(keys_.size(), 0);
  versions_.assign(keys_.size(), 0);
  for (HeldRequest& h : requests_) h.result.lengths.assign(h.result.codes.size(), 0);
  CountCall(proto::Op::Get, keys_.size());
  sent_at_ = phase_.Start();
  ctx_.master->Call(
      messages_.KeyList(ctx_.NextMasterRequestId(), mfb::Body::BatchGet, requests_, keys_),
      [this](Result<std::span<const uint8_t>> reply) { OnPlaced(reply); });
}

void ReadBatch::OnPlaced(Result<std::span<const uint8_t>> reply) {
  // The reply's arrival: a deadline that passes while it is decoded is caught at the next check.
  const auto now = phase_.Lap(ctx_.latency.of(GetPhase::kMaster));
  if (!reply.ok()) return FailAll(reply.status());
  auto placements = ReadPlacements(*reply, keys_.size(), /*with_sizes=*/true);
  if (!placements.ok()) return FailAll(placements.status());
  const mfb::PlacementReply& p = **placements;
  lease_ = std::chrono::milliseconds(p.lease_ttl_ms());
  epoch_ = p.master_epoch();
  PoolTable& pools = pools_;
  pools.Load(p, ctx_);
  for (uint32_t k = 0; k < keys_.size(); ++k) {
    HeldRequest& h = held(keys_[k]);
    Status st = KeyStatus(p.codes(), p.messages(), k);
    if (!st.ok()) {
      h.SetKey(keys_[k].index, st.code(), st.message());
      continue;
    }
    const uint64_t size = p.sizes()->Get(k);
    versions_[k] = p.write_ids()->Get(k);
    h.result.lengths[keys_[k].index] = size;
    const uint64_t capacity = ClientValue(h.request, keys_[k].index).length();
    if (size > capacity) {
      h.SetKey(keys_[k].index, ErrorCode::kBufferOutOfRange,
               "the value is " + std::to_string(size) + " bytes but buffers[" +
                   std::to_string(keys_[k].index) + "] holds " + std::to_string(capacity) +
                   "; pass a buffer of at least lengths[i] bytes");
      continue;
    }
    if (h.gone) continue;
    if (!h.MayTouchClientMemory(now)) {
      FailExpired(keys_[k], "the value was not copied into the buffer");
      continue;
    }
    // The next key's bytes are asked of the CPU while this key's are copied.
    ahead_ = k + 1 < keys_.size() ? LocalFirstPart(k + 1, p, pools) : PrefetchRange{};
    CopyKey(k, size, p, pools);
  }
  if (remote_.empty()) return Finish();
  remote_.Submit(ctx_, requests_, &ctx_.counters.bytes_from_peers,
                 [this](std::span<const uint32_t> keys, std::span<const Status> results,
                        std::span<const transfer::ReceivedChecksum> received) {
                   OnMoved(keys, results, received);
                 });
}

// Each part of key `k` from one of its replicas (this node's pool first).
void ReadBatch::CopyKey(uint32_t k, uint64_t size, const mfb::PlacementReply& reply,
                        const PoolTable& pools) {
  HeldRequest& h = held(keys_[k]);
  const uint32_t end = reply.first()->Get(k + 1);
  uint64_t part_offset = 0;
  uint32_t i = reply.first()->Get(k);
  copied_[k] = 1;  // until a part fails
  while (i < end && copied_[k]) {
    const mfb::Placement* first = reply.placements()->Get(i);
    PartRead read;
    read.left.swap(spare_left_);  // an earlier part's buffer, cleared
    read.key = k;
    read.part = first->part();
    read.at = part_offset;
    read.length = first->length();
    read.checksum = first->checksum();
    read.checksummed = first->checksummed() && ctx_.checksums;
    if (part_offset + read.length > size || part_offset + read.length < part_offset) {
      copied_[k] = 0;
      h.SetKey(keys_[k].index, ErrorCode::kInternal,
               "the master's parts exceed the value's size; check that kvmaster and kvagent are "
               "the same version");
      return;
    }
    for (; i < end && reply.placements()->Get(i)->part() == read.part; ++i) {
      const mfb::Placement* pl = reply.placements()->Get(i);
      if (pl->length() != read.length) continue;  // a replica of a part has the part's length
      const PoolTable::Entry& pool = pools.Find(pl->pool_id());
      if (!pool.refused.ok() || (!pool.local && pool.endpoint.empty())) {
        // Never "this node's pool" by an empty endpoint, nor through a stale placement.
        read.unusable =
            pool.refused.ok()
                ? Status(ErrorCode::kTransferFailed,
                         "pool " + std::to_string(pl->pool_id()) + " has no data endpoint")
                : pool.refused;
        continue;
      }
      Replica r{pool.local ? std::string() : std::string(pool.endpoint), pl->offset(),
                pool.incarnation, pl->pool_id()};
      if (pool.local) {
        read.left.insert(read.left.begin(), std::move(r));
      } else {
        read.left.push_back(std::move(r));
      }
    }
    part_offset += read.length;
    ReadPart(read);
    if (read.left.capacity() > 0) {  // read here, not handed to the data plane: keep its buffer
      read.left.clear();
      spare_left_.swap(read.left);
    }
  }
  if (copied_[k] && part_offset != size) {
    copied_[k] = 0;
    h.SetKey(keys_[k].index, ErrorCode::kInternal,
             "the master's parts do not cover the value; check that kvmaster and kvagent are the "
             "same version");
  }
}

PrefetchRange ReadBatch::LocalFirstPart(uint32_t k, const mfb::PlacementReply& reply,
                                        const PoolTable& pools) const {
  if (reply.codes()->Get(k) != 0) return {};
  const uint32_t end = reply.first()->Get(k + 1);
  for (uint32_t i = reply.first()->Get(k); i < end; ++i) {
    const mfb::Placement* pl = reply.placements()->Get(i);
    if (pl->part() != 0) return {};
    if (pools.Find(pl->pool_id()).local) return PoolRange(ctx_, pl->offset(), pl->length());
  }
  return {};
}

void ReadBatch::ReadPart(PartRead& read) {
  Status last = Status::Ok();  // the last replica's failure (built only when one fails)
  const HeldRequest& h = held(keys_[read.key]);
  const ClientValue target(h.request, keys_[read.key].index);  // the arena, or client memory
  while (!read.left.empty() && read.left.front().endpoint.empty()) {
    Replica local = std::move(read.left.front());
    read.left.erase(read.left.begin());
    Result<uint32_t> copied = target.FromPool(ctx_, local.offset, read.at, read.length, ahead_);
    ahead_ = {};
    if (!copied.ok()) {
      if (ClientMemoryFailed(copied.status())) return FailKey(read.key, copied.status());
      read.failed_seen = true;
      last = copied.status();
      continue;
    }
    ctx_.counters.bytes_from_pool += read.length;
    if (Verified(read, local, Rechecked(read, local, target, *copied))) return;
    if (read.outlived_lease) return PartFailed(read, Status());  // no replica can say more now
    last = Status(ErrorCode::kDataCorrupted, "this node's replica failed its checksum");
  }
  if (read.left.empty()) {
    if (last.ok()) {
      last = read.unusable.ok()
                 ? Status(ErrorCode::kTransferFailed, "the master listed no replica for it")
                 : read.unusable;
    }
    return PartFailed(read, last);
  }
  if (read.dst == nullptr) {  // where the peer's bytes land: the arena, or the peer scratch
    auto staged = target.ForPeer(read.at, read.length, /*fill=*/false);
    if (!staged.ok()) return FailKey(read.key, staged.status());
    read.dst = staged->data;
    read.scratch = std::move(staged->scratch);
  }
  Replica peer = std::move(read.left.front());
  read.left.erase(read.left.begin());
  remote_.Add(read.key, keys_[read.key].request, transfer::TransferKind::kRead, peer.endpoint,
              peer.offset, read.dst, read.length,
              OpStamp{.pool_incarnation = peer.incarnation, .master_epoch = epoch_});
  reads_.push_back(std::move(read));
  tried_.push_back(std::move(peer));
}

uint32_t ReadBatch::Rechecked(const PartRead& read, const Replica& local, const ClientValue& target,
                              uint32_t crc) const {
  uint8_t* arena = target.ArenaRange(read.at);
  if (!read.checksummed || crc == read.checksum || arena == nullptr) return crc;
  // The copy's CRC may have been taken over the arena (a small value copied first, then
  // checksummed in L1), which the client can write too: take it again from the pool's bytes,
  // copying them anew, so that a client writing into its own buffer during its get never gets
  // a good replica reported (and dropped cluster-wide). It gets what it wrote.
  return CopyWithCrc32c(arena, ctx_.pool->base() + local.offset, read.length, CopyStores::kCached);
}

bool ReadBatch::Verified(PartRead& read, const Replica& replica, uint32_t crc) {
  if (!read.checksummed || crc == read.checksum) return true;
  if (!UnderLease(std::chrono::steady_clock::now())) {
    read.outlived_lease = true;
    return false;
  }
  read.corrupt_seen = true;
  ++ctx_.counters.checksum_mismatches;
  const std::string key(KeyAt(requests_, keys_[read.key]));
  LOG(WARNING) << "checksum mismatch: key '" << key << "' part " << read.part << " in pool "
               << replica.pool_id << " at offset " << replica.offset
               << (replica.endpoint.empty() ? " (this node's pool)" : " (" + replica.endpoint + ")")
               << ": read CRC32C " << crc << ", stored " << read.checksum
               << "; dropping that replica and reading another";
  bad_.push_back(BadReplicaReport{key, versions_[read.key], read.part, replica.pool_id});
  return false;
}

void ReadBatch::PartFailed(const PartRead& read, const Status& last) {
  const uint32_t k = read.key;
  if (!copied_[k]) return;  // another part failed already
  copied_[k] = 0;
  HeldRequest& h = held(keys_[k]);
  if (read.outlived_lease) {
    ++ctx_.counters.lease_expired;
    h.SetKey(keys_[k].index, ErrorCode::kTimeout,
             "the bytes of part " + std::to_string(read.part) + " were read after the " +
                 std::to_string(lease_.count()) +
                 " ms read lease may have run out and do not match the value's checksum: it may "
                 "have been replaced meanwhile (no replica is blamed); retry the get");
    return;
  }
  // Corrupt only when every replica was read and none matched: a replica that could not be
  // read (or was not tried) may still hold the value, so that is a failed transfer (retry).
  if (read.corrupt_seen && !read.failed_seen && read.left.empty()) {
    ++ctx_.counters.corrupted_keys;
    h.SetKey(keys_[k].index, ErrorCode::kDataCorrupted,
             "every replica of part " + std::to_string(read.part) +
                 " failed its checksum; the corrupt replicas were dropped: put the value again");
    return;
  }
  ++ctx_.counters.transfer_failures;
  h.SetKey(keys_[k].index, ErrorCode::kTransferFailed,
           "reading the value from its replica failed: " + last.message());
}

// Key `k` fails because its client's memory could not be written (or no peer scratch was left):
// the replicas are not to blame.
void ReadBatch::FailKey(uint32_t k, const Status& why) {
  if (!copied_[k]) return;
  copied_[k] = 0;
  held(keys_[k]).SetKey(keys_[k].index, CopyFailureCode(why), why.message());
}

// Verified bytes a peer wrote into a peer scratch range go on into the client's own memory (an
// arena part is already in place).
void ReadBatch::DeliverPeerRead(const PartRead& read) {
  if (read.scratch == nullptr || held(keys_[read.key]).gone) return;
  const HeldRequest& h = held(keys_[read.key]);
  Status moved =
      ClientValue(h.request, keys_[read.key].index).FromPeer(read.dst, read.at, read.length);
  if (!moved.ok()) FailKey(read.key, moved);
}

void ReadBatch::OnMoved(std::span<const uint32_t> keys, std::span<const Status> results,
                        std::span<const transfer::ReceivedChecksum> received) {
  std::vector<PartRead> reads = std::move(reads_);
  std::vector<Replica> tried = std::move(tried_);
  remote_ = RemoteMoves();
  reads_.clear();
  tried_.clear();
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < keys.size(); ++i) {
    PartRead& read = reads[i];
    if (!copied_[read.key]) continue;  // the key failed already
    Status last = results[i];
    if (!last.ok()) read.failed_seen = true;
    if (last.ok()) {
      // Taken by the transport before the bytes reached the buffer (TCP) where it could: the
      // client can write its buffer too, and must not get a good replica blamed by doing so.
      const uint32_t crc = !read.checksummed   ? 0
                           : received[i].taken ? received[i].crc
                                               : Crc32c(read.dst, read.length);
      const bool second_read = std::exchange(read.rereading, false);
      if (read.checksummed && crc != read.checksum && !UnderLease(now)) {
        // Past the lease the value may have been replaced while its bytes were on the way.
        read.outlived_lease = true;
        PartFailed(read, Status());
        continue;
      }
      if (!second_read && read.checksummed && crc != read.checksum) {
        if (Alive(read, now)) {
          RereadPeer(read, std::move(tried[i]), crc);
          continue;
        }
        // No time left to read them again: the replica is not blamed for one mismatch.
        read.failed_seen = true;
        last = Status(ErrorCode::kTransferFailed,
                      "the bytes from " + tried[i].endpoint + " failed their checksum once");
      } else if (Verified(read, tried[i], crc)) {
        DeliverPeerRead(read);
        continue;
      } else {
        last = Status(ErrorCode::kDataCorrupted,
                      "the replica from " + tried[i].endpoint + " failed its checksum twice");
      }
    }
    read.rereading = false;
    if (!read.left.empty() && Alive(read, now)) {
      ++ctx_.counters.replica_fallbacks;
      ReadPart(read);
      continue;
    }
    PartFailed(read, last);
  }
  if (remote_.empty()) return Finish();
  remote_.Submit(ctx_, requests_, &ctx_.counters.bytes_from_peers,
                 [this](std::span<const uint32_t> keys, std::span<const Status> results,
                        std::span<const transfer::ReceivedChecksum> received) {
                   OnMoved(keys, results, received);
                 });
}

bool ReadBatch::Alive(const PartRead& read, std::chrono::steady_clock::time_point now) {
  HeldRequest& h = held(keys_[read.key]);
  return !h.gone && h.MayTouchClientMemory(now);
}

// Bytes from a peer can be damaged on their way (a bad NIC or link) as well as in its pool, and
// blaming the replica drops it cluster-wide (the object too, with its last replica). So the same
// replica is read once more first; only bytes that fail their checksum twice blame it.
void ReadBatch::RereadPeer(PartRead& read, Replica replica, uint32_t crc) {
  ++ctx_.counters.peer_rereads;
  LOG_EVERY_N(WARNING, 100) << "bytes of part " << read.part << " from " << replica.endpoint
                            << " failed their checksum (CRC32C " << crc << ", stored "
                            << read.checksum
                            << "): reading them again before blaming that replica (damage on "
                               "the way, or in its pool; every 100th is logged)";
  read.rereading = true;
  read.left.insert(read.left.begin(), std::move(replica));
  ReadPart(read);
}

void ReadBatch::Finish() {
  const auto elapsed = phase_.Lap(ctx_.latency.of(GetPhase::kData)) - sent_at_;
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
  if (!bad_.empty()) {
    // The corrupt replicas go; nothing waits for the answer (a lost report leaves a replica
    // whose reads keep failing their checksums, which is safe).
    ctx_.master->Call(messages_.ReportBadReplicas(ctx_.NextMasterRequestId(),
                                                  ctx_.master->identity().agent_id, bad_),
                      [](Result<std::span<const uint8_t>> reply) {
                        if (!reply.ok()) {
                          LOG(WARNING)
                              << "reporting corrupt replicas failed: " << reply.status().ToString();
                        }
                      });
    bad_.clear();
  }
  CompleteAll();
}

}  // namespace kvagent::agent

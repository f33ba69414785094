// One master round of the request pipeline: the requests it carries, and the state machine that
// takes them from the master call to their completions.
//
//   WriteBatch  Put/Upsert: WriteStart -> copy the bytes (memcpy / data plane) -> End for the
//               keys whose every replica arrived, Revoke for the others -> completions. A put
//               whose keys all have reserved writes skips the WriteStart and commits with
//               one BatchPutCommit instead of the End.
//   ReadBatch   Get: BatchGet -> copy each part from one replica -> completions.
//   KeyBatch    Exist, Remove: one call -> per-key codes.
//   SingleCall  RemoveAll, List (paged), Stat: one request each.
//
// A batch lives in the pipeline until finished() (swept at the end of each pass), so the
// callbacks it hands to the master port and the data plane may refer to it. Everything runs on
// the service thread; callbacks may arrive before the call that caused them returned (embedded
// master), so a batch sets up its state before each call.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data_moves.h"
#include "master_messages.h"
#include "pipeline_context.h"
#include "process_memory.h"
#include "scratch_pool.h"

namespace kvagent::agent {

class ClientValue;  // client_values.h

class Batch {
 public:
  Batch(PipelineContext& ctx, MasterMessages& messages, std::vector<HeldRequest> requests);
  virtual ~Batch() = default;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // Sends the first master call.
  virtual void Start() = 0;
  // The client left: its requests get no answer, no bytes go into its arena, and its writes
  // not yet ended are revoked.
  void ClientGone(ClientId client);
  bool finished() const { return finished_; }
  // Its requests, once finished (the caller reuses their buffer).
  std::vector<HeldRequest> TakeRequests() { return std::move(requests_); }

 protected:
  // Answers every request whose client is still there and marks the batch finished.
  void CompleteAll();
  // Every request fails with `status` (e.g. MASTER_UNAVAILABLE), then CompleteAll.
  void FailAll(const Status& status);
  // Counts a master call for `op` carrying `keys` keys.
  void CountCall(proto::Op op, size_t keys);
  // The key order of the batch: every key of every request, by original position.
  void CollectKeys();
  HeldRequest& held(KeyRef k) { return requests_[k.request]; }
  // Key `k` fails with TIMEOUT because its caller's deadline passed; `skipped` says what was not
  // done. Counted in agent.expired_keys.
  void FailExpired(KeyRef k, std::string_view skipped);

  PipelineContext& ctx_;
  MasterMessages& messages_;
  std::vector<HeldRequest> requests_;
  std::vector<KeyRef> keys_;
  bool finished_ = false;
  PhaseTimer phase_;  // put/get phase latencies (phase_latency.h)
};

class WriteBatch final : public Batch {
 private:
  enum KeyState : uint8_t { kNotStarted, kStarted, kFailed };  // kFailed: started, not ended
  // One part of a started key: its checksum, how many replicas it has and how many failed.
  struct PartWrite {
    uint32_t checksum = 0;
    uint8_t replicas = 0;
    uint8_t failures = 0;
  };
  // A peer replica being written, parallel to remote_'s ops.
  struct RemoteReplica {
    uint32_t part_index;  // into parts_
    uint32_t part;
    uint32_t pool_id;
  };
  struct FailedWrite {
    uint32_t key;  // batch key position
    uint32_t part;
    uint32_t pool_id;
  };

 public:
  // The containers of Recycled(), kept between batches (scratch_pool.h).
  using Scratch = std::tuple<std::vector<KeyRef>, std::vector<ReplicaPlace>, std::vector<KeyState>,
                             std::vector<uint64_t>, std::vector<uint32_t>, std::vector<PartWrite>,
                             std::vector<RemoteReplica>, std::vector<FailedWrite>,
                             std::vector<KeyRef>, std::vector<uint64_t>, std::vector<uint32_t>,
                             std::vector<uint32_t>, std::vector<mfb::FailedReplica>,
                             std::vector<KeyRef>, std::vector<uint64_t>, PoolTable>;

  // `spares` (may be null): where its containers come from and go back to.
  WriteBatch(PipelineContext& ctx, MasterMessages& messages, bool upsert,
             std::vector<HeldRequest> requests, ScratchPool<Scratch>* spares = nullptr);
  void Start() override;

 private:
  auto Recycled() {
    return std::tie(keys_, places_, state_, write_ids_, first_part_, parts_, remote_parts_, failed_,
                    to_end_, end_ids_, end_part_counts_, end_checksums_, end_failed_, to_revoke_,
                    revoke_ids_, pools_);
  }
  void OnStarted(Result<std::span<const uint8_t>> reply);
  // A put whose every key has a reserved write (write_reservations.h): copies at once, then
  // one BatchPutCommit. False: none were taken, the batch starts its writes at the master.
  // `now`: when the batch started.
  bool StartReserved(std::chrono::steady_clock::time_point now);
  // `writes`: the batch's hold on the pool fence (LocalWritesOf), released before the batch
  // tells the master anything (Finish, or the data plane's callback).
  void CopyKey(uint32_t key, std::span<const ReplicaPlace> placements, const PoolTable& pools,
               transfer::PoolFence::LocalWrites& writes);
  static void EndLocalWrites(transfer::PoolFence::LocalWrites& writes);
  void ReplicaFailed(uint32_t key, uint32_t part_index, uint32_t part, uint32_t pool,
                     const Status& why);
  void FailCopy(uint32_t key, const Status& why);
  void OnMoved(std::span<const uint32_t> keys, std::span<const Status> results);
  bool Expire(uint32_t key, std::chrono::steady_clock::time_point now, std::string_view skipped);
  bool MayNotCopy(uint32_t key, std::chrono::steady_clock::time_point now);
  void Finish();
  MasterPort::Clock::time_point EndRetryUntil(MasterPort::Clock::time_point now) const;
  void OnFinished(bool end, Result<std::span<const uint8_t>> reply);

  const bool upsert_;
  bool reserved_ = false;             // its writes were reserved ahead (commit instead of End)
  uint64_t epoch_ = 0;                // the master that placed the batch
  std::vector<ReplicaPlace> places_;  // scratch: one key's placements
  PoolTable pools_;  // scratch of OnStarted: its reply's pools (endpoints view the reply)
  std::vector<KeyState> state_;
  std::vector<uint64_t> write_ids_;   // per key
  std::vector<uint32_t> first_part_;  // per key + 1: its parts are parts_[first_part_[k] ..)
  std::vector<PartWrite> parts_;
  std::vector<RemoteReplica> remote_parts_;
  std::vector<FailedWrite> failed_;
  std::unordered_map<uint32_t, Status> first_failure_;  // per key with a failed replica
  RemoteMoves remote_;
  // Parts of process-memory values staged for peers (client_values.h), until the data plane is
  // done with them.
  std::vector<std::unique_ptr<ProcessMemory::ScratchRange>> peer_scratch_;
  std::vector<KeyRef> to_end_;
  std::vector<uint64_t> end_ids_;
  std::vector<uint32_t> end_part_counts_;
  std::vector<uint32_t> end_checksums_;
  std::vector<mfb::FailedReplica> end_failed_;
  std::vector<KeyRef> to_revoke_;
  std::vector<uint64_t> revoke_ids_;
  int finishing_ = 0;  // End/Revoke calls not answered yet
  Status finish_error_;
  ScratchLease<Scratch> recycled_;  // last: lends the members of Recycled()
};

class ReadBatch final : public Batch {
 public:
  struct Replica;
  struct PartRead;
  // The containers of Recycled(), kept between batches (scratch_pool.h).
  using Scratch = std::tuple<std::vector<KeyRef>, std::vector<uint64_t>, std::vector<uint8_t>,
                             std::vector<PartRead>, std::vector<Replica>,
                             std::vector<BadReplicaReport>, PoolTable, std::vector<Replica>>;

  // `spares` (may be null): where its containers come from and go back to.
  ReadBatch(PipelineContext& ctx, MasterMessages& messages, std::vector<HeldRequest> requests,
            ScratchPool<Scratch>* spares = nullptr);
  void Start() override;

  // A replica of a part, as a reader may try it.
  struct Replica {
    std::string endpoint;  // empty: this node's pool
    uint64_t offset = 0;
    uint64_t incarnation = 0;
    uint32_t pool_id = 0;
  };
  // A part to read: where it goes, what it must checksum to, and the replicas left to try.
  struct PartRead {
    uint32_t key = 0;
    uint32_t part = 0;
    uint8_t* dst = nullptr;  // where a peer's bytes land (the arena, or the peer scratch)
    uint64_t at = 0;         // the part's offset in the value
    uint64_t length = 0;
    uint32_t checksum = 0;
    bool checksummed = false;
    bool corrupt_seen = false;  // some replica's bytes failed the checksum
    bool failed_seen = false;   // some replica could not be read at all
    bool rereading = false;     // the peer read in flight reads a replica again (read_batch.cc)
    // Bytes that failed the checksum were read after the read lease may have run out: the value
    // may have been replaced meanwhile, so they say nothing about the replica (read_batch.cc).
    bool outlived_lease = false;
    // Why replicas the master listed were left out (this node's pool as another incarnation or
    // master epoch placed it, a peer without an endpoint): said when no replica is left.
    Status unusable;
    std::vector<Replica> left;  // in the order to try them
    // Process memory: the peer scratch range `dst` points into (client_values.h), else null.
    std::shared_ptr<ProcessMemory::ScratchRange> scratch;
  };

 private:
  auto Recycled() {
    return std::tie(keys_, versions_, copied_, reads_, tried_, bad_, pools_, spare_left_);
  }
  void OnPlaced(Result<std::span<const uint8_t>> reply);
  void CopyKey(uint32_t key, uint64_t size, const mfb::PlacementReply& reply,
               const PoolTable& pools);
  // The pool range of the first local replica of key `key`'s first part (empty when none).
  PrefetchRange LocalFirstPart(uint32_t key, const mfb::PlacementReply& reply,
                               const PoolTable& pools) const;
  // Reads the part from its next replica: at once from this node's pool, or queued as a peer
  // read (then `read` is moved into reads_). When none is left the key fails.
  void ReadPart(PartRead& read);
  // The CRC of a local copy of `read` that did not match, taken again from the pool's bytes
  // (see read_batch.cc); `crc` as it was otherwise.
  uint32_t Rechecked(const PartRead& read, const Replica& local, const ClientValue& target,
                     uint32_t crc) const;
  // The bytes of `read` (from `replica`) are in the buffer: true when they match the checksum;
  // otherwise the replica is reported and counted, unless they were read after the read lease
  // may have run out (then `read.outlived_lease`, and nobody is blamed).
  bool Verified(PartRead& read, const Replica& replica, uint32_t crc);
  // The key of `read` still wants its bytes: its client is there and has not given up.
  bool Alive(const PartRead& read, std::chrono::steady_clock::time_point now);
  // Bytes in the buffer at `now` were read under the read lease: it was granted after the
  // BatchGet was sent, so it lasts at least until sent_at_ + lease_ on this node's clock.
  bool UnderLease(std::chrono::steady_clock::time_point now) const {
    return now - sent_at_ <= lease_;
  }
  // Reads `replica`, whose bytes from a peer just failed their checksum (`crc`), once more.
  void RereadPeer(PartRead& read, Replica replica, uint32_t crc);
  void PartFailed(const PartRead& read, const Status& last);
  void FailKey(uint32_t key, const Status& why);
  void DeliverPeerRead(const PartRead& read);
  void OnMoved(std::span<const uint32_t> keys, std::span<const Status> results,
               std::span<const transfer::ReceivedChecksum> received);
  void Finish();

  std::chrono::steady_clock::time_point sent_at_;
  std::chrono::milliseconds lease_{0};
  uint64_t epoch_ = 0;
  std::vector<uint64_t> versions_;  // per key: the object's version (for bad-replica reports)
  std::vector<uint8_t> copied_;     // per key: bytes were copied into the arena
  PrefetchRange ahead_;             // the next key's local bytes, prefetched by the next copy
  RemoteMoves remote_;
  std::vector<PartRead> reads_;  // parallel to remote_'s ops, in the order they were added
  std::vector<Replica> tried_;   // parallel to reads_: the replica each op reads
  std::vector<BadReplicaReport> bad_;
  PoolTable pools_;  // scratch of OnPlaced: its reply's pools (endpoints view the reply)
  std::vector<Replica> spare_left_;  // scratch of CopyKey: a part's replicas to try
  ScratchLease<Scratch> recycled_;   // last: lends the members of Recycled()
};

// Exist or Remove (all requests with the same `force`).
class KeyBatch final : public Batch {
 public:
  KeyBatch(PipelineContext& ctx, MasterMessages& messages, proto::Op op,
           std::vector<HeldRequest> requests);
  void Start() override;

 private:
  void OnReply(Result<std::span<const uint8_t>> reply);
  const proto::Op op_;
};

// RemoveAll, List or Stat: one request, one (or, for List, a few) master calls.
class SingleCall final : public Batch {
 public:
  SingleCall(PipelineContext& ctx, MasterMessages& messages, HeldRequest request);
  void Start() override;

 private:
  void OnRemoveAll(Result<std::span<const uint8_t>> reply);
  void ListPage();
  void OnListPage(Result<std::span<const uint8_t>> reply);
  void OnStats(Result<std::span<const uint8_t>> reply);
  void OnSessions(Result<std::span<const uint8_t>> reply);

  uint64_t cursor_ = 0;
  uint32_t pages_ = 0;
  uint64_t listed_bytes_ = 0;
};

}  // namespace kvagent::agent

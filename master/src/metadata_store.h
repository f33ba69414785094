// MetadataStore: the master's state and the one funnel through which it changes.
//
// Holds agents, their pools (with allocators), objects (with replicas, session tags, block
// metadata, leases, pins) and the interned tag table. Its mutators are the only code that
// changes that state; each one that changes what must survive a restart appends one record to
// the operation log, and each transition of an object between readable and unreadable emits
// its KV event here, so no path can forget either:
//   readable   -> emitted BlockStored  (CommitWrite)
//   unreadable -> emitted BlockRemoved (RemoveObject, BeginRewrite, DropAgent, ClearAll)
// Invariant: the set of objects with `readable` equals the set announced by the event stream
// (AllBlocksCleared at start, then Stored/Removed pairs), so an index fed by the stream equals
// the key set at every quiet point.
//
// Private to master/: MasterService applies request policy on top of it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "forked_writer.h"
#include "kvagent/events/kv_event.h"
#include "kvagent/master/oplog.h"
#include "kvagent/master/pool_allocator.h"
#include "kvagent/master/session_tags.h"
#include "kvagent/master/types.h"
#include "object_table.h"
#include "placement_index.h"
#include "replication_log.h"

namespace kvagent::master {

struct StoredBlockMeta {
  std::vector<events::BlockHash> block_hashes;
  std::optional<events::BlockHash> parent_block_hash;
  std::vector<uint32_t> token_ids;
  uint32_t block_size = 0;
  std::optional<std::string> lora_name;
  // nullptr when `view` is empty: objects without metadata pay one null pointer.
  static std::unique_ptr<StoredBlockMeta> From(const BlockMetaView& view);
};

// A replica of one part: where it lives, and the part's checksum. 24 bytes (at a million keys
// every byte is a megabyte): a part is at most kMaxPartBytes, so its length fits 32 bits; whether
// the checksum is set is the object's (Object::checksummed).
struct Replica {
  uint32_t part = 0;
  PoolId pool_id = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
  uint32_t checksum = 0;

  static Replica Of(const Placement& p) {
    return {p.part, p.pool_id, p.offset, static_cast<uint32_t>(p.length), p.checksum};
  }
  Placement ToPlacement(bool checksummed) const {
    return {part, pool_id, offset, length, checksum, checksummed};
  }
};
static_assert(sizeof(Replica) == 24);

// An in-flight Put or Upsert. Exists only between *Start and *End/*Revoke (or takeover).
struct PendingWrite {
  AgentId writer = kNoAgent;
  uint64_t write_id = 0;  // unique per master epoch, increasing in start order
  int64_t started_ms = 0;
  TagId tag = kUntagged;  // holds a reference; becomes the object's tag at commit (rule 3)
  WriteOptions options;
  std::unique_ptr<StoredBlockMeta> meta;
};

// One logical object. Its value is split into `parts` parts of at most part_bytes each; every
// part has its own replicas (replicas[] is ordered by part). The parts are children of the
// object, not separate map entries, so they share its tag and options by construction
// (SEMANTICS rule 10). Their internal name, where one is needed (logs), is
// key + '\xFF' + part index: 0xFF never occurs in valid UTF-8, so it cannot be a user key.
//
// Size matters: at 1 M keys every byte here is a megabyte. A single replica (the common case)
// is stored inline; only objects with more replicas or parts allocate an array. Block metadata
// and the in-flight write live behind pointers that are null in the steady state.
struct Object {
  Object() : one_replica() {}
  ~Object() {
    if (replica_total > 1) delete[] many_replicas;
  }
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;

  // Invariant: the replicas live in many_replicas exactly when replica_total > 1.
  Replica* replica_data() { return replica_total > 1 ? many_replicas : &one_replica; }
  const Replica* replica_data() const { return replica_total > 1 ? many_replicas : &one_replica; }
  Replica& replica(uint32_t i) { return replica_data()[i]; }
  const Replica& replica(uint32_t i) const { return replica_data()[i]; }
  // Replaces the replicas with a copy of [r, r + n).
  void AssignReplicas(const Replica* r, uint32_t n);
  // Keeps the first n replicas (the caller compacted the survivors to the front).
  void KeepReplicas(uint32_t n);
  // Parts are numbered 0..parts-1 and replicas are ordered by part.
  uint32_t parts() const { return replica_total ? replica(replica_total - 1).part + 1 : 0; }

  uint64_t size = 0;
  uint64_t version = 0;  // the write id that made the current value (0: restored from a v1 log)
  int64_t lease_until_ms = 0;
  ObjectEntry* prev = nullptr;  // links in the LRU list (readable) or the writing list
  ObjectEntry* next = nullptr;
  union {
    Replica one_replica;
    Replica* many_replicas;
  };
  std::unique_ptr<StoredBlockMeta> meta;
  std::unique_ptr<PendingWrite> pending;  // set exactly while the object is being written
  uint32_t replica_total = 0;
  TagId tag = kUntagged;          // committed tag; a reference is held while readable
  uint32_t soft_pin_until_s = 0;  // soft-pinned while now (in seconds) < this
  uint8_t replicas_per_part = 1;
  bool readable : 1 = false;
  bool hard_pin : 1 = false;
  bool soft_pin : 1 = false;
  bool listed : 1 = false;       // in one of the intrusive lists
  bool checksummed : 1 = false;  // the replicas' checksums are set (written with checksums)
};

// Intrusive doubly linked list of objects (head = oldest).
struct ObjectList {
  ObjectEntry* head = nullptr;
  ObjectEntry* tail = nullptr;
  size_t size = 0;
  void PushBack(ObjectEntry* e);
  void Remove(ObjectEntry* e);
};

struct Pool {
  PoolId id = 0;
  AgentId agent = kNoAgent;
  uint32_t index = 0;
  std::vector<std::string> endpoints;
  PoolAllocator allocator;
  uint32_t slot = PlacementIndex::kNone;  // in MetadataStore's placement index while live
  // Objects with a replica here that this master restored from its log (FinishRestore), until
  // the pool's first mount reports them (MountResult::restored_objects) and clears the count.
  uint64_t restored_objects = 0;
};

// Space of an abandoned write in one agent's pool, kept until that agent has fenced the write
// (refuses its bytes from then on) and acknowledged fence `seq` in a heartbeat.
struct PendingFence {
  uint64_t seq = 0;
  uint64_t write_id = 0;
  std::vector<Replica> replicas;
};

struct Agent {
  AgentId id = kNoAgent;
  std::string name;
  uint64_t incarnation = 0;
  int64_t last_seen_live = 0;  // MetadataStore::LiveNow() when last heard of
  // Silent past the TTL (or restored from the log and not registered again): no new replicas go
  // to its pools and reads list its replicas last; its objects stay until it is dead.
  bool suspect = false;
  // It registered with this master (not only restored from the log): until then its heartbeats
  // are answered "unknown" (register again), and their fence acks, which count the previous
  // master's fences, free nothing.
  bool registered_here = false;
  // The agent key its registration bound (MasterService::RegisterAgent), logged with the agent
  // (so a restart or a failover keeps the binding). key_bound is false for an agent restored
  // from a record written before keys were logged, until it registers here again.
  uint64_t key = 0;
  bool key_bound = false;
  // The incarnation of its name this registration replaced (0: none), logged with it: after a
  // master restart that one is still refused (MasterService::RegisterAgent), as before it.
  uint64_t replaced = 0;
  bool replaced_logged = false;  // a registration of `replaced` was refused and logged
  // The incarnations of its name replaced before `replaced` (what the agent `replaced` held
  // had replaced, and so on back), newest first, at most kReplacedChain - 1: logged with it, so
  // that every clone of a run dir in a chain stays refused across a restart of the master.
  std::vector<uint64_t> replaced_earlier;
  bool replaced_earlier_logged = false;  // a registration of one of them was refused and logged
  bool name_conflict_logged = false;     // a new registration of its name with another key
  bool key_refusal_logged = false;
  std::vector<PoolId> pools;
  std::deque<PendingFence> fences;  // in seq order
  uint32_t reserved_writes = 0;     // reserved writes it holds (ReserveWrites), and their space
  uint64_t reserved_bytes = 0;
};

// Operation-log records as read back (metadata_persist.cc).
struct AgentRecord;
struct PoolRecord;
struct ObjectRecord;

class MetadataStore {
 public:
  // Whether `payload` is an operation-log record this master can replay: every field read and
  // checked as replay does, without the state it would apply to (a standby checks its primary's
  // records before it keeps them). INTERNAL naming what is malformed.
  static Status CheckRecord(std::string_view payload);

  MetadataStore(const MasterOptions& options, const Clock* clock);
  ~MetadataStore();
  MetadataStore(const MetadataStore&) = delete;
  MetadataStore& operator=(const MetadataStore&) = delete;

  // Replays DIR/master.oplog (when options.state_dir is set), compacts it, and announces the
  // start: AllBlocksCleared, then BlockStored for every restored object.
  Status Open();

  // Mutators that write to the operation log reserve room for their records before they change
  // anything; when the log refuses (state dir full or failing) they return false (or
  // LogRefused()) and change nothing. The write to the file happens at FlushLog.
  Status LogRefused() const;
  bool log_writable() const { return !oplog_ || oplog_->writable(); }
  void CountOversized() { ++counters_.oversized_values; }
  // Gives back replicas AllocateReplicas handed out for a write that did not start.
  void FreeAllocated(std::span<const Placement> replicas) {
    for (const Placement& r : replicas) FreeReplica(Replica::Of(r));
  }

  // ---- agents and pools ----
  // Adds an agent bound to agent key `key` (logged with it).
  // `replaced`: the incarnation of the name this registration replaced, and `replaced_earlier`
  // the ones replaced before it (Agent::replaced_earlier; cut to kReplacedChain - 1).
  Result<AgentId> AddAgent(std::string_view name, uint64_t incarnation, uint64_t key,
                           uint64_t replaced = 0, std::vector<uint64_t> replaced_earlier = {});
  // Replaced incarnations of one name an agent record carries (Agent::replaced and
  // Agent::replaced_earlier together).
  static constexpr size_t kReplacedChain = 8;
  Agent* FindAgent(AgentId id);
  const Agent* FindAgent(AgentId id) const;
  Agent* FindAgentByName(std::string_view name);
  Result<MountResult> MountPool(AgentId agent, uint32_t index, uint64_t size,
                                std::vector<std::string> endpoints);
  const Pool* FindPool(PoolId id) const;
  // The agent is alive now (heartbeat, registration, mount): a suspect agent is trusted again.
  void Touch(Agent* a);
  // Drops an agent: its pools go, replicas in them are invalidated, objects left without
  // a replica of some part are removed (BlockRemoved) and writes into them are aborted.
  [[nodiscard]] bool DropAgent(AgentId id);
  // The fences the agent must apply (heartbeat reply), after freeing the space of those it has
  // acknowledged (`acked` = the highest fence seq it applied).
  HeartbeatResult Fences(Agent* a, uint64_t acked);

  // ---- objects ----
  ObjectEntry* Find(std::string_view key);
  // f(i, Find(keys[i])) for every key, in order, with the lookups' cache misses overlapped
  // (ObjectTable::FindEach). f must not add or remove objects.
  template <typename F>
  void FindEach(std::span<const std::string_view> keys, F&& f) {
    objects_.FindEach(
        keys.size(), [&](size_t i) { return keys[i]; }, std::forward<F>(f));
  }
  // Allocates replicas for a value of `size` bytes (eviction + one retry on no room). Returns
  // false when not even one replica per part fits.
  bool AllocateReplicas(AgentId writer, uint64_t size, uint8_t replicas_per_part,
                        std::vector<Placement>* out);
  // The entry of `key`; inserts an empty one (second = true) when there is none. An empty
  // entry must be turned into a write (CreateWrite) or erased (EraseFresh) before the request
  // ends: nothing else may see it.
  std::pair<ObjectEntry*, bool> FindOrInsert(std::string_view key);
  void EraseFresh(ObjectEntry* e);
  // A new write id (PendingWrite::write_id).
  uint64_t NewWriteId() { return next_write_id_++; }
  // Turns a fresh entry into an object being written (not readable, no event, not persisted).
  void CreateWrite(ObjectEntry* e, uint64_t size, const std::vector<Placement>* replicas,
                   std::unique_ptr<PendingWrite> pending);
  // Starts rewriting a readable object (upsert): it becomes unreadable (BlockRemoved; the log
  // records the removal since its bytes are about to change). `replicas` == nullptr: in place.
  [[nodiscard]] bool BeginRewrite(ObjectEntry* e, uint64_t size,
                                  const std::vector<Placement>* replicas,
                                  std::unique_ptr<PendingWrite> pending);
  // Takes over a timed-out write: its replicas are fenced (the old writer may still be
  // writing), then the new write starts in new replicas.
  void TakeOverWrite(ObjectEntry* e, uint64_t size, const std::vector<Placement>* replicas,
                     std::unique_ptr<PendingWrite> pending);
  // Makes a written object readable: commits tag, metadata, options, the parts' checksums
  // (`checksums` has one per part, or is empty: not checksummed) and its version; drops the
  // replicas in `failed` (parts and pools the writer could not write; they are fenced)
  // first. BlockStored. False when the log refused (nothing changed).
  [[nodiscard]] bool CommitWrite(ObjectEntry* e, std::span<const uint32_t> checksums,
                                 std::span<const FailedReplica> failed);
  // ---- reserved writes (ReserveWrites / BatchPutCommit) ----
  // A reserved write is a write in flight (PendingWrite, in the writing list, fenced and
  // expired like any) whose entry has no user key yet: its table key starts with 0xFF, which
  // no valid UTF-8 key does.
  static std::string ReservedKey(uint64_t write_id);
  static bool IsReservedKey(std::string_view key) {
    return !key.empty() && static_cast<uint8_t>(key[0]) == 0xFF;
  }
  // Places a reserved write of `size` bytes for `writer` (a registered agent, as FindAgent gives
  // it), started at `now_ms`, without evicting anything; returns its entry (the write id in its
  // pending write), or nullptr when it does not fit.
  const ObjectEntry* Reserve(Agent& writer, uint64_t size, uint8_t replica_count, int64_t now_ms);
  // Binds reserved write `r` to entry `e` (fresh, or a write of another agent past the put
  // timeout, which is taken over: its replicas are fenced) for a value of `size` bytes, at most
  // r's: its parts are filled in order (ReservedLayout) and the space past the value goes back
  // at once (nothing was written there). `r`'s entry is erased; `e` is then a write in flight
  // with r's write id, ready for CommitWrite.
  void BindReservation(ObjectEntry* r, ObjectEntry* e, uint64_t size);
  // Abandons a write: its replicas are fenced (freed once their pools refuse the write) and
  // the object erased. No event: it was not readable.
  void AbortWrite(ObjectEntry* e);
  // Removes a readable object (remove, eviction): BlockRemoved, frees replicas, erases it.
  [[nodiscard]] bool RemoveObject(ObjectEntry* e);
  // Drops the replica of `part` in `pool` of a readable object whose bytes a reader found
  // corrupt; the object goes too (BlockRemoved) when that was its part's last replica.
  [[nodiscard]] bool DropReplica(ObjectEntry* e, uint32_t part, PoolId pool);
  // Removes every readable object that is unleased (or all readable ones with `force`):
  // AllBlocksCleared, then BlockStored for each readable survivor. Returns how many went.
  Result<uint64_t> ClearAll(bool force);
  // Read path: grants (extends) a lease and marks the object recently used.
  void GrantLease(ObjectEntry* e, int64_t ttl_ms);

  // ---- periodic work (MasterService::Tick) ----
  // Advances the live clock (LiveNow), crediting at most max_tick_gap_ms of a gap since the
  // last call: a master that did not run does not blame its agents for the silence.
  void AdvanceLiveClock();
  // Agents silent past the TTL become suspect; past the dead timeout they are dropped.
  void ExpireAgents();
  void ExpireWrites();
  // Retries a refusing state dir; compacts the log when it has grown enough.
  void MaintainLog();
  // Evicts unleased objects in LRU order (unpinned, then soft-pinned; never hard-pinned)
  // until bytes used <= target. Returns objects evicted.
  uint64_t EvictTo(uint64_t target_bytes_used);
  void EvictByWatermark();

  // ---- views ----
  // The readable replicas of `o` for a reader, each part's replicas on healthy agents first.
  void AppendReadPlacements(const Object& o, std::vector<Placement>* out) const;
  // Milliseconds of the master's own running time (see AdvanceLiveClock).
  int64_t LiveNow() const;
  int64_t TickCredit() const;
  const ObjectTable& objects() const { return objects_; }
  SessionTags& tags() { return tags_; }
  const std::map<PoolId, Pool>& pools() const { return pools_; }
  uint64_t bytes_used() const;
  uint64_t bytes_capacity() const;
  MasterStats stats() const;
  uint64_t part_bytes() const { return part_bytes_; }
  int64_t now() const { return clock_->NowMs(); }
  const MasterOptions& options() const { return options_; }

  // The BlockStored a readable object is announced with (at commit, and in ListKeys).
  events::BlockStored StoredEvent(const ObjectEntry& e) const;

  // Events emitted since the last call, in order.
  std::vector<events::KvEvent> TakeEvents();
  void TakeEvents(std::vector<events::KvEvent>* out) {
    out->clear();
    out->swap(events_);
  }
  // Room for n more events (one allocation per batch instead of regrowth).
  void ReserveEvents(size_t n) {
    if (events_.capacity() - events_.size() < n) {
      events_.reserve(std::max(2 * events_.capacity(), events_.size() + n));  // geometric
    }
  }
  // Writes buffered log records out (end of every request). A failure to write records the
  // request has already applied in memory is fatal: kvmaster exits (the log holds everything
  // acknowledged before), since memory must never run ahead of the log.
  Status FlushLog();
  // The records a standby needs after `after_seq` (or, with `snapshot` or when the log no longer
  // holds them, the whole committed state). See ReplicationPage.
  // With `background`, a snapshot is built by a child process (ForkedWriter) while the loop goes
  // on: the page is `pending` until it is done, and the built snapshot then serves every
  // follower that can continue from it (for a minute); where no child can start, or the last
  // one failed, it is built at once as without.
  void ReadReplication(uint64_t after_seq, bool snapshot, size_t max_bytes, ReplicationPage* out,
                       bool background = false);
  // Whether a snapshot is being built in the background (polls the child: false once it ended).
  bool SnapshotBuilding();
  // Periodic: a built snapshot older than a minute is dropped (its memory).
  void ExpireBuiltSnapshot();
  bool replicating() const { return replication_.enabled(); }
  uint64_t replication_last_seq() const { return replication_.last_seq(); }

 private:
  void EmitStored(const ObjectEntry& e);
  void EmitRemoved(const ObjectEntry& e);
  void FreeReplicas(const Object& o);
  void FreeReplica(const Replica& r);
  // Every change to a pool's free space goes through these three: they keep the placement
  // index current (it orders the live pools by free bytes).
  std::optional<uint64_t> AllocateIn(Pool& pool, uint64_t length);
  bool AllocateAtIn(Pool& pool, uint64_t offset, uint64_t length);
  void FreeIn(Pool& pool, uint64_t offset, uint64_t length);
  // Keeps `replicas` of write `write_id` until their pools' agents fenced the write.
  void Fence(uint64_t write_id, std::span<const Replica> replicas);
  void SetSuspect(Agent& a, bool suspect);
  void RefreshCandidates();
  bool ReserveLog(uint64_t payload_bytes, uint64_t records);
  void EncodeObject(std::string_view key, const Object& o, TagId tag, const PendingWrite* w,
                    std::span<const Replica> replicas, bool checksummed, std::string* out) const;
  void SetReplicas(Object& o, uint64_t size, const std::vector<Placement>* replicas);
  bool SoftPinned(const Object& o) const;
  void Erase(ObjectEntry* e);
  void Unlist(ObjectEntry* e);
  // A reserved write leaves its agent's count (bound to a key, or abandoned).
  void Unreserve(const ObjectEntry& r);
  void RefreshPartBytes();
  bool TryAllocate(AgentId writer, uint64_t size, uint8_t replicas_per_part,
                   std::vector<Placement>* out);
  // Operation log.
  void LogAgent(const Agent& a);
  void LogPool(const Pool& s);
  void LogAgentDropped(AgentId id);
  void LogObject(const ObjectEntry& e);
  void LogRemoved(std::string_view key);
  static uint64_t RemovedRecordBytes(std::string_view key) { return 5 + key.size(); }
  Status ApplyRecord(std::string_view payload);
  // One step per record type, of a record ApplyRecord has parsed and checked.
  void ApplyAgent(const AgentRecord& record);
  void ApplyPool(PoolRecord& record);
  void ApplyAgentGone(AgentId id);
  void ApplyRemoved(std::string_view key);
  void ApplyObject(ObjectRecord& record);
  void FailStop(const Status& st);
  void FinishRestore();
  void WriteSnapshot();
  bool StartSnapshotBuild();
  // A built snapshot a follower can continue from, into `out` (false: none).
  bool TakeBuiltSnapshot(ReplicationPage* out);
  // The end of a compaction (`st`: its outcome), for the counters and the log.
  void FinishCompaction(const Status& st, std::chrono::steady_clock::time_point started,
                        const char* how);
  bool ShouldLog() const;
  void AppendRecord();

  MasterOptions options_;
  const Clock* clock_;
  std::map<AgentId, Agent> agents_;
  std::map<PoolId, Pool> pools_;
  std::vector<Pool*> live_pools_;  // placement candidates: pools of healthy agents
  PlacementIndex placement_;       // the same pools, best first (TryAllocate)
  // The same pools by agent (sorted by agent id): a writer's own pools without a scan of all.
  std::vector<std::pair<AgentId, Pool*>> live_pools_by_agent_;
  AgentId next_agent_id_ = 1;
  PoolId next_pool_id_ = 1;
  uint64_t next_write_id_ = 1;
  // How far a restored master's write ids skip past the highest one its log names: more than a
  // master starts between two commits (2^40: 12 days of a million writes a second).
  static constexpr uint64_t kWriteIdGapAfterRestore = uint64_t{1} << 40;
  // Fence seqs come from one counter for all agents, never per agent: an agent dropped and
  // registered again under a new id may still acknowledge the seqs of its old registration, and
  // such an ack must not cover (free unapplied) a fence of the new one.
  uint64_t next_fence_seq_ = 1;
  uint64_t suspects_ = 0;
  uint64_t capacity_ = 0;        // the size of all pools (RefreshPartBytes)
  int64_t live_ms_ = 0;          // the live clock at live_mark_ms_
  int64_t live_mark_ms_ = 0;     // now() at the last AdvanceLiveClock
  uint64_t snapshot_bytes_ = 0;  // the log's size after its last compaction
  uint64_t compacted_from_ = 0;  // the log's size when the running compaction started
  // A follower's snapshot: being built by a child into a memfd, then built (records as
  // ReplicationPage holds them, the state after record `last_seq`).
  struct SnapshotBuild {
    std::unique_ptr<ForkedWriter> child;
    int fd = -1;
    uint64_t last_seq = 0;
  };
  struct BuiltSnapshot {  // the child's memfd, mapped (read only)
    BuiltSnapshot() = default;
    BuiltSnapshot(const BuiltSnapshot&) = delete;
    BuiltSnapshot& operator=(const BuiltSnapshot&) = delete;
    ~BuiltSnapshot();
    const char* map = nullptr;
    size_t size = 0;
    uint64_t last_seq = 0;
    int64_t built_ms = 0;
  };
  std::unique_ptr<SnapshotBuild> snapshot_build_;
  // Shared with the transports still sending it to followers (ReplicationPage::shared_owner).
  std::shared_ptr<const BuiltSnapshot> built_snapshot_;
  bool snapshot_on_loop_ = false;  // the last background build failed: the next one is not
  std::chrono::steady_clock::time_point compaction_started_{};
  int64_t next_compaction_ms_ = 0;
  uint64_t part_bytes_ = 0;
  ObjectTable objects_;
  ObjectList lru_;      // readable, not hard-pinned; head = least recently used
  ObjectList writing_;  // being written; head = oldest start
  SessionTags tags_;
  std::vector<events::KvEvent> events_;
  std::unique_ptr<OpLog> oplog_;
  ReplicationLog replication_{options_.replication_log_bytes};
  std::string record_;  // scratch for one log record
  std::vector<Replica> scratch_replicas_;
  std::vector<Placement> scratch_placements_;  // Reserve's
  // While compacting: where records go instead of the live log.
  const std::function<void(std::string_view)>* snapshot_sink_ = nullptr;
  bool restoring_ = false;
  MasterStats counters_;
};

}  // namespace kvagent::master

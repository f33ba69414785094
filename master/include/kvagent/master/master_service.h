// MasterService: the cluster metadata service as a typed, single-threaded C++ API.
//
// One object, owned by one thread: kvmaster's ROUTER thread, or the agent's request thread in
// `kvagent --standalone`. Batches come in as spans (views into the caller's request; nothing
// is copied per key beyond what is stored) and go out as per-key results in reusable
// containers. Semantics are those of docs/semantics.md: objects become readable at
// PutEnd, duplicate puts answer OBJECT_ALREADY_EXISTS, timed-out puts can be taken over, upserts
// rewrite in place or resized, reads take leases, eviction runs at the watermarks, agents that
// stop heartbeating are dropped. Session IDs follow the eleven attribution rules.
//
// KV events (docs/events.md) are produced in order and collected with TakeEvents(); the owner hands
// them to its EventPublisher after each request, so publishing never blocks a request. The first
// events of a new service are AllBlocksCleared and, after a restore, one BlockStored per
// restored object. Time comes from the injected Clock; periodic work runs in Tick().
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvagent/common/status.h"
#include "kvagent/events/kv_event.h"
#include "kvagent/master/types.h"

namespace kvagent::master {

class MetadataStore;
struct Agent;
struct Object;
using ObjectEntry = std::pair<const std::string, Object>;

class MasterService {
 public:
  // Creates the service; with options.state_dir set, replays and compacts the operation log
  // there first. `clock` must outlive the service. Fails when the options are inconsistent or
  // the state directory is unusable.
  static Result<std::unique_ptr<MasterService>> Open(MasterOptions options, const Clock* clock);
  ~MasterService();
  MasterService(const MasterService&) = delete;
  MasterService& operator=(const MasterService&) = delete;

  // Registers an agent by its stable name and process incarnation; returns its id. The same
  // name and incarnation again (e.g. after a master restart) returns the same agent with its
  // pools; a new incarnation drops the previous one (replicas invalidated, with events).
  // An incarnation a newer one replaced is refused (INVALID_PARAMS, counted in
  // name_conflicts) while an agent holds its name: it is a second live process under that name
  // (or one replaced while cut off), and taking the name back would drop the other's objects,
  // and the other's next registration this one's, over and over. This master remembers the
  // last kMaxReplacedIncarnations replaced ones; the one each agent's registration replaced is
  // also logged with the agent, so it stays refused across a restart or failover of the master.
  // `key` (master.fbs RegisterAgent.agent_key; an agent keeps it in its run dir across
  // restarts) is bound to the agent and logged with it, so the binding outlives a restart or a
  // failover of the master: the same name and incarnation with another key is refused
  // (INVALID_PARAMS, counted in agent_key_refusals), and calls for the agent must carry it
  // (CheckAgentKey). A new incarnation with another key is refused (INVALID_PARAMS, counted in
  // name_conflicts) while the agent holding the name was heard within the agent TTL; past it,
  // it takes the name over as a restart (an agent whose run dir was lost). A bound key 0 (an
  // agent of a build before the key) protects nothing. An agent restored from a log written
  // before keys were logged binds its key at its next registration.
  Result<AgentId> RegisterAgent(std::string_view name, uint64_t incarnation, uint64_t key = 0);
  // OK when a call that names `agent` and carries `key` may act for it: the agent is unknown
  // (the call itself then says so), has no key bound yet (restored from an older log), or is
  // bound to `key`. Otherwise INVALID_PARAMS, counted in agent_key_refusals and logged once per
  // agent.
  Status CheckAgentKey(AgentId agent, uint64_t key);
  uint64_t agent_key_refusals() const { return agent_key_refusals_; }
  static constexpr size_t kMaxReplacedIncarnations = 1024;

  // Mounts the agent's pool `index` of `size` bytes reachable at `endpoints`. Mounting the same
  // index and size again keeps the pool id and any replicas the log restored in it.
  Result<MountResult> MountPool(AgentId agent, uint32_t index, uint64_t size,
                                std::span<const std::string_view> endpoints);

  // Records that the agent is alive (a suspect agent is trusted again). Returns false when the
  // master does not know it (dropped or restarted without state): the agent must register and
  // mount again.
  bool Heartbeat(AgentId agent);
  // The same, also acknowledging the fences the agent applied (`fence_ack`: the highest
  // HeartbeatResult::fence_seq it applied; their space is freed now) and returning the fences
  // it must apply next.
  HeartbeatResult Heartbeat(AgentId agent, uint64_t fence_ack);

  // Allocates replicas for each key. Returns a request-level error (and that error for every
  // key in out->results) when the batch is invalid: unknown agent, array lengths that disagree,
  // a bad key, session ID or block metadata, a zero size. Otherwise OK with per-key results:
  // OK + placements + out->write_ids, OBJECT_ALREADY_EXISTS (readable, or written less than the
  // put timeout ago), NO_SPACE (also for a value larger than the high-watermark share of all
  // pools, which eviction would remove at once), MASTER_UNAVAILABLE when the operation log
  // refuses the change (state dir full).
  Status BatchPutStart(const WriteStartRequest& request, PlacementBatch* out);
  // Makes each key readable (BlockStored) and commits its session tag, its parts' checksums
  // and its version (the write id). OBJECT_NOT_FOUND when no write is in flight (or the write
  // named by write_ids was taken over or abandoned), INVALID_PARAMS when another agent started
  // it, when the checksums do not match its parts, or when `failed` leaves a part without a
  // replica (revoke it instead); ending twice is OK. out->replicas: how many replicas each key
  // kept (of its part with the fewest).
  Status BatchPutEnd(const WriteEndRequest& request, KeyResults* out);
  Status BatchPutEnd(AgentId agent, std::span<const std::string_view> keys, KeyResults* out);
  // Abandons each key's write (the one named in write_ids, when given): its replicas are freed
  // once their pools have fenced the write; no object and no tag stay behind. Revoking a write
  // that is no longer in flight is OK.
  Status BatchPutRevoke(AgentId agent, std::span<const std::string_view> keys,
                        std::span<const uint64_t> write_ids, KeyResults* out);
  Status BatchPutRevoke(AgentId agent, std::span<const std::string_view> keys, KeyResults* out);

  // Like BatchPutStart, but an existing object is rewritten: same size in place, otherwise in
  // new replicas. The object is unreadable (BlockRemoved) until UpsertEnd (BlockStored).
  // OBJECT_BUSY while a read lease or another recent write holds the key. A non-empty session
  // ID replaces the object's tag; an empty one keeps it.
  Status BatchUpsertStart(const WriteStartRequest& request, PlacementBatch* out);
  Status BatchUpsertEnd(const WriteEndRequest& request, KeyResults* out);
  Status BatchUpsertEnd(AgentId agent, std::span<const std::string_view> keys, KeyResults* out);
  // A revoked upsert leaves no object (its old value was already overwritten or freed).
  Status BatchUpsertRevoke(AgentId agent, std::span<const std::string_view> keys,
                           std::span<const uint64_t> write_ids, KeyResults* out);
  Status BatchUpsertRevoke(AgentId agent, std::span<const std::string_view> keys, KeyResults* out);

  // Reserved writes (one master round trip per put): first abandons the `returned` reserved
  // writes of this agent (fenced, like a revoke), then places up to `count` writes of `size`
  // bytes with replica_count replicas per part, as a put's would be (the writer's pool first),
  // not bound to any key. Fewer (even none) when the pools lack room below the high watermark
  // (reservations never evict) or the agent holds its share already (kMaxReservedWritesPerAgent
  // writes, 1/kReservedShareDivisor of all pools). out: per reserved write, OK, its placements
  // and its write id; out->lease_ttl_ms: each is abandoned like a write in flight when not
  // committed within this (options().put_release_timeout_ms). INVALID_PARAMS for a bad size, count
  // or replica count; AGENT_UNAVAILABLE for an unknown agent.
  Status ReserveWrites(const ReserveWritesRequest& request, PlacementBatch* out);
  // A put of each key into a reserved write of this agent: BatchPutStart's checks and session
  // rules, then BatchPutEnd's commit, in one call. A value may be smaller than its reserved
  // write: it fills the reserved parts in order (each part up to its length; the parts it does
  // not reach are dropped), as the writer copied it, and the rest of the space is freed. Per key:
  // OK (readable, BlockStored; its replicas count in out->replicas), OBJECT_ALREADY_EXISTS (stored
  // or being written: the reserved write is abandoned), MASTER_UNAVAILABLE when the reserved write
  // is unknown here (abandoned, expired, or reserved by another master: nothing is stored; put
  // again), or the End's errors. Committing the same key and reserved write twice is OK, also when
  // the first commit reached the log of a master that went down and this one restored it.
  // Otherwise, when request.master_epoch is not this master's epoch, each key is
  // MASTER_UNAVAILABLE.
  Status BatchPutCommit(const WriteCommitRequest& request, KeyResults* out);

  // Readable replicas of every part of each key, in part order (within a part, replicas on
  // suspect agents last), with the parts' checksums, each key's version in out->write_ids, and
  // a read lease of out->lease_ttl_ms. OBJECT_NOT_FOUND, or REPLICA_NOT_READY while being
  // written.
  Status BatchGet(std::span<const std::string_view> keys, PlacementBatch* out);
  // A reader's agent found these replicas' bytes not matching their checksums: each is dropped
  // when the object still has the version the reader saw (and the object too, with
  // BlockRemoved, when that was its part's last replica). Per key: OK (dropped or already
  // gone), MASTER_UNAVAILABLE when the log refuses.
  Status ReportBadReplicas(std::span<const BadReplica> replicas, KeyResults* out);
  // out->exists[i] is 1 when key i is readable. Grants no lease.
  Status BatchExist(std::span<const std::string_view> keys, KeyResults* out);
  // Removes each key (BlockRemoved). OBJECT_HAS_LEASE when leased and not `force`,
  // REPLICA_NOT_READY while being written, OBJECT_NOT_FOUND.
  Status BatchRemove(std::span<const std::string_view> keys, bool force, KeyResults* out);
  // Removes every readable object (leased ones only with `force`); AllBlocksCleared, then
  // BlockStored for each survivor. Returns how many were removed.
  Result<uint64_t> RemoveAll(bool force);

  // One page of readable objects (see master.fbs ListKeys for the cursor contract), keeping only
  // keys that start with `prefix` (the page still covers about `limit` hash slots, so a
  // filtered page may be empty while next_cursor is not 0).
  Status ListKeys(uint64_t cursor, uint32_t limit, ListPage* out,
                  std::string_view prefix = {}) const;

  // Where a pool is: its agent and data endpoints. nullopt when not mounted.
  struct PoolView {
    PoolId id = 0;
    AgentId agent = kNoAgent;
    uint64_t incarnation = 0;  // the pool's: its agent's process incarnation
    std::span<const std::string> endpoints;
  };
  std::optional<PoolView> FindPool(PoolId id) const;

  // The committed session ID of `key` ("" when untagged or not committed yet), or nullopt
  // when the key is unknown. For tests and kvctl.
  std::optional<std::string> SessionOf(std::string_view key) const;
  // True while some object or in-flight write references `session_id`.
  bool HasSessionTag(std::string_view session_id) const;

  // What the cluster stores per session ID now: readable objects tagged with it and their
  // bytes, from counters kept next to the session tags (no scan of the objects). With a
  // `session_id`: that one (zeros when nothing is stored). Without: sessions that store
  // something, a page of at most `limit` (1..10000) from `cursor` (0 to start); *next_cursor is
  // where to go on, 0 at the end.
  struct SessionUsage {
    std::string session_id;
    uint64_t blocks = 0;
    uint64_t bytes = 0;
  };
  void SessionStats(std::string_view session_id, uint64_t cursor, uint32_t limit,
                    std::vector<SessionUsage>* out, uint64_t* next_cursor) const;

  MasterStats Stats() const;
  // Counted in Stats().bad_requests: the RPC layer reports malformed or unknown messages here.
  void CountBadRequest();

  // Periodic work: drop agents past their TTL, abandon writes past the release timeout, free
  // taken-over replicas whose release time came, evict above the high watermark, flush the log.
  void Tick();

  // Writes buffered operation-log records out (every mutating call already does at its end).
  Status Flush();

  // For a standby (kvmaster --follow): the committed-state records after `after_seq`, at most
  // about `max_bytes`; a snapshot of the whole state instead when `master_epoch` is not this
  // master's (the standby followed another one, or is new) or the records are no longer held.
  // INVALID_PARAMS when replication is off (options().replication_log_bytes == 0).
  // With `background`, a snapshot is built by a child process while the caller goes on: the page
  // is `pending` (no records) until SnapshotBuilding() turns false, and the next call then gets
  // it (kvmaster's server parks such requests meanwhile).
  Status ReadReplication(uint64_t after_seq, uint64_t master_epoch, size_t max_bytes,
                         ReplicationPage* out, bool background = false);
  // Whether a snapshot is being built in the background (checks on the child).
  bool SnapshotBuilding();

  // Events produced since the last call, in order.
  std::vector<events::KvEvent> TakeEvents();
  // The same into `*out` (cleared first); the service keeps out's old buffer for the next
  // events, so a caller that consumes them in place allocates no event buffer per batch.
  void TakeEvents(std::vector<events::KvEvent>* out);

  const MasterOptions& options() const { return options_; }

  // Random per service instance (a kvmaster process start), or options().epoch when set:
  // agents compare it across registrations to tell a master restart from a dropped link, and
  // their pools take it as the master epoch.
  uint64_t epoch() const { return epoch_; }

  // The newest operation-log record a follower can fetch (0: none yet, or no replication).
  uint64_t replication_last_seq() const;

 private:
  MasterService(MasterOptions options, const Clock* clock);
  Status ValidateWriteStart(const WriteStartRequest& request) const;
  Status RejectBatch(Status status, size_t keys, std::vector<Status>* results);
  Status WriteStart(const WriteStartRequest& request, bool upsert, PlacementBatch* out);
  Status StartOne(const WriteStartRequest& request, size_t i, bool upsert, PlacementBatch* out);
  // The most replicas a value of `size` bytes may get: its parts times `replica_count`.
  uint64_t MostReplicas(uint64_t size, uint8_t replica_count) const;
  // INVALID_PARAMS when a value of `size` bytes could have more than kMaxReplicasPerValue
  // replicas, or more than a reply that names `placed` replicas already has room for.
  Status CheckReplicaTotal(uint64_t size, uint8_t replica_count, std::string_view key,
                           size_t placed) const;
  // INVALID_PARAMS when `more` replicas of `key` do not fit a reply naming `placed` already.
  static Status CheckReplyRoom(size_t placed, uint64_t more, std::string_view key);
  Status FinishWrites(const WriteEndRequest& request, bool commit, KeyResults* out);
  // `entry`: the key's entry when the caller holds it (a commit just bound it), else looked up.
  Status FinishOne(const WriteEndRequest& request, size_t i, bool commit,
                   std::span<const uint32_t> checksums, std::span<const FailedReplica> failed,
                   KeyResults* out, ObjectEntry* entry = nullptr);
  void AppendPlacements(const Object& object, PlacementBatch* out) const;
  Status PrepareFinish(const WriteEndRequest& request, size_t keys);
  std::span<const uint32_t> ChecksumsOf(const WriteEndRequest& request, size_t key) const;
  std::span<const FailedReplica> FailedOf(size_t key);
  Status CommitOne(const WriteCommitRequest& request, size_t i, KeyResults* out);

  MasterOptions options_;
  const Clock* clock_;
  uint64_t epoch_;
  std::unique_ptr<MetadataStore> store_;
  uint64_t bad_requests_ = 0;
  // Incarnations a newer registration of the same name replaced, oldest first.
  struct Replaced {
    std::string name;
    uint64_t incarnation = 0;
    uint64_t by = 0;        // the incarnation that replaced it
    bool reported = false;  // its refusal was logged
  };
  std::deque<Replaced> replaced_;
  uint64_t name_conflicts_ = 0;
  uint64_t agent_key_refusals_ = 0;
  Status RefuseAgentKey(Agent* agent, const std::string& what);
  // INVALID_PARAMS when `incarnation` is one a registration of `agent`'s name replaced.
  Status RefuseIfReplaced(Agent* agent, uint64_t incarnation);
  // A new incarnation with another key while `agent` (silent `silent_ms`) holds the name.
  Status RefuseNameTaken(Agent* agent, uint64_t incarnation, int64_t silent_ms);
  std::vector<Placement> scratch_replicas_;  // reused by every key of every WriteStart
  std::vector<FailedReplica> scratch_failed_;
  std::vector<uint32_t> scratch_kept_;  // FinishOne: written replicas per part
  std::vector<uint32_t> scratch_first_checksum_;
  size_t scratch_next_failed_ = 0;
};

}  // namespace kvagent::master

// Vocabulary of the master's typed API (master_service.h): ids, options, views of request
// fields, and per-key result containers. Views never own; containers are reused across calls
// (clear() keeps their capacity) so a busy master allocates little per batch.
#pragma once

#include <algorithm>
#include <compare>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvagent/common/status.h"
#include "kvagent/common/validate.h"
#include "kvagent/events/kv_event.h"

namespace kvagent::master {

using AgentId = uint32_t;
using PoolId = uint32_t;
inline constexpr AgentId kNoAgent = 0;  // ids start at 1

// Time source in milliseconds on a monotonic scale. Leases, TTLs, put timeouts and soft pins
// are all measured on it, so tests drive time by hand instead of sleeping.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMs() const = 0;
};

// std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  int64_t NowMs() const override;
};

// A clock that moves only when told to (tests, benchmarks).
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_ms = 1'000'000) : now_ms_(start_ms) {}
  int64_t NowMs() const override { return now_ms_; }
  void Advance(int64_t ms) { now_ms_ += ms; }

 private:
  int64_t now_ms_;
};

// When operation-log records reach the disk (--log-sync).
enum class LogSync : uint8_t {
  kWrite,  // write(2) before each mutating reply: survives a crash of kvmaster, not of the host
  kFsync,  // write(2) and fdatasync(2) before each mutating reply: survives a power loss
};
std::string_view LogSyncName(LogSync sync);  // "write", "fsync"
Result<LogSync> ParseLogSync(std::string_view text);

struct MasterOptions {
  int64_t agent_ttl_ms = 10'000;             // an agent silent this long is dropped
  int64_t lease_ttl_ms = 10'000;             // read lease granted by BatchGet
  int64_t put_timeout_ms = 30'000;           // an in-flight put younger than this blocks others
  int64_t put_release_timeout_ms = 600'000;  // replicas of a taken-over put are freed after this
  int64_t soft_pin_ttl_ms = 30 * 60'000;     // default soft pin lifetime
  double high_watermark = 0.90;              // pool use above this starts eviction ...
  double low_watermark = 0.85;               // ... which runs until use is at or below this
  uint64_t max_part_bytes = 64ull << 20;     // larger values are stored as several parts
  // An agent silent for agent_ttl_ms becomes suspect (no new replicas are placed on it, reads
  // prefer its objects' other replicas); silent for agent_dead_ms it is dropped with its objects
  // (0: twelve TTLs, 2 minutes with the default TTL).
  int64_t agent_dead_ms = 0;
  // Ticks normally come every few milliseconds. A longer gap between two Ticks means the master
  // itself did not run (stopped, starved of CPU): agents are blamed for at most this much of it
  // (and at most a quarter of the agent TTL).
  int64_t max_tick_gap_ms = 1000;
  uint64_t min_pool_bytes = 1ull << 20;  // smaller pools are refused (kMinPoolBytes)
  std::string state_dir;                 // operation log directory; empty: no persistence
  // Recent operation-log records kept for standbys (kvmaster --follow); 0: no replication.
  uint64_t replication_log_bytes = 0;
  LogSync log_sync = LogSync::kWrite;  // when the operation log reaches the disk
  // The operation log is rewritten as a snapshot of the live state once it has grown past
  // both this size and twice the size of its last snapshot (0: only at start).
  uint64_t compact_log_bytes = 64ull << 20;
  // Standalone (kvagent's embedded master): every write is a memcpy on the master's own thread,
  // done before the write is ended or revoked, so the space of an abandoned write is free at
  // once. Otherwise it is kept until every agent whose pool holds a replica has fenced the
  // write (HeartbeatReply), because a peer's bytes for it may still be on their way.
  bool writes_are_local = false;
  // Open(): a record in the middle of the operation log that fails its checksum (or does not
  // parse) stops the start with an error naming the file and offset, unless this is set: then
  // the records before it are kept and the rest of the file is cut off.
  bool truncate_damaged_log = false;
  // The master's epoch: what every reply and placement carries and every pool's fence compares.
  // 0: a random epoch (one kvmaster, or a standby promoted by hand). With etcd (kvmaster
  // --etcd) it is the term's epoch, the leader key's create revision, which grows from term to
  // term so that agents can refuse replies of a deposed master.
  uint64_t epoch = 0;
};

// What a standby receives (MasterService::ReadReplication): records framed [u32 length LE]
// [payload], either those after the sequence number it asked for, or (snapshot) the master's
// whole committed state, which then replaces everything the standby had.
struct ReplicationPage {
  bool snapshot = false;
  // A snapshot is being built in the background (ReadReplication with `background`): no records
  // now; ask again once SnapshotBuilding() turns false.
  bool pending = false;
  uint64_t last_seq = 0;  // the sequence number the standby is at after applying the page
  // The records (framed), in `records` or, for a snapshot built in the background, in `shared`:
  // a view of the built snapshot, valid while `shared_owner` is held (it is the master's until
  // the snapshot expires; a transport that sends the bytes later keeps a copy of the pointer).
  std::string records;
  std::string_view shared;
  std::shared_ptr<const void> shared_owner;
  std::string_view bytes() const { return shared.data() != nullptr ? shared : records; }
};

// INVALID_PARAMS naming the first inconsistent option (non-positive TTL, release timeout
// below the put timeout, watermarks outside 0 < low <= high <= 1, parts below 4 KiB).
Status ValidateMasterOptions(const MasterOptions& options);

// Smallest node pool the master mounts. Values are split into parts no larger than
// the smallest mounted pool (so that any pool can hold a part); without a floor one tiny
// pool would split every value in the cluster into tiny parts, and every Get reply with
// them.
inline constexpr uint64_t kMinPoolBytes = uint64_t{1} << 20;  // MasterOptions' default

// Largest value a write may announce (validate.h: 256 TiB).
using ::kvagent::kMaxValueBytes;

// Largest node pool the master mounts (256 TiB, as a value), and largest sum of all pools
// (2^62 bytes): the capacity and watermark arithmetic cannot wrap, whatever a peer announces.
inline constexpr uint64_t kMaxPoolBytes = uint64_t{1} << 48;
inline constexpr uint64_t kMaxClusterBytes = uint64_t{1} << 62;

// The most replicas one value may have, all its parts together (parts x replica_count; a part
// is at most the smallest pool): what the master keeps and logs per object, and names in a
// reply, stays bounded whatever sizes a peer announces (1 Mi replicas: a 29 MiB log record).
inline constexpr uint64_t kMaxReplicasPerValue = uint64_t{1} << 20;

// The most replicas one reply names (BatchGet, a write's start, ReserveWrites; ~32 MiB of
// placements): a key that would take a reply past it, however often a request repeats it,
// answers INVALID_PARAMS and is left for another call (reservations stop there).
inline constexpr uint64_t kMaxReplyPlacements = uint64_t{1} << 20;

// The most record bytes one Replicate reply carries: inside the reply (a FlatBuffer, which
// cannot exceed 2 GiB; 1 MiB is left for the rest of it), or as a part of their own after it
// (detached_records: what a follower's socket accepts). A snapshot past them is refused with a
// message that says so, never sent broken.
inline constexpr uint64_t kMaxInlineReplicationBytes = (uint64_t{1} << 31) - (uint64_t{1} << 20);
inline constexpr uint64_t kMaxDetachedReplicationBytes = uint64_t{16} << 30;

// Largest part a value is split into (--max-part-bytes): a part's length fits 32 bits.
inline constexpr uint64_t kMaxPartBytes = (uint64_t{1} << 32) - 4096;

struct WriteOptions {
  uint8_t replica_count = 1;  // per part, on distinct agents (best effort, at least one)
  bool soft_pin = false;
  uint32_t soft_pin_ttl_ms = 0;  // 0: MasterOptions::soft_pin_ttl_ms
  bool hard_pin = false;
  friend bool operator==(const WriteOptions&, const WriteOptions&) = default;
};

// Block metadata a writer supplies for one key (docs/events.md, BlockStored). Empty block_hashes
// means "none": the event then derives hashes from the key.
struct BlockMetaView {
  std::span<const events::BlockHash> block_hashes;
  std::optional<events::BlockHash> parent_block_hash;
  std::span<const uint32_t> token_ids;
  uint32_t block_size = 0;
  std::optional<std::string_view> lora_name;
  bool empty() const { return block_hashes.empty(); }
};

// BatchPutStart / BatchUpsertStart. sizes is parallel to keys; session_ids and blocks are
// parallel to keys or empty.
struct WriteStartRequest {
  AgentId agent = kNoAgent;
  std::span<const std::string_view> keys;
  std::span<const uint64_t> sizes;
  std::span<const std::string_view> session_ids;
  std::span<const BlockMetaView> blocks;
  WriteOptions options;
};

// Where one replica of one part lives, and the part's checksum (CRC32C of its bytes, taken by
// the writer; every replica of a part has the same).
struct Placement {
  uint32_t part = 0;
  PoolId pool_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t checksum = 0;
  bool checksummed = false;  // false: written without a checksum (not verified on reads)
};

// A replica the writer could not write (BatchPutEnd): dropped before the object is committed.
struct FailedReplica {
  uint32_t key = 0;  // index into the End's keys
  uint32_t part = 0;
  PoolId pool_id = 0;
  friend auto operator<=>(const FailedReplica&, const FailedReplica&) = default;
};

// Whether `failed` (one key's failed replicas, sorted and without repeats, as an End hands them
// to the store) names the replica of `part` in pool `pool_id`. O(log n): an End may name any
// number of failed replicas, and each replica of the key is looked up once.
inline bool NamesReplica(std::span<const FailedReplica> failed, uint32_t part, PoolId pool_id) {
  auto at = std::lower_bound(failed.begin(), failed.end(), std::pair(part, pool_id),
                             [](const FailedReplica& f, const std::pair<uint32_t, PoolId>& x) {
                               return std::pair(f.part, f.pool_id) < x;
                             });
  return at != failed.end() && at->part == part && at->pool_id == pool_id;
}

// BatchPutEnd / BatchUpsertEnd. Every span but `keys` may be empty:
//   write_ids    per key: the write to end (as WriteStart returned it); empty: whatever write
//                the agent has in flight for the key
//   part_counts  per key: how many checksums of `checksums` belong to it (its parts, in order);
//                empty: no checksums
//   failed       replicas not written; each part must keep at least one written replica
struct WriteEndRequest {
  AgentId agent = kNoAgent;
  std::span<const std::string_view> keys;
  std::span<const uint64_t> write_ids;
  std::span<const uint32_t> part_counts;
  std::span<const uint32_t> checksums;
  std::span<const FailedReplica> failed;
};

// ReserveWrites: writes placed as a put's would be (replica_count replicas of each part of a
// value of `size` bytes, the writer's own pool first) but not bound to a key yet, so that the
// put that uses one needs a single master round trip (BatchPutCommit). `returned` are reserved
// writes the agent gives back unused (abandoned and fenced like a revoked write).
struct ReserveWritesRequest {
  AgentId agent = kNoAgent;
  uint64_t size = 0;
  uint8_t replica_count = 1;
  uint32_t count = 0;
  std::span<const uint64_t> returned;
};
// The most writes one ReserveWrites may ask for or return, and the most an agent may hold.
inline constexpr uint32_t kMaxReservedWritesPerCall = 1024;
inline constexpr uint32_t kMaxReservedWritesPerAgent = 4096;
// The most of all pools' capacity one agent may hold in reserved writes (1/8).
inline constexpr uint64_t kReservedShareDivisor = 8;

// BatchPutCommit: a put of each key into a write reserved for this agent — WriteStart and End
// in one message. start.* as for BatchPutStart (the sizes must be the reserved writes');
// finish.keys must equal start.keys and finish.write_ids names the reserved write of each key;
// part_counts, checksums and failed as for BatchPutEnd. `master_epoch` is the epoch of the
// master that reserved them: another master refuses the whole commit (MASTER_UNAVAILABLE).
struct WriteCommitRequest {
  WriteStartRequest start;
  WriteEndRequest finish;
  uint64_t master_epoch = 0;
};

// A replica whose bytes did not match its checksum when a reader's agent read it.
struct BadReplica {
  std::string_view key;
  uint64_t version = 0;  // the object's version the reader saw (BatchGet write_ids)
  uint32_t part = 0;
  PoolId pool_id = 0;
};

// Per-key results with replica placements (BatchPutStart, BatchUpsertStart, BatchGet).
// results[i] is key i's outcome; its placements are placements[first[i] .. first[i + 1]),
// ordered by part.
struct PlacementBatch {
  std::vector<Status> results;
  std::vector<uint32_t> first;
  std::vector<Placement> placements;
  std::vector<uint64_t> sizes;  // BatchGet: value size per key (0 unless OK)
  // Per key (0 unless OK): WriteStart: the id of the write started (End and Revoke name it;
  // data-plane writes carry it); BatchGet: the object's version, the id of the write that made
  // its current value.
  std::vector<uint64_t> write_ids;
  uint32_t lease_ttl_ms = 0;  // BatchGet: lease granted to the OK keys
  void Clear() {
    results.clear();
    first.clear();
    placements.clear();
    sizes.clear();
    write_ids.clear();
    lease_ttl_ms = 0;
  }
};

// Per-key results without placements (End, Revoke, Exist, Remove).
struct KeyResults {
  std::vector<Status> results;
  std::vector<uint8_t> exists;    // BatchExist only
  std::vector<uint8_t> replicas;  // End only: replicas kept of the part with the fewest (0: failed)
  void Clear() {
    results.clear();
    exists.clear();
    replicas.clear();
  }
};

// What a heartbeat returns to an agent.
struct HeartbeatResult {
  bool known = false;  // false: the master dropped this agent; register again
  // Writes that may no longer land in this agent's pool: every id below `write_watermark` and
  // every id in `fenced_writes`. The agent applies them, then acks `fence_seq` in a heartbeat;
  // only then is the space of those writes handed out again.
  uint64_t fence_seq = 0;
  uint64_t write_watermark = 0;
  std::vector<uint64_t> fenced_writes;
};

struct MountResult {
  PoolId pool_id = 0;
  // Objects with a replica in the pool that this master restored from its log: at the pool's
  // first mount after the master started; 0 on later mounts (the pool kept its objects).
  uint64_t restored_objects = 0;
};

struct ListedKey {
  std::string key;
  uint64_t size = 0;
  std::string session_id;  // "" when untagged
  // The object's BlockStored as the master announced it (events::StoredEventFor): the writer's
  // block metadata when given, else hashes from the key; object_key, session_id.
  events::BlockStored announcement;
  bool has_writer_meta = false;  // the announcement's block fields came from the writer
};

struct ListPage {
  std::vector<ListedKey> keys;
  uint64_t next_cursor = 0;  // 0: done
  bool restarted = false;    // the table grew; the scan started over
};

// Counters for Stats and logs.
struct MasterStats {
  uint64_t keys = 0;              // readable objects
  uint64_t writes_in_flight = 0;  // puts and upserts started, not ended (reserved writes apart)
  uint64_t bytes_used = 0;        // allocated in all pools (including in-flight and discarded)
  uint64_t bytes_capacity = 0;    // size of all mounted pools
  uint64_t agents = 0;
  uint64_t pools = 0;
  uint64_t session_tags = 0;  // distinct session IDs referenced
  uint64_t evictions = 0;     // objects evicted
  uint64_t expired_agents = 0;
  uint64_t taken_over_puts = 0;
  uint64_t timed_out_writes = 0;  // in-flight writes abandoned past the release timeout
  uint64_t bad_requests = 0;      // rejected whole (validation)
  uint64_t events_emitted = 0;
  uint64_t oplog_records = 0;
  uint64_t replication_last_seq = 0;  // newest record a standby can fetch
  uint64_t suspect_agents = 0;        // silent past the TTL, not yet dropped
  uint64_t agents_suspected = 0;      // times an agent became suspect
  uint64_t fenced_bytes = 0;          // space of abandoned writes waiting for their fences
  uint64_t pending_fences = 0;        // fences not acknowledged yet
  uint64_t bad_replicas = 0;          // replicas dropped because a reader found them corrupt
  uint64_t stalls_forgiven = 0;       // times the master itself stalled (its agents not blamed)
  uint64_t log_writable = 1;          // 0 while the state dir refuses records (full, I/O error)
  uint64_t log_refusals = 0;          // mutating calls refused because the log could not take them
  uint64_t log_bytes = 0;             // size of the operation log file
  uint64_t log_compactions = 0;       // snapshots written while running
  uint64_t oversized_values = 0;      // puts refused as larger than the pools' high watermark
  uint64_t reserved_writes = 0;       // reserved writes held by agents now (not bound to a key)
  uint64_t reserved_bytes = 0;        // their space
  uint64_t writes_reserved = 0;       // reserved writes handed out
  uint64_t reserved_commits = 0;      // keys committed into a reserved write (one round trip)
  uint64_t reserved_returned = 0;     // reserved writes given back unused, or refused at commit
  uint64_t name_conflicts = 0;  // registrations refused: an agent replaced under its name came back
  uint64_t agent_key_refusals = 0;  // registrations and calls for an agent without its agent key
};

}  // namespace kvagent::master

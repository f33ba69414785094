// Vocabulary of the master's typed API (master_service.h): ids, options, views of request
// fields, and per-key result containers. Views never own; containers are reused across calls
// (clear() keeps their capacity) so a busy master allocates little per batch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/common/kv_event.h"
#include "kvagent/common/status.h"

namespace kvagent::master {

using AgentId = uint32_t;
using SegmentId = uint32_t;
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

struct MasterOptions {
  int64_t agent_ttl_ms = 10'000;             // an agent silent this long is dropped
  int64_t lease_ttl_ms = 10'000;             // read lease granted by BatchGet
  int64_t put_timeout_ms = 30'000;           // an in-flight put younger than this blocks others
  int64_t put_release_timeout_ms = 600'000;  // replicas of a taken-over put are freed after this
  int64_t soft_pin_ttl_ms = 30 * 60'000;     // default soft pin lifetime
  double high_watermark = 0.90;              // pool use above this starts eviction ...
  double low_watermark = 0.85;               // ... which runs until use is at or below this
  uint64_t max_part_bytes = 64ull << 20;     // larger values are stored as several parts
  std::string state_dir;                     // operation log directory; empty: no persistence
  // Recent operation-log records kept for standbys (kvmaster --follow); 0: no replication.
  uint64_t replication_log_bytes = 0;
};

// What a standby receives (MasterService::ReadReplication): records framed [u32 length LE]
// [payload], either those after the sequence number it asked for, or (snapshot) the master's
// whole committed state, which then replaces everything the standby had.
struct ReplicationPage {
  bool snapshot = false;
  uint64_t last_seq = 0;  // the sequence number the standby is at after applying the page
  std::string records;
};

// INVALID_PARAMS naming the first inconsistent option (non-positive TTL, release timeout
// below the put timeout, watermarks outside 0 < low <= high <= 1, parts below 4 KiB).
Status ValidateMasterOptions(const MasterOptions& options);

// Largest value a write may announce (256 TiB): far beyond any pool, and small enough that
// size arithmetic (rounding, parts) cannot overflow.
inline constexpr uint64_t kMaxValueBytes = uint64_t{1} << 48;

struct WriteOptions {
  uint8_t replica_count = 1;  // per part, on distinct agents (best effort, at least one)
  bool soft_pin = false;
  uint32_t soft_pin_ttl_ms = 0;  // 0: MasterOptions::soft_pin_ttl_ms
  bool hard_pin = false;
  friend bool operator==(const WriteOptions&, const WriteOptions&) = default;
};

// Block metadata a writer supplies for one key (EVENTS.md BlockStored). Empty block_hashes
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

// Where one replica of one part lives.
struct Placement {
  uint32_t part = 0;
  SegmentId segment_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Per-key results with replica placements (BatchPutStart, BatchUpsertStart, BatchGet).
// results[i] is key i's outcome; its placements are placements[first[i] .. first[i + 1]),
// ordered by part.
struct PlacementBatch {
  std::vector<Status> results;
  std::vector<uint32_t> first;
  std::vector<Placement> placements;
  std::vector<uint64_t> sizes;  // BatchGet: value size per key (0 unless OK)
  uint32_t lease_ttl_ms = 0;    // BatchGet: lease granted to the OK keys
  void Clear() {
    results.clear();
    first.clear();
    placements.clear();
    sizes.clear();
    lease_ttl_ms = 0;
  }
};

// Per-key results without placements (End, Revoke, Exist, Remove).
struct KeyResults {
  std::vector<Status> results;
  std::vector<uint8_t> exists;  // BatchExist only
  void Clear() {
    results.clear();
    exists.clear();
  }
};

struct MountResult {
  SegmentId segment_id = 0;
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
  uint64_t keys = 0;  // readable objects
  uint64_t writes_in_flight = 0;
  uint64_t bytes_used = 0;      // allocated in all segments (including in-flight and discarded)
  uint64_t bytes_capacity = 0;  // size of all mounted segments
  uint64_t agents = 0;
  uint64_t segments = 0;
  uint64_t session_tags = 0;  // distinct session IDs referenced
  uint64_t evictions = 0;     // objects evicted
  uint64_t expired_agents = 0;
  uint64_t taken_over_puts = 0;
  uint64_t timed_out_writes = 0;  // in-flight writes abandoned past the release timeout
  uint64_t bad_requests = 0;      // rejected whole (validation)
  uint64_t events_emitted = 0;
  uint64_t oplog_records = 0;
  uint64_t replication_last_seq = 0;  // newest record a standby can fetch
};

}  // namespace kvagent::master

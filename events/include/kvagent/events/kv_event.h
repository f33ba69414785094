// KV events and their msgpack codec: the one implementation of the wire contract in
// docs/events.md (payload `[ts, events, dp_rank]`, map-form events, "type" first).
//
// Used by the master's publisher, the agent's relay, kvctl and the tests. Strict consumers drop a
// whole batch on one bad field, so nothing else in the project encodes events.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvagent/common/status.h"

namespace kvagent::events {

inline constexpr std::string_view kMediumExternal = "EXTERNAL";  // the store's memory pool
inline constexpr std::string_view kMediumDisk = "DISK";

// 64 bits written as a signed (SGLang) or an unsigned (vLLM) msgpack integer.
struct BlockHash {
  uint64_t bits = 0;
  bool is_signed = false;

  static BlockHash Unsigned(uint64_t v) { return BlockHash{v, false}; }
  static BlockHash Signed(int64_t v) { return BlockHash{static_cast<uint64_t>(v), true}; }
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

struct BlockStored {
  std::vector<BlockHash> block_hashes;
  std::optional<BlockHash> parent_block_hash;  // nil when absent
  std::vector<uint32_t> token_ids;             // [] when unknown, never nil
  uint32_t block_size = 0;
  std::optional<int64_t> lora_id;  // always nil from this project
  std::string medium = std::string(kMediumExternal);
  std::optional<std::string> lora_name;   // nil when absent
  std::optional<std::string> session_id;  // omitted when absent or "" (untagged)
  std::optional<std::string> object_key;  // omitted when absent
  std::optional<int64_t> group_idx;       // omitted when absent
  friend bool operator==(const BlockStored&, const BlockStored&) = default;
};

struct BlockRemoved {
  std::vector<BlockHash> block_hashes;
  std::string medium = std::string(kMediumExternal);
  std::optional<std::string> object_key;  // omitted when absent
  friend bool operator==(const BlockRemoved&, const BlockRemoved&) = default;
};

struct AllBlocksCleared {
  friend bool operator==(const AllBlocksCleared&, const AllBlocksCleared&) = default;
};

using KvEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

struct EventBatch {
  double ts = 0;  // seconds since the epoch
  std::vector<KvEvent> events;
  std::optional<int64_t> dp_rank;  // nil when absent
  friend bool operator==(const EventBatch&, const EventBatch&) = default;
};

// Appends the msgpack payload of `batch` to `*out`. Reproduces the golden bytes of docs/events.md:
// smallest int/str formats, ts as float64, map-form events with "type" first and the keys in
// the order of docs/events.md, optional keys only when set, text as str (never bin).
// Precondition: every string is valid UTF-8 (guaranteed by the write boundary).
void EncodeEventBatch(const EventBatch& batch, std::string* out);
std::string EncodeEventBatch(const EventBatch& batch);

// Appends one encoded event (a msgpack map) to `*out`: the unit EncodeEventBatch is made of.
void EncodeEvent(const KvEvent& event, std::string* out);

// Builds one payload from events added one at a time, reusing its buffer across batches (no
// per-event allocation once warm). Produces exactly the bytes of EncodeEventBatch for the same
// ts, events and dp_rank. Not thread-safe: one owner.
class EventBatchBuilder {
 public:
  // Encodes `event` at the end of the batch under construction.
  void Add(const KvEvent& event);
  // Appends one event EncodeEvent encoded (exactly one event's bytes, unchanged).
  void AddEncoded(std::string_view encoded_event);
  // Takes back the event added by the last Add (at most once per Add): lets a caller that finds
  // the batch too large close it without that event.
  void RemoveLast();
  size_t event_count() const { return count_; }
  bool empty() const { return count_ == 0; }
  // An upper bound of the payload size Finish would produce now (events + at most 24 bytes).
  size_t payload_bound() const { return events_.size() + 24; }
  // Replaces `*payload` with `[ts, events, dp_rank]` and empties the builder (keeps capacity).
  void Finish(double ts, std::optional<int64_t> dp_rank, std::string* payload);

 private:
  std::string events_;  // the encoded events, back to back
  size_t count_ = 0;
  size_t last_start_ = 0;  // offset of the last added event in events_
  bool can_remove_last_ = false;
};

// Decodes a payload the way strict consumers do (Dynamo, msgspec, msgpack raw=False +
// strict_map_key): exactly 3 elements, float ts (an int is widened), map-form events with a
// known "type", required keys present with the right types, integer hashes, u32 token IDs,
// valid UTF-8 text everywhere, string map keys, no trailing bytes. Also enforces docs/events.md's
// own rules: session_id only on BlockStored and non-empty, medium uppercase, optional keys
// omitted rather than nil, len(token_ids) == block_size * len(block_hashes) when tokens are
// given, dp_rank within int32. Unknown keys are ignored. Any violation is INVALID_PARAMS naming
// the offending field ("events[2] (BlockStored).token_ids[5]: ...").
// The wire does not say which hashes were signed: a non-negative hash decodes as Unsigned, a
// negative one as Signed; re-encoding gives the same bytes.
Result<EventBatch> DecodeEventBatch(std::string_view payload);

// The block hash of a stored object without writer-supplied metadata (docs/events.md, "Block
// hashes"):
//  1. a key that is exactly a decimal number (digits only) or "0x"/"0X" plus hex digits, whose
//     value fits in 64 bits, is that value, unsigned (Mooncake's seq-hash keys);
//  2. else a key whose first 16 characters are hex digits (either case) gives those 64 bits
//     as a signed int64, like SGLang's hash_str_to_int64 (int(key[:16], 16) folded into int64);
//  3. else nullopt: the caller sends block_hashes [] and the key in object_key.
// So a 20-digit decimal above u64 max falls to rule 2, and "0x" + 17 digits to rule 3.
std::optional<BlockHash> BlockHashFromKey(std::string_view key);

// The BlockStored event of a stored object — the one rule used by the master when the object
// becomes readable and by the agent's relay when it re-announces the store's content.
// `writer` carries the block metadata the writer supplied with the put (block_hashes, parent,
// token_ids, block_size, lora_name; empty block_hashes = none given). The result has the
// writer's metadata, or hashes from BlockHashFromKey(key) ([] when it gives none);
// object_key = key; session_id when non-empty; medium EXTERNAL.
BlockStored StoredEventFor(std::string_view key, std::string_view session_id,
                           BlockStored writer = {});

// "BlockStored EXTERNAL session=sess-1 hashes=[123] parent=- tokens=4 block_size=4 key=..." :
// one readable line per event for logs and `kvctl events tail` (callers prefix "seq=42 ").
// Control characters in text are escaped as \xNN; long hash lists are shortened.
std::string DescribeEvent(const KvEvent& event);

// ---- transport framing (docs/events.md, "Sockets and frames") -----------------------------------

// The seq of the replay end marker `[b"", b"", ff*8, b""]`.
inline constexpr uint64_t kReplayEndSeq = ~uint64_t{0};

// The 8-byte big-endian seq frame.
std::string EncodeSeq(uint64_t seq);
// Reads an 8-byte big-endian seq frame; nullopt when the frame is not exactly 8 bytes.
std::optional<uint64_t> DecodeSeq(std::string_view frame);

}  // namespace kvagent::events

// KV events and their msgpack codec: the one implementation of the wire contract in
// ../shared/design/EVENTS.md (payload `[ts, events, dp_rank]`, map-form events, "type" first).
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
  std::optional<int64_t> lora_id;              // always nil from this project
  std::string medium = std::string(kMediumExternal);
  std::optional<std::string> lora_name;        // nil when absent
  std::optional<std::string> session_id;       // omitted when absent (untagged)
  std::optional<std::string> object_key;       // omitted when absent
  std::optional<int64_t> group_idx;            // omitted when absent
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
  double ts = 0;                  // seconds since the epoch
  std::vector<KvEvent> events;
  std::optional<int64_t> dp_rank;  // nil when absent
  friend bool operator==(const EventBatch&, const EventBatch&) = default;
};

// Appends the msgpack payload of `batch` to `*out`. Reproduces the golden bytes of EVENTS.md.
// Precondition: every string is valid UTF-8 (guaranteed by the write boundary).
void EncodeEventBatch(const EventBatch& batch, std::string* out);
std::string EncodeEventBatch(const EventBatch& batch);

// Decodes a payload the way strict consumers do (Dynamo, msgspec, msgpack raw=False +
// strict_map_key): exactly 3 elements, float ts (an int is widened), map-form events with a
// known "type", required keys present with the right types, integer hashes, u32 token IDs,
// valid UTF-8 text. Any violation is INVALID_PARAMS naming the offending field.
Result<EventBatch> DecodeEventBatch(std::string_view payload);

// The block hashes of a stored object without writer-supplied metadata (EVENTS.md): a decimal or
// 0x-hex u64 key is that value (unsigned); a key that starts with >= 16 hex digits gives its
// first 64 bits as a signed int64 (SGLang's hash_str_to_int64); anything else gives nullopt and
// the key travels in object_key.
std::optional<BlockHash> BlockHashFromKey(std::string_view key);

// "seq=42 BlockStored EXTERNAL session=sess-1 hashes=[123] key=..." : one readable line per event
// for logs and `kvctl events tail`.
std::string DescribeEvent(const KvEvent& event);

}  // namespace kvagent::events

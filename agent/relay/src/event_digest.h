// Private to the relay: what its downstream index needs of each event of a payload, read
// straight from the msgpack bytes (docs/events.md, "Payload") without building the events.
//
// The relay republishes every master batch unchanged and keeps its index from the same bytes;
// decoding each batch into events::EventBatch (strictly, as consumers do) cost more than the
// relaying itself. This reader takes only the fields the index keeps or fingerprints, in any key
// order, skips unknown keys, and refuses anything that is not a well-formed payload of this
// format (then the index stops vouching: see DownstreamIndex). Every length is checked against
// the bytes left; nesting is bounded.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "kvagent/events/kv_event.h"

namespace kvagent::relay {

// One event of a payload, as views into it (valid during the callback only).
struct EventDigest {
  enum class Type { kStored, kRemoved, kCleared };
  Type type = Type::kCleared;
  std::vector<events::BlockHash> block_hashes;
  std::optional<events::BlockHash> parent_block_hash;
  uint64_t token_count = 0;
  uint64_t token_hash = 0;  // TokenHash of token_ids
  uint32_t block_size = 0;
  std::optional<int64_t> lora_id;
  std::string_view medium;
  std::optional<std::string_view> lora_name;
  std::optional<std::string_view> session_id;
  std::optional<std::string_view> object_key;
  std::optional<int64_t> group_idx;
};

// The digest of token IDs, in order (the same for a decoded event and a listed one).
class TokenHash {
 public:
  void Add(uint32_t token) { h_ = (h_ ^ token) * 0x100000001b3ULL; }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

// The digest of a BlockStored the relay builds (a listed object).
EventDigest DigestOf(const events::BlockStored& e);

// Calls `each` for every event of `payload`, in order. False when the payload is not a
// well-formed batch, or when a key its event's type reads holds a value of another type (what
// strict consumers refuse); a key the type does not read is skipped whatever it holds, as
// consumers skip it (a block_size of any kind on a BlockRemoved). Nothing is promised about the
// events passed before a false.
bool ForEachEvent(std::string_view payload, const std::function<void(const EventDigest&)>& each);

}  // namespace kvagent::relay

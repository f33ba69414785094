// The shared write-validation boundary (docs/semantics.md, "Objects" and "Sessions" rule 2).
//
// One implementation, called by the SDK (fast local error), the agent (authoritative) and the
// master (defence in depth). A request that fails any rule is rejected as a whole: the caller
// answers every key with the returned Status and stores or allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvagent/common/status.h"

namespace kvagent {

inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxSessionIdBytes = 256;
// Upper bound on keys in one request or batch; keeps every per-request allocation bounded.
inline constexpr size_t kMaxBatchKeys = 65536;
// Largest value a put may name (256 TiB): far beyond any pool, and small enough that size
// arithmetic (rounding, parts, replicas) cannot overflow anywhere.
inline constexpr uint64_t kMaxValueBytes = uint64_t{1} << 48;
// Largest page a List or Sessions request may ask for (keys or sessions per page).
inline constexpr uint32_t kMaxListLimit = 10000;
// Block metadata of one key (events.md, BlockStored): what one record of the master's operation
// log can hold with room to spare (16.6 MiB at most; a record may have 64 MiB).
inline constexpr size_t kMaxBlockHashes = 65536;
inline constexpr size_t kMaxBlockTokens = size_t{1} << 22;
inline constexpr size_t kMaxLoraNameBytes = 1024;

struct Utf8Error {
  size_t offset;       // byte offset of the first byte of the offending sequence
  const char* reason;  // static text: "overlong encoding", "surrogate code point", ...
};

// Returns the first malformed sequence, or nullopt when `text` is valid UTF-8. Rejects overlong
// forms, UTF-16 surrogates (U+D800..U+DFFF), code points above U+10FFFF, stray continuation
// bytes and truncated sequences.
std::optional<Utf8Error> FindInvalidUtf8(std::string_view text);
inline bool IsValidUtf8(std::string_view text) { return !FindInvalidUtf8(text).has_value(); }

// A key: non-empty, valid UTF-8, at most kMaxKeyBytes. `what` names the key in the message,
// e.g. "keys[3]".
Status ValidateKey(std::string_view key, std::string_view what = "key");

// A session ID: valid UTF-8 and at most kMaxSessionIdBytes. Empty means untagged and is valid.
Status ValidateSessionId(std::string_view session_id, std::string_view what = "session_id");

// A List prefix: valid UTF-8 of at most kMaxKeyBytes (it is the start of a key); may be empty.
Status ValidateListPrefix(std::string_view prefix);

// A List or Sessions page size: at most kMaxListLimit (0 asks for the default page).
Status ValidateListLimit(uint32_t limit);

// A reference into a client's data arena. Returns kBufferOutOfRange unless
// [offset, offset + length) lies inside [0, arena_size) (overflow-safe).
Status ValidateBufferRef(uint64_t offset, uint64_t length, uint64_t arena_size,
                         std::string_view what = "buffer");

// Runs `check(what)` (one of the checks above) for one entry of a batch, with the entry's name
// (`name()`, e.g. "buffers[7]") built only when the check fails: building it for every key cost
// more than the checks themselves.
template <typename Check, typename Name>
Status CheckNamed(Check check, Name name) {
  Status st = check(std::string_view());
  if (st.ok()) return st;
  return check(std::string_view(name()));
}

// Optional block metadata supplied with a stored key (docs/events.md, BlockStored): at least one
// hash and at most kMaxBlockHashes; token IDs either absent (then block_size 0) or exactly
// block_size * hash_count, at most kMaxBlockTokens; lora_name valid UTF-8 of at most
// kMaxLoraNameBytes.
Status ValidateBlockMeta(size_t hash_count, size_t token_count, uint32_t block_size,
                         std::string_view lora_name, std::string_view what = "block");

// Validates the per-key arrays of one write request (Put, Upsert and their batch forms):
// 1 <= key_count <= kMaxBatchKeys, every key valid, session_count either 0 or key_count, every
// session ID valid. `key_at(i)` and `session_at(i)` return something convertible to
// std::string_view; each is called at most once per index. Cost is linear in the input.
template <typename KeyAt, typename SessionAt>
Status ValidateWriteKeys(size_t key_count, KeyAt&& key_at, size_t session_count,
                         SessionAt&& session_at);

// Same rules for requests without session IDs (Get, Exist, Remove).
template <typename KeyAt>
Status ValidateKeys(size_t key_count, KeyAt&& key_at);

// ---- implementation of the templates -------------------------------------------------------

namespace validate_detail {
Status CheckKeyCount(size_t key_count);
Status CheckSessionCount(size_t key_count, size_t session_count);
std::string Indexed(std::string_view array, size_t index);
}  // namespace validate_detail

template <typename KeyAt>
Status ValidateKeys(size_t key_count, KeyAt&& key_at) {
  KVAGENT_RETURN_IF_ERROR(validate_detail::CheckKeyCount(key_count));
  for (size_t i = 0; i < key_count; ++i) {
    std::string_view key = key_at(i);
    if (key.empty() || key.size() > kMaxKeyBytes || !IsValidUtf8(key)) {
      return ValidateKey(key, validate_detail::Indexed("keys", i));
    }
  }
  return Status::Ok();
}

template <typename KeyAt, typename SessionAt>
Status ValidateWriteKeys(size_t key_count, KeyAt&& key_at, size_t session_count,
                         SessionAt&& session_at) {
  KVAGENT_RETURN_IF_ERROR(ValidateKeys(key_count, key_at));
  KVAGENT_RETURN_IF_ERROR(validate_detail::CheckSessionCount(key_count, session_count));
  for (size_t i = 0; i < session_count; ++i) {
    std::string_view id = session_at(i);
    if (id.size() > kMaxSessionIdBytes || !IsValidUtf8(id)) {
      return ValidateSessionId(id, validate_detail::Indexed("session_ids", i));
    }
  }
  return Status::Ok();
}

}  // namespace kvagent

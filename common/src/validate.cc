#include "kvagent/common/validate.h"

#include <cstring>

namespace kvagent {
namespace {

// Length of the sequence announced by lead byte `b`, or 0 when `b` cannot start one.
// C0/C1 (overlong two-byte forms) and F5..FF (beyond U+10FFFF) never start a sequence.
int SequenceLength(unsigned char b) {
  if (b < 0x80) return 1;
  if (b < 0xC2) return 0;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF5) return 4;
  return 0;
}

bool IsContinuation(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

std::optional<Utf8Error> FindInvalidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, eight bytes at a time.
    if (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      if ((word & 0x8080808080808080ULL) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned char lead = p[i];
    const int len = SequenceLength(lead);
    if (len == 1) {
      ++i;
      continue;
    }
    if (len == 0) {
      if (IsContinuation(lead)) return Utf8Error{i, "unexpected continuation byte"};
      if (lead >= 0xF5) return Utf8Error{i, "code point above U+10FFFF"};
      return Utf8Error{i, "overlong encoding"};  // C0, C1
    }
    if (i + len > n) {
      // Report truncation only when what is there is a valid prefix; otherwise the more
      // specific error below applies.
      for (size_t k = i + 1; k < n; ++k) {
        if (!IsContinuation(p[k])) return Utf8Error{i, "invalid continuation byte"};
      }
      return Utf8Error{i, "truncated sequence"};
    }
    const unsigned char second = p[i + 1];
    if (!IsContinuation(second)) return Utf8Error{i, "invalid continuation byte"};
    if (lead == 0xE0 && second < 0xA0) return Utf8Error{i, "overlong encoding"};
    if (lead == 0xED && second >= 0xA0) return Utf8Error{i, "surrogate code point"};
    if (lead == 0xF0 && second < 0x90) return Utf8Error{i, "overlong encoding"};
    if (lead == 0xF4 && second >= 0x90) return Utf8Error{i, "code point above U+10FFFF"};
    for (int k = 2; k < len; ++k) {
      if (!IsContinuation(p[i + k])) return Utf8Error{i, "invalid continuation byte"};
    }
    i += len;
  }
  return std::nullopt;
}

namespace {

std::string Utf8Message(std::string_view what, const Utf8Error& err) {
  return std::string(what) + ": invalid UTF-8 at byte " + std::to_string(err.offset) + " (" +
         err.reason + ")";
}

}  // namespace

Status ValidateKey(std::string_view key, std::string_view what) {
  if (key.empty()) return InvalidParams(std::string(what) + ": a key must not be empty");
  if (key.size() > kMaxKeyBytes) {
    return InvalidParams(std::string(what) + ": key is " + std::to_string(key.size()) +
                         " bytes; the limit is " + std::to_string(kMaxKeyBytes));
  }
  if (auto err = FindInvalidUtf8(key)) return InvalidParams(Utf8Message(what, *err));
  return Status::Ok();
}

Status ValidateSessionId(std::string_view session_id, std::string_view what) {
  if (session_id.size() > kMaxSessionIdBytes) {
    return InvalidParams(std::string(what) + ": session ID is " +
                         std::to_string(session_id.size()) + " bytes; the limit is " +
                         std::to_string(kMaxSessionIdBytes));
  }
  if (auto err = FindInvalidUtf8(session_id)) return InvalidParams(Utf8Message(what, *err));
  return Status::Ok();
}

Status ValidateListPrefix(std::string_view prefix) {
  if (prefix.size() > kMaxKeyBytes || !IsValidUtf8(prefix)) {
    return InvalidParams("the prefix must be valid UTF-8 of at most " +
                         std::to_string(kMaxKeyBytes) + " bytes (a key prefix)");
  }
  return Status::Ok();
}

Status ValidateListLimit(uint32_t limit) {
  if (limit > kMaxListLimit) {
    return InvalidParams("limit " + std::to_string(limit) + " is above " +
                         std::to_string(kMaxListLimit) + "; page with next_cursor instead");
  }
  return Status::Ok();
}

Status ValidateBufferRef(uint64_t offset, uint64_t length, uint64_t arena_size,
                         std::string_view what) {
  if (offset > arena_size || length > arena_size - offset) {
    return Status(ErrorCode::kBufferOutOfRange,
                  std::string(what) + ": [" + std::to_string(offset) + ", +" +
                      std::to_string(length) + ") is outside the " + std::to_string(arena_size) +
                      "-byte arena; allocate buffers from the client's arena");
  }
  return Status::Ok();
}

namespace validate_detail {

Status CheckKeyCount(size_t key_count) {
  if (key_count == 0) return InvalidParams("the request has no keys");
  if (key_count > kMaxBatchKeys) {
    return InvalidParams("the request has " + std::to_string(key_count) + " keys; the limit is " +
                         std::to_string(kMaxBatchKeys) + " per request: split the batch");
  }
  return Status::Ok();
}

Status CheckSessionCount(size_t key_count, size_t session_count) {
  if (session_count != 0 && session_count != key_count) {
    return InvalidParams("session_ids has " + std::to_string(session_count) + " entries for " +
                         std::to_string(key_count) +
                         " keys; give one session ID per key (empty = untagged) or none");
  }
  return Status::Ok();
}

std::string Indexed(std::string_view array, size_t index) {
  return std::string(array) + "[" + std::to_string(index) + "]";
}

}  // namespace validate_detail
}  // namespace kvagent

namespace kvagent {

Status ValidateBlockMeta(size_t hash_count, size_t token_count, uint32_t block_size,
                         std::string_view lora_name, std::string_view what) {
  if (hash_count == 0) {
    return InvalidParams(std::string(what) + ": block metadata needs at least one block hash");
  }
  if (hash_count > kMaxBlockHashes) {
    return InvalidParams(std::string(what) + ": " + std::to_string(hash_count) +
                         " block hashes; one key carries at most " +
                         std::to_string(kMaxBlockHashes));
  }
  if (token_count > kMaxBlockTokens) {
    return InvalidParams(std::string(what) + ": " + std::to_string(token_count) +
                         " token IDs; one key carries at most " + std::to_string(kMaxBlockTokens));
  }
  if (lora_name.size() > kMaxLoraNameBytes) {
    return InvalidParams(std::string(what) + ".lora_name: " + std::to_string(lora_name.size()) +
                         " bytes; the limit is " + std::to_string(kMaxLoraNameBytes));
  }
  if (token_count == 0 && block_size != 0) {
    // Published as is, such a block has token_ids [] with a block_size: a router that hashes
    // each block's tokens itself (Dynamo) skips it, and older versions of it fail on it.
    return InvalidParams(std::string(what) + ": block_size " + std::to_string(block_size) +
                         " with no token IDs; give block_size * blocks token IDs, or block_size "
                         "0 when the tokens are not known");
  }
  if (token_count != 0 && token_count != static_cast<size_t>(block_size) * hash_count) {
    return InvalidParams(std::string(what) + ": " + std::to_string(token_count) +
                         " token IDs for " + std::to_string(hash_count) +
                         " block(s) of block_size " + std::to_string(block_size) +
                         "; give block_size * blocks token IDs, or none");
  }
  if (auto err = FindInvalidUtf8(lora_name)) {
    return InvalidParams(std::string(what) + ".lora_name: invalid UTF-8 at byte " +
                         std::to_string(err->offset) + " (" + err->reason + ")");
  }
  return Status::Ok();
}

}  // namespace kvagent

// The encoding half of the KV-event codec (docs/events.md), BlockHashFromKey, DescribeEvent and the
// seq frame. Decoding lives in kv_event_decode.cc.
//
// Encoding goes through msgpack-c's packer, which already picks the smallest int and str
// formats (fixint/uint8/.../uint64, negative fixint/int8/.../int64, fixstr/str8/str16/str32)
// exactly as python-msgpack and msgspec do. Doubles are written by hand (see PackFloat64). The
// packer writes straight into the caller's std::string, so a reused string means no allocation
// per event.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <type_traits>

#include <msgpack.hpp>

#include "kvagent/events/kv_event.h"

namespace kvagent::events {
namespace {

// msgpack::packer's output stream: writes into room made at the end of a std::string.
// The packer calls write() once per header and value; a bare memcpy that inlines costs a
// fraction of a std::string::append call each time. The room is an estimate (EncodedBound);
// a write that does not fit grows the string, so the estimate affects speed only, never
// correctness. The destructor trims the string to what was written.
class StringSink {
 public:
  StringSink(std::string* out, size_t expected) : out_(out) { Room(expected); }
  ~StringSink() { out_->resize(static_cast<size_t>(cursor_ - out_->data())); }
  StringSink(const StringSink&) = delete;
  StringSink& operator=(const StringSink&) = delete;

  void write(const char* data, size_t size) {
    if (size > static_cast<size_t>(end_ - cursor_)) Room(size + 64);
    std::memcpy(cursor_, data, size);
    cursor_ += size;
  }

 private:
  // Makes at least `n` bytes of room after the cursor (the first call: after the content).
  void Room(size_t n) {
    const size_t used = cursor_ ? static_cast<size_t>(cursor_ - out_->data()) : out_->size();
    out_->resize(std::max(out_->size(), used + n));
    cursor_ = out_->data() + used;
    end_ = out_->data() + out_->size();
  }

  std::string* out_;
  char* cursor_ = nullptr;
  char* end_ = nullptr;
};

using Packer = msgpack::packer<StringSink>;

// Roughly what an event takes once encoded (a little more for typical events): keys, headers
// and fixed fields, plus 9 bytes per hash, 5 per token and the text.
size_t EncodedBound(const KvEvent& event) {
  auto text = [](const std::optional<std::string>& s) { return s ? s->size() + 5 : 1; };
  if (const auto* e = std::get_if<BlockStored>(&event)) {
    return 176 + 9 * e->block_hashes.size() + 5 * e->token_ids.size() + e->medium.size() +
           text(e->lora_name) + text(e->session_id) + text(e->object_key);
  }
  if (const auto* e = std::get_if<BlockRemoved>(&event)) {
    return 48 + 9 * e->block_hashes.size() + e->medium.size() + text(e->object_key);
  }
  return 32;
}

// Always inlined: for the constant keys the length test folds away and both writes become
// fixed-size copies (this was a third of the encoding time as a call).
[[gnu::always_inline]] inline void PackStr(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// One map entry with a str value.
[[gnu::always_inline]] inline void PackEntry(Packer& pk, std::string_view key,
                                             std::string_view value) {
  PackStr(pk, key);
  PackStr(pk, value);
}

void PackHash(Packer& pk, const BlockHash& h) {
  if (h.is_signed) {
    pk.pack_int64(static_cast<int64_t>(h.bits));
  } else {
    pk.pack_uint64(h.bits);
  }
}

void PackHashes(Packer& pk, const std::vector<BlockHash>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (const BlockHash& h : hashes) PackHash(pk, h);
}

template <typename T>
void PackOptionalInt(Packer& pk, const std::optional<T>& v) {
  if (v) {
    pk.pack_int64(*v);
  } else {
    pk.pack_nil();
  }
}

void PackOptionalStr(Packer& pk, const std::optional<std::string>& v) {
  if (v) {
    PackStr(pk, *v);
  } else {
    pk.pack_nil();
  }
}

// Key order is the contract's (docs/events.md; vLLM's declaration order): "type" first, the keys
// without a default always, then the optional ones only when set.
// An empty session_id means untagged (docs/semantics.md, "Sessions") and is omitted like an absent
// one.
void PackStored(Packer& pk, const BlockStored& e) {
  const bool has_session = e.session_id && !e.session_id->empty();
  const uint32_t entries =
      8 + (e.group_idx ? 1 : 0) + (has_session ? 1 : 0) + (e.object_key ? 1 : 0);
  pk.pack_map(entries);
  PackEntry(pk, "type", "BlockStored");
  PackStr(pk, "block_hashes");
  PackHashes(pk, e.block_hashes);
  PackStr(pk, "parent_block_hash");
  if (e.parent_block_hash) {
    PackHash(pk, *e.parent_block_hash);
  } else {
    pk.pack_nil();
  }
  PackStr(pk, "token_ids");
  pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
  for (uint32_t t : e.token_ids) pk.pack_uint32(t);
  PackStr(pk, "block_size");
  pk.pack_uint32(e.block_size);
  PackStr(pk, "lora_id");
  PackOptionalInt(pk, e.lora_id);
  PackEntry(pk, "medium", e.medium);
  PackStr(pk, "lora_name");
  PackOptionalStr(pk, e.lora_name);
  if (e.group_idx) {
    PackStr(pk, "group_idx");
    pk.pack_int64(*e.group_idx);
  }
  if (has_session) PackEntry(pk, "session_id", *e.session_id);
  if (e.object_key) PackEntry(pk, "object_key", *e.object_key);
}

void PackRemoved(Packer& pk, const BlockRemoved& e) {
  pk.pack_map(3 + (e.object_key ? 1 : 0));
  PackEntry(pk, "type", "BlockRemoved");
  PackStr(pk, "block_hashes");
  PackHashes(pk, e.block_hashes);
  PackEntry(pk, "medium", e.medium);
  if (e.object_key) PackEntry(pk, "object_key", *e.object_key);
}

void PackCleared(Packer& pk) {
  pk.pack_map(1);
  PackEntry(pk, "type", "AllBlocksCleared");
}

// float64 (0xcb + big-endian IEEE 754), always. msgpack-c 4.1.3's pack_double writes a double
// with an integral value as an *integer* (1732900000.0 becomes uint32 0xce...), which breaks the
// golden bytes and every consumer that expects `ts` to be a float.
void PackFloat64(std::string* out, double d) {
  uint64_t bits = 0;
  std::memcpy(&bits, &d, sizeof bits);
  char buf[9];
  buf[0] = static_cast<char>(0xcb);
  for (int i = 8; i >= 1; --i) {
    buf[i] = static_cast<char>(bits & 0xff);
    bits >>= 8;
  }
  out->append(buf, sizeof buf);
}

// `[ts, [` with the events array header for `count` events; the events follow.
void PackBatchHead(std::string* out, double ts, size_t count) {
  {
    StringSink sink(out, 1);
    Packer(sink).pack_array(3);
  }
  PackFloat64(out, ts);
  StringSink sink(out, 5);
  Packer(sink).pack_array(static_cast<uint32_t>(count));
}

void PackBatchTail(std::string* out, const std::optional<int64_t>& dp_rank) {
  StringSink sink(out, 9);
  Packer pk(sink);
  PackOptionalInt(pk, dp_rank);
}

}  // namespace

void EncodeEvent(const KvEvent& event, std::string* out) {
  StringSink sink(out, EncodedBound(event));
  Packer pk(sink);
  std::visit(
      [&pk](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, BlockStored>) {
          PackStored(pk, e);
        } else if constexpr (std::is_same_v<T, BlockRemoved>) {
          PackRemoved(pk, e);
        } else {
          PackCleared(pk);
        }
      },
      event);
}

void EncodeEventBatch(const EventBatch& batch, std::string* out) {
  PackBatchHead(out, batch.ts, batch.events.size());
  for (const KvEvent& e : batch.events) EncodeEvent(e, out);
  PackBatchTail(out, batch.dp_rank);
}

std::string EncodeEventBatch(const EventBatch& batch) {
  std::string out;
  EncodeEventBatch(batch, &out);
  return out;
}

void EventBatchBuilder::Add(const KvEvent& event) {
  last_start_ = events_.size();
  EncodeEvent(event, &events_);
  ++count_;
  can_remove_last_ = true;
}

void EventBatchBuilder::AddEncoded(std::string_view encoded_event) {
  last_start_ = events_.size();
  events_.append(encoded_event);
  ++count_;
  can_remove_last_ = true;
}

void EventBatchBuilder::RemoveLast() {
  if (!can_remove_last_) return;
  events_.resize(last_start_);
  --count_;
  can_remove_last_ = false;
}

void EventBatchBuilder::Finish(double ts, std::optional<int64_t> dp_rank, std::string* payload) {
  payload->clear();
  payload->reserve(payload_bound());
  PackBatchHead(payload, ts, count_);
  payload->append(events_);
  PackBatchTail(payload, dp_rank);
  events_.clear();
  count_ = 0;
  last_start_ = 0;
  can_remove_last_ = false;
}

// ---- BlockHashFromKey ------------------------------------------------------------------------

namespace {

bool IsHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// The whole of `digits` as an unsigned 64-bit number in `base`; nullopt when empty, when a
// character is not a digit of that base, or on overflow. No sign, no spaces, no prefix: the
// key must be exactly the number.
std::optional<uint64_t> ParseWholeU64(std::string_view digits, int base) {
  if (digits.empty()) return std::nullopt;
  uint64_t value = 0;
  const char* end = digits.data() + digits.size();
  auto [ptr, ec] = std::from_chars(digits.data(), end, value, base);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

}  // namespace

std::optional<BlockHash> BlockHashFromKey(std::string_view key) {
  // 1. A decimal u64, or 0x/0X followed by a hex u64: that value, unsigned (Mooncake's
  //    ParseSeqHashFromObjectKey, minus stoull's tolerance of spaces and signs).
  if (key.size() > 2 && key[0] == '0' && (key[1] == 'x' || key[1] == 'X')) {
    if (auto v = ParseWholeU64(key.substr(2), 16)) return BlockHash::Unsigned(*v);
  } else if (!key.empty() && key[0] >= '0' && key[0] <= '9') {
    if (auto v = ParseWholeU64(key, 10)) return BlockHash::Unsigned(*v);
  }
  // 2. At least 16 leading hex digits (a SHA-256 hex digest, optionally followed by more):
  //    SGLang's hash_str_to_int64, int(key[:16], 16) folded into int64. Python's int() would
  //    also accept '_' and surrounding spaces inside those 16 characters; a digest never has
  //    them, so only hex digits count.
  if (key.size() >= 16) {
    for (size_t i = 0; i < 16; ++i) {
      if (!IsHexDigit(key[i])) return std::nullopt;
    }
    uint64_t bits = 0;
    std::from_chars(key.data(), key.data() + 16, bits, 16);  // 16 hex digits always fit
    return BlockHash::Signed(static_cast<int64_t>(bits));
  }
  return std::nullopt;
}

BlockStored StoredEventFor(std::string_view key, std::string_view session_id, BlockStored writer) {
  BlockStored event = std::move(writer);
  if (event.block_hashes.empty()) {
    event.parent_block_hash.reset();
    event.token_ids.clear();
    event.block_size = 0;
    if (auto hash = BlockHashFromKey(key)) event.block_hashes.push_back(*hash);
  }
  event.lora_id.reset();
  event.medium = std::string(kMediumExternal);
  event.session_id.reset();
  if (!session_id.empty()) event.session_id = std::string(session_id);
  event.object_key = std::string(key);
  event.group_idx.reset();
  return event;
}

// ---- DescribeEvent ---------------------------------------------------------------------------

namespace {

constexpr size_t kDescribedHashes = 8;

void AppendEscaped(std::string* out, std::string_view text) {
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out->append("\\x");
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 0xf]);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
}

void AppendHash(std::string* out, const BlockHash& h) {
  if (h.is_signed) {
    out->append(std::to_string(static_cast<int64_t>(h.bits)));
  } else {
    out->append(std::to_string(h.bits));
  }
}

void AppendHashes(std::string* out, const std::vector<BlockHash>& hashes) {
  out->append(" hashes=[");
  for (size_t i = 0; i < hashes.size() && i < kDescribedHashes; ++i) {
    if (i > 0) out->push_back(',');
    AppendHash(out, hashes[i]);
  }
  if (hashes.size() > kDescribedHashes) {
    out->append(",...+" + std::to_string(hashes.size() - kDescribedHashes));
  }
  out->push_back(']');
}

void AppendKey(std::string* out, const std::optional<std::string>& key) {
  if (!key) return;
  out->append(" key=");
  AppendEscaped(out, *key);
}

}  // namespace

std::string DescribeEvent(const KvEvent& event) {
  std::string out;
  if (const auto* s = std::get_if<BlockStored>(&event)) {
    out = "BlockStored ";
    AppendEscaped(&out, s->medium);
    out.append(" session=");
    if (s->session_id) {
      AppendEscaped(&out, *s->session_id);
    } else {
      out.push_back('-');
    }
    AppendHashes(&out, s->block_hashes);
    out.append(" parent=");
    if (s->parent_block_hash) {
      AppendHash(&out, *s->parent_block_hash);
    } else {
      out.push_back('-');
    }
    out.append(" tokens=" + std::to_string(s->token_ids.size()));
    out.append(" block_size=" + std::to_string(s->block_size));
    if (s->lora_name) {
      out.append(" lora=");
      AppendEscaped(&out, *s->lora_name);
    }
    if (s->group_idx) out.append(" group=" + std::to_string(*s->group_idx));
    AppendKey(&out, s->object_key);
  } else if (const auto* r = std::get_if<BlockRemoved>(&event)) {
    out = "BlockRemoved ";
    AppendEscaped(&out, r->medium);
    AppendHashes(&out, r->block_hashes);
    AppendKey(&out, r->object_key);
  } else {
    out = "AllBlocksCleared";
  }
  return out;
}

// ---- seq frames ------------------------------------------------------------------------------

std::string EncodeSeq(uint64_t seq) {
  std::string frame(8, '\0');
  for (int i = 7; i >= 0; --i) {
    frame[i] = static_cast<char>(seq & 0xff);
    seq >>= 8;
  }
  return frame;
}

std::optional<uint64_t> DecodeSeq(std::string_view frame) {
  if (frame.size() != 8) return std::nullopt;
  uint64_t seq = 0;
  for (unsigned char b : frame) seq = (seq << 8) | b;
  return seq;
}

}  // namespace kvagent::events

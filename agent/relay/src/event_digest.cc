// ForEachEvent: a bounds-checked msgpack reader for the payload format of docs/events.md.
#include "event_digest.h"

#include <cstring>

namespace kvagent::relay {
namespace {

constexpr int kMaxDepth = 32;  // a valid payload nests 4 deep; unknown values may nest more

class Reader {
 public:
  explicit Reader(std::string_view bytes) : p_(bytes.data()), end_(bytes.data() + bytes.size()) {}
  bool done() const { return p_ == end_; }

  bool ArrayHeader(uint32_t* n) { return Header(0x90, 0xdc, n); }
  bool MapHeader(uint32_t* n) { return Header(0x80, 0xde, n); }

  bool Str(std::string_view* s) {
    uint8_t b;
    if (!Byte(&b)) return false;
    uint32_t n = 0;
    if (b >= 0xa0 && b <= 0xbf) {
      n = b & 0x1f;
    } else if (b == 0xd9) {
      if (!Be(1, &n)) return false;
    } else if (b == 0xda) {
      if (!Be(2, &n)) return false;
    } else if (b == 0xdb) {
      if (!Be(4, &n)) return false;
    } else {
      return false;
    }
    if (static_cast<size_t>(end_ - p_) < n) return false;
    *s = std::string_view(p_, n);
    p_ += n;
    return true;
  }

  bool Nil() {
    if (p_ == end_ || static_cast<uint8_t>(*p_) != 0xc0) return false;
    ++p_;
    return true;
  }

  // An integer: its 64 bits and whether it was written negative.
  bool Int(uint64_t* bits, bool* negative) {
    uint8_t b;
    if (!Byte(&b)) return false;
    *negative = false;
    if (b <= 0x7f) {
      *bits = b;
    } else if (b >= 0xe0) {
      *bits = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(b)));
      *negative = true;
    } else if (b >= 0xcc && b <= 0xcf) {
      const int width = 1 << (b - 0xcc);
      return BeWide(width, bits);
    } else if (b >= 0xd0 && b <= 0xd3) {
      const int width = 1 << (b - 0xd0);
      uint64_t raw;
      if (!BeWide(width, &raw)) return false;
      const int shift = 64 - 8 * width;  // sign-extend
      *bits = static_cast<uint64_t>(static_cast<int64_t>(raw << shift) >> shift);
      *negative = static_cast<int64_t>(*bits) < 0;
      return true;
    } else {
      return false;
    }
    return true;
  }

  // Any value, skipped.
  bool Skip(int depth = 0) {
    if (depth > kMaxDepth) return false;
    uint8_t b;
    if (!Peek(&b)) return false;
    if (b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3)) {
      uint64_t bits = 0;
      bool negative;
      return Int(&bits, &negative);
    }
    if ((b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb)) {
      std::string_view s;
      return Str(&s);
    }
    if ((b >= 0x90 && b <= 0x9f) || b == 0xdc || b == 0xdd) {
      uint32_t n = 0;
      if (!ArrayHeader(&n)) return false;
      for (uint32_t i = 0; i < n; ++i) {
        if (!Skip(depth + 1)) return false;
      }
      return true;
    }
    if ((b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf) {
      uint32_t n = 0;
      if (!MapHeader(&n)) return false;
      for (uint32_t i = 0; i < 2 * n; ++i) {
        if (!Skip(depth + 1)) return false;
      }
      return true;
    }
    ++p_;
    switch (b) {
      case 0xc0:  // nil
      case 0xc2:  // false
      case 0xc3:  // true
        return true;
      case 0xca:  // float32
        return Advance(4);
      case 0xcb:  // float64
        return Advance(8);
      case 0xc4:  // bin8, bin16, bin32
      case 0xc5:
      case 0xc6: {
        uint32_t n;
        return Be(1 << (b - 0xc4), &n) && Advance(n);
      }
      case 0xd4:  // fixext 1, 2, 4, 8, 16
      case 0xd5:
      case 0xd6:
      case 0xd7:
      case 0xd8:
        return Advance(1 + (size_t{1} << (b - 0xd4)));
      case 0xc7:  // ext8, ext16, ext32
      case 0xc8:
      case 0xc9: {
        uint32_t n;
        return Be(1 << (b - 0xc7), &n) && Advance(size_t{1} + n);
      }
      default:
        return false;  // 0xc1 is never used
    }
  }

 private:
  bool Peek(uint8_t* b) const {
    if (p_ == end_) return false;
    *b = static_cast<uint8_t>(*p_);
    return true;
  }
  bool Byte(uint8_t* b) {
    if (!Peek(b)) return false;
    ++p_;
    return true;
  }
  bool Advance(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) return false;
    p_ += n;
    return true;
  }
  bool BeWide(int width, uint64_t* v) {
    if (end_ - p_ < width) return false;
    uint64_t x = 0;
    for (int i = 0; i < width; ++i) x = x << 8 | static_cast<uint8_t>(p_[i]);
    p_ += width;
    *v = x;
    return true;
  }
  bool Be(int width, uint32_t* v) {
    uint64_t x;
    if (!BeWide(width, &x)) return false;
    *v = static_cast<uint32_t>(x);
    return true;
  }
  // A fix header in [fix, fix + 15], or the 16- (wide) and 32-bit (wide + 1) forms.
  bool Header(uint8_t fix, uint8_t wide, uint32_t* n) {
    uint8_t b;
    if (!Byte(&b)) return false;
    if (b >= fix && b <= fix + 0x0f) {
      *n = b & 0x0f;
      return true;
    }
    if (b == wide) return Be(2, n);
    if (b == wide + 1) return Be(4, n);
    return false;
  }

  const char* p_;
  const char* end_;
};

bool Hash(Reader& r, events::BlockHash* h) {
  uint64_t bits = 0;
  bool negative;
  if (!r.Int(&bits, &negative)) return false;
  *h = negative ? events::BlockHash::Signed(static_cast<int64_t>(bits))
                : events::BlockHash::Unsigned(bits);
  return true;
}

bool OptionalInt(Reader& r, std::optional<int64_t>* v) {
  if (r.Nil()) {
    v->reset();
    return true;
  }
  uint64_t bits = 0;
  bool negative;
  if (!r.Int(&bits, &negative)) return false;
  *v = static_cast<int64_t>(bits);
  return true;
}

bool OptionalStr(Reader& r, std::optional<std::string_view>* v) {
  if (r.Nil()) {
    v->reset();
    return true;
  }
  std::string_view s;
  if (!r.Str(&s)) return false;
  *v = s;
  return true;
}

// The known keys whose value ReadEvent checks, as bits: which ones held a value of another type
// (a strict consumer rejects that only for the keys its event type reads: BlockStored all of
// them, BlockRemoved block_hashes, medium and object_key, AllBlocksCleared none; it ignores the
// others, as it ignores unknown keys).
enum FieldBit : uint32_t {
  kBlockHashesBit = 1u << 0,
  kParentBit = 1u << 1,
  kTokenIdsBit = 1u << 2,
  kBlockSizeBit = 1u << 3,
  kLoraIdBit = 1u << 4,
  kMediumBit = 1u << 5,
  kLoraNameBit = 1u << 6,
  kSessionIdBit = 1u << 7,
  kObjectKeyBit = 1u << 8,
  kGroupIdxBit = 1u << 9,
};
constexpr uint32_t kRemovedReads = kBlockHashesBit | kMediumBit | kObjectKeyBit;

// One event map into `d` (reused: its vectors keep their capacity). False for what strict
// consumers reject (kv_event_decode.cc) or cannot read at all; a payload it reads, they read
// alike (fuzz/fuzz_relay_digest.cc checks both ways).
bool ReadEvent(Reader& r, EventDigest* d) {
  uint32_t fields;
  if (!r.MapHeader(&fields)) return false;
  d->block_hashes.clear();
  d->parent_block_hash.reset();
  d->token_count = 0;
  TokenHash tokens;
  d->block_size = 0;
  d->lora_id.reset();
  d->medium = {};
  d->lora_name.reset();
  d->session_id.reset();
  d->object_key.reset();
  d->group_idx.reset();
  std::optional<std::string_view> type;
  uint32_t mistyped = 0;  // FieldBits
  for (uint32_t f = 0; f < fields; ++f) {
    std::string_view key;
    if (!r.Str(&key)) return false;
    const Reader value = r;  // where the value starts, to skip it whole when it is mistyped
    uint32_t field = 0;
    bool ok = true;
    if (key == "type") {
      std::string_view t;
      ok = r.Str(&t);
      type = t;
    } else if (key == "block_hashes") {
      field = kBlockHashesBit;
      uint32_t n = 0;
      ok = r.ArrayHeader(&n);
      for (uint32_t i = 0; ok && i < n; ++i) {
        events::BlockHash h;
        ok = Hash(r, &h);
        d->block_hashes.push_back(h);
      }
    } else if (key == "parent_block_hash") {
      field = kParentBit;
      if (!r.Nil()) {
        events::BlockHash h;
        ok = Hash(r, &h);
        d->parent_block_hash = h;
      }
    } else if (key == "token_ids") {
      field = kTokenIdsBit;
      uint32_t n = 0;
      ok = r.ArrayHeader(&n);
      for (uint32_t i = 0; ok && i < n; ++i) {
        uint64_t bits = 0;
        bool negative;
        ok = r.Int(&bits, &negative) && !negative && bits <= UINT32_MAX;
        tokens.Add(static_cast<uint32_t>(bits));
      }
      d->token_count = n;
    } else if (key == "block_size") {
      field = kBlockSizeBit;
      uint64_t bits = 0;
      bool negative;
      ok = r.Int(&bits, &negative) && !negative && bits <= UINT32_MAX;
      d->block_size = static_cast<uint32_t>(bits);
    } else if (key == "lora_id") {
      field = kLoraIdBit;
      ok = OptionalInt(r, &d->lora_id);
    } else if (key == "medium") {
      field = kMediumBit;
      ok = r.Str(&d->medium);
    } else if (key == "lora_name") {
      field = kLoraNameBit;
      ok = OptionalStr(r, &d->lora_name);
    } else if (key == "session_id") {
      field = kSessionIdBit;
      ok = OptionalStr(r, &d->session_id);
    } else if (key == "object_key") {
      field = kObjectKeyBit;
      ok = OptionalStr(r, &d->object_key);
    } else if (key == "group_idx") {
      field = kGroupIdxBit;
      ok = OptionalInt(r, &d->group_idx);
    } else {
      ok = r.Skip(2);
    }
    if (ok) continue;
    // A known key with a value of another type: whether that matters depends on the event's
    // type, which may come later in the map. Skip the value whole (not a value at all: the
    // payload is unreadable) and decide below.
    if (field == 0) return false;
    r = value;
    if (!r.Skip(2)) return false;
    mistyped |= field;
  }
  d->token_hash = tokens.value();
  if (type == "BlockStored") {
    d->type = EventDigest::Type::kStored;
    return mistyped == 0;
  }
  if (type == "BlockRemoved") {
    d->type = EventDigest::Type::kRemoved;
    return (mistyped & kRemovedReads) == 0;
  }
  if (type == "AllBlocksCleared") {
    d->type = EventDigest::Type::kCleared;
    return true;
  }
  return false;
}

}  // namespace

EventDigest DigestOf(const events::BlockStored& e) {
  EventDigest d;
  d.type = EventDigest::Type::kStored;
  d.block_hashes = e.block_hashes;
  d.parent_block_hash = e.parent_block_hash;
  d.token_count = e.token_ids.size();
  TokenHash tokens;
  for (uint32_t t : e.token_ids) tokens.Add(t);
  d.token_hash = tokens.value();
  d.block_size = e.block_size;
  d.lora_id = e.lora_id;
  d.medium = e.medium;
  if (e.lora_name) d.lora_name = *e.lora_name;
  if (e.session_id) d.session_id = *e.session_id;
  if (e.object_key) d.object_key = *e.object_key;
  d.group_idx = e.group_idx;
  return d;
}

bool ForEachEvent(std::string_view payload, const std::function<void(const EventDigest&)>& each) {
  Reader r(payload);
  uint32_t top;
  if (!r.ArrayHeader(&top) || top != 3) return false;
  if (!r.Skip()) return false;  // ts
  uint32_t count;
  if (!r.ArrayHeader(&count)) return false;
  EventDigest d;
  for (uint32_t i = 0; i < count; ++i) {
    if (!ReadEvent(r, &d)) return false;
    each(d);
  }
  return r.Skip() && r.done();  // dp_rank, and nothing after
}

}  // namespace kvagent::relay

// The decoding half of the KV-event codec: as strict as the strictest consumer of docs/events.md.
//
// What a strict consumer rejects, and so what we reject (docs/events.md, "What strict consumers
// check"):
//  - python-msgpack `unpackb(raw=False, strict_map_key=True)`: any str anywhere that is not
//    valid UTF-8 (also inside keys we do not know), any map key that is not a string, bytes
//    after the first object;
//  - Dynamo (rmp-serde): a batch that is not exactly 3 elements, an unknown "type", a hash that
//    is not an integer (bin), nil or missing token_ids/block_size/block_hashes;
//  - vLLM's msgspec types: a missing key without a default (lora_id, medium, lora_name on
//    BlockStored; medium on BlockRemoved), a wrong type for a known key.
// On top of that the rules docs/events.md states for our own stream: session_id only on BlockStored
// and never empty, medium uppercase, optional keys omitted rather than nil, and
// len(token_ids) == block_size * len(block_hashes) when token IDs are given. Unknown keys are
// ignored, as every consumer does.
#include <array>
#include <cstring>
#include <limits>

#include <msgpack.hpp>

#include "kvagent/common/validate.h"
#include "kvagent/events/kv_event.h"

namespace kvagent::events {
namespace {

using msgpack::object;
namespace mtype = msgpack::type;

// Nesting of a valid payload is 4 (batch, events, event, hash list); unknown values may nest
// further, but nothing legitimate comes close to this.
constexpr size_t kMaxDepth = 64;

const char* TypeName(const object& o) {
  switch (o.type) {
    case mtype::NIL:
      return "nil";
    case mtype::BOOLEAN:
      return "bool";
    case mtype::POSITIVE_INTEGER:
    case mtype::NEGATIVE_INTEGER:
      return "int";
    case mtype::FLOAT32:
    case mtype::FLOAT64:
      return "float";
    case mtype::STR:
      return "str";
    case mtype::BIN:
      return "bin";
    case mtype::ARRAY:
      return "array";
    case mtype::MAP:
      return "map";
    case mtype::EXT:
      return "ext";
  }
  return "unknown";
}

std::string_view StrOf(const object& o) { return {o.via.str.ptr, o.via.str.size}; }

// Where a value sits in the payload, as a chain of frames on the stack: no allocation while
// decoding succeeds; rendered ("events[2] (BlockStored).token_ids[5]") only for an error.
// A Path never outlives the call that made it, and its text points into the payload or into
// string literals, both alive for the whole decode.
class Path {
 public:
  explicit Path(std::string_view root) : text_(root) {}
  Path Field(std::string_view name) const { return Path(this, Kind::kField, name, 0); }
  Path Index(size_t i) const { return Path(this, Kind::kIndex, {}, i); }
  Path Label(std::string_view label) const { return Path(this, Kind::kLabel, label, 0); }

  std::string str() const {
    std::string out = parent_ ? parent_->str() : std::string();
    switch (kind_) {
      case Kind::kRoot:
        out.append(text_);
        break;
      case Kind::kField:
        out.append(".").append(text_);
        break;
      case Kind::kIndex:
        out.append("[" + std::to_string(index_) + "]");
        break;
      case Kind::kLabel:
        out.append(" (").append(text_).append(")");
        break;
    }
    return out;
  }

 private:
  enum class Kind { kRoot, kField, kIndex, kLabel };
  Path(const Path* parent, Kind kind, std::string_view text, size_t index)
      : parent_(parent), kind_(kind), text_(text), index_(index) {}

  const Path* parent_ = nullptr;
  Kind kind_ = Kind::kRoot;
  std::string_view text_;
  size_t index_ = 0;
};

Status Invalid(const Path& where, const std::string& what) {
  return InvalidParams("KV event payload: " + where.str() + ": " + what);
}

Status WrongType(const Path& where, const char* expected, const object& o) {
  return Invalid(where, std::string("expected ") + expected + ", got " + TypeName(o));
}

// The checks python-msgpack applies to the whole tree while decoding, whatever the schema:
// every str is valid UTF-8 (raw=False) and every map key is a str (strict_map_key; we also
// refuse bin keys, which docs/events.md never uses).
Status CheckTree(const object& o, const Path& where) {
  switch (o.type) {
    case mtype::STR:
      if (auto err = FindInvalidUtf8(StrOf(o))) {
        return Invalid(where, "invalid UTF-8 at byte " + std::to_string(err->offset) + " (" +
                                  err->reason + "); text must be msgpack str holding UTF-8");
      }
      return Status::Ok();
    case mtype::ARRAY:
      for (uint32_t i = 0; i < o.via.array.size; ++i) {
        const object& e = o.via.array.ptr[i];
        // Numbers (token IDs, hashes) cannot fail: only descend where text can hide.
        if (e.type != mtype::STR && e.type != mtype::ARRAY && e.type != mtype::MAP) continue;
        KVAGENT_RETURN_IF_ERROR(CheckTree(e, where.Index(i)));
      }
      return Status::Ok();
    case mtype::MAP:
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        const object& key = o.via.map.ptr[i].key;
        if (key.type != mtype::STR) {
          return Invalid(where, std::string("map key #") + std::to_string(i) + " is " +
                                    TypeName(key) + "; map keys must be strings");
        }
        KVAGENT_RETURN_IF_ERROR(CheckTree(key, where.Field("<key>")));
        KVAGENT_RETURN_IF_ERROR(CheckTree(o.via.map.ptr[i].val, where.Field(StrOf(key))));
      }
      return Status::Ok();
    default:
      return Status::Ok();
  }
}

// The batch's three elements get their own names in messages ("events[0].medium").
Status CheckBatchTree(const object& root) {
  if (root.type != mtype::ARRAY || root.via.array.size != 3) return CheckTree(root, Path("batch"));
  static constexpr std::string_view kNames[3] = {"ts", "events", "dp_rank"};
  for (uint32_t i = 0; i < 3; ++i) {
    KVAGENT_RETURN_IF_ERROR(CheckTree(root.via.array.ptr[i], Path(kNames[i])));
  }
  return Status::Ok();
}

// ---- typed readers -------------------------------------------------------------------------

Result<BlockHash> ReadHash(const object& o, const Path& where) {
  if (o.type == mtype::POSITIVE_INTEGER) return BlockHash::Unsigned(o.via.u64);
  if (o.type == mtype::NEGATIVE_INTEGER) return BlockHash::Signed(o.via.i64);
  return WrongType(where, "an integer hash (int64 or uint64; never bin)", o);
}

Result<std::vector<BlockHash>> ReadHashes(const object& o, const Path& where) {
  if (o.type != mtype::ARRAY) return WrongType(where, "an array of integer hashes", o);
  std::vector<BlockHash> hashes;
  hashes.reserve(o.via.array.size);
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    auto h = ReadHash(o.via.array.ptr[i], where.Index(i));
    if (!h.ok()) return h.status();
    hashes.push_back(*h);
  }
  return hashes;
}

bool IsU32(const object& o) {
  return o.type == mtype::POSITIVE_INTEGER && o.via.u64 <= std::numeric_limits<uint32_t>::max();
}

Status NotU32(const object& o, const Path& where) {
  if (o.type == mtype::POSITIVE_INTEGER || o.type == mtype::NEGATIVE_INTEGER) {
    return Invalid(where, "integer out of the u32 range");
  }
  return WrongType(where, "a u32 integer", o);
}

Result<uint32_t> ReadU32(const object& o, const Path& where) {
  if (!IsU32(o)) return NotU32(o, where);
  return static_cast<uint32_t>(o.via.u64);
}

Result<int64_t> ReadI64(const object& o, const Path& where) {
  if (o.type == mtype::NEGATIVE_INTEGER) return o.via.i64;
  if (o.type == mtype::POSITIVE_INTEGER) {
    if (o.via.u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(where, "integer out of the int64 range");
    }
    return static_cast<int64_t>(o.via.u64);
  }
  return WrongType(where, "an integer", o);
}

Result<std::string> ReadStr(const object& o, const Path& where) {
  if (o.type != mtype::STR) return WrongType(where, "a str", o);
  return std::string(StrOf(o));
}

Result<std::optional<std::string>> ReadStrOrNil(const object& o, const Path& where) {
  if (o.type == mtype::NIL) return std::optional<std::string>();
  if (o.type != mtype::STR) return WrongType(where, "a str or nil", o);
  return std::optional<std::string>(std::string(StrOf(o)));
}

Result<std::string> ReadMedium(const object& o, const Path& where) {
  auto medium = ReadStr(o, where);
  if (!medium.ok()) return medium;
  if (medium->empty()) return Invalid(where, "medium is empty; use EXTERNAL or DISK");
  for (char c : *medium) {
    if (c >= 'a' && c <= 'z') {
      return Invalid(where,
                     "medium \"" + *medium + "\" must be uppercase (EXTERNAL, DISK, GPU...)");
    }
  }
  return medium;
}

// ---- events --------------------------------------------------------------------------------

// The keys docs/events.md defines; anything else in an event map is ignored.
enum Key : size_t {
  kType,
  kBlockHashes,
  kParentBlockHash,
  kTokenIds,
  kBlockSize,
  kLoraId,
  kMedium,
  kLoraName,
  kGroupIdx,
  kSessionId,
  kObjectKey,
  kKeyCount
};

constexpr std::array<std::string_view, kKeyCount> kKeyNames = {
    "type",   "block_hashes", "parent_block_hash", "token_ids",  "block_size", "lora_id",
    "medium", "lora_name",    "group_idx",         "session_id", "object_key"};

using EventKeys = std::array<const object*, kKeyCount>;

// The known key `name` is, or kKeyCount. Length and first letter tell the known keys apart,
// so at most one string comparison confirms the match.
size_t KnownKey(std::string_view name) {
  if (name.empty()) return kKeyCount;
  size_t k = kKeyCount;
  switch (name.size()) {
    case 4:
      k = kType;
      break;
    case 6:
      k = kMedium;
      break;
    case 7:
      k = kLoraId;
      break;
    case 9:
      k = name[0] == 't' ? kTokenIds : name[0] == 'l' ? kLoraName : kGroupIdx;
      break;
    case 10:
      k = name[0] == 'b' ? kBlockSize : name[0] == 's' ? kSessionId : kObjectKey;
      break;
    case 12:
      k = kBlockHashes;
      break;
    case 17:
      k = kParentBlockHash;
      break;
    default:
      return kKeyCount;
  }
  return name == kKeyNames[k] ? k : kKeyCount;
}

Result<EventKeys> IndexKeys(const object& map, const Path& where) {
  EventKeys keys{};
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const std::string_view name = StrOf(map.via.map.ptr[i].key);  // a str: CheckTree ran
    const size_t k = KnownKey(name);
    if (k == kKeyCount) continue;  // unknown keys are ignored
    if (keys[k] != nullptr) return Invalid(where, "duplicate key \"" + std::string(name) + "\"");
    keys[k] = &map.via.map.ptr[i].val;
  }
  return keys;
}

Status Require(const EventKeys& keys, Key k, const Path& where, std::string_view type) {
  if (keys[k] != nullptr) return Status::Ok();
  return Invalid(where, std::string(type) + " needs key \"" + std::string(kKeyNames[k]) + "\"");
}

// An optional key of docs/events.md is omitted when unset; nil in its place is a producer bug.
Status RejectNil(const object* o, const Path& where) {
  if (o != nullptr && o->type == mtype::NIL) {
    return Invalid(where, "is nil; an optional key is omitted when it is unset");
  }
  return Status::Ok();
}

#define KVAGENT_ASSIGN_OR_RETURN(lhs, expr)           \
  do {                                                \
    auto kv_result_ = (expr);                         \
    if (!kv_result_.ok()) return kv_result_.status(); \
    lhs = std::move(*kv_result_);                     \
  } while (0)

Status ReadTokens(const object& tokens, const Path& where, std::vector<uint32_t>* out) {
  if (tokens.type != mtype::ARRAY) {
    return WrongType(where, "an array of u32 (use [] when unknown, never nil)", tokens);
  }
  out->reserve(tokens.via.array.size);
  for (uint32_t i = 0; i < tokens.via.array.size; ++i) {
    const object& t = tokens.via.array.ptr[i];
    if (!IsU32(t)) return NotU32(t, where.Index(i));
    out->push_back(static_cast<uint32_t>(t.via.u64));
  }
  return Status::Ok();
}

Result<KvEvent> ReadStored(const EventKeys& keys, const Path& at) {
  for (Key k :
       {kBlockHashes, kParentBlockHash, kTokenIds, kBlockSize, kLoraId, kMedium, kLoraName}) {
    KVAGENT_RETURN_IF_ERROR(Require(keys, k, at, "BlockStored"));
  }
  BlockStored e;
  KVAGENT_ASSIGN_OR_RETURN(e.block_hashes,
                           ReadHashes(*keys[kBlockHashes], at.Field("block_hashes")));
  if (keys[kParentBlockHash]->type != mtype::NIL) {
    KVAGENT_ASSIGN_OR_RETURN(e.parent_block_hash,
                             ReadHash(*keys[kParentBlockHash], at.Field("parent_block_hash")));
  }
  KVAGENT_RETURN_IF_ERROR(ReadTokens(*keys[kTokenIds], at.Field("token_ids"), &e.token_ids));
  KVAGENT_ASSIGN_OR_RETURN(e.block_size, ReadU32(*keys[kBlockSize], at.Field("block_size")));
  if (!e.token_ids.empty() &&
      e.token_ids.size() != uint64_t{e.block_size} * e.block_hashes.size()) {
    return Invalid(at.Field("token_ids"),
                   std::to_string(e.token_ids.size()) + " token IDs, but block_size " +
                       std::to_string(e.block_size) + " x " +
                       std::to_string(e.block_hashes.size()) +
                       " block_hashes needs exactly their product (or [] when unknown)");
  }
  if (keys[kLoraId]->type != mtype::NIL) {
    KVAGENT_ASSIGN_OR_RETURN(e.lora_id, ReadI64(*keys[kLoraId], at.Field("lora_id")));
  }
  KVAGENT_ASSIGN_OR_RETURN(e.medium, ReadMedium(*keys[kMedium], at.Field("medium")));
  KVAGENT_ASSIGN_OR_RETURN(e.lora_name, ReadStrOrNil(*keys[kLoraName], at.Field("lora_name")));
  for (Key k : {kGroupIdx, kSessionId, kObjectKey}) {
    KVAGENT_RETURN_IF_ERROR(RejectNil(keys[k], at.Field(kKeyNames[k])));
  }
  if (keys[kGroupIdx]) {
    KVAGENT_ASSIGN_OR_RETURN(e.group_idx, ReadI64(*keys[kGroupIdx], at.Field("group_idx")));
  }
  if (keys[kSessionId]) {
    const Path where = at.Field("session_id");
    std::string id;
    KVAGENT_ASSIGN_OR_RETURN(id, ReadStr(*keys[kSessionId], where));
    if (id.empty()) return Invalid(where, "is empty; an untagged object omits the key");
    if (id.size() > kMaxSessionIdBytes) {  // UTF-8 was checked with the whole tree
      return Invalid(where, std::to_string(id.size()) + " bytes; session IDs are at most " +
                                std::to_string(kMaxSessionIdBytes) + " bytes");
    }
    e.session_id = std::move(id);
  }
  if (keys[kObjectKey]) {
    KVAGENT_ASSIGN_OR_RETURN(e.object_key, ReadStr(*keys[kObjectKey], at.Field("object_key")));
  }
  return KvEvent(std::move(e));
}

Result<KvEvent> ReadRemoved(const EventKeys& keys, const Path& at) {
  KVAGENT_RETURN_IF_ERROR(Require(keys, kBlockHashes, at, "BlockRemoved"));
  KVAGENT_RETURN_IF_ERROR(Require(keys, kMedium, at, "BlockRemoved"));
  BlockRemoved e;
  KVAGENT_ASSIGN_OR_RETURN(e.block_hashes,
                           ReadHashes(*keys[kBlockHashes], at.Field("block_hashes")));
  KVAGENT_ASSIGN_OR_RETURN(e.medium, ReadMedium(*keys[kMedium], at.Field("medium")));
  KVAGENT_RETURN_IF_ERROR(RejectNil(keys[kObjectKey], at.Field("object_key")));
  if (keys[kObjectKey]) {
    KVAGENT_ASSIGN_OR_RETURN(e.object_key, ReadStr(*keys[kObjectKey], at.Field("object_key")));
  }
  return KvEvent(std::move(e));
}

Result<KvEvent> ReadEvent(const object& o, const Path& where) {
  if (o.type == mtype::ARRAY) {
    return Invalid(where, "an array (the legacy positional form); events are maps with \"type\"");
  }
  if (o.type != mtype::MAP) return WrongType(where, "a map with a \"type\" key", o);
  EventKeys keys;
  KVAGENT_ASSIGN_OR_RETURN(keys, IndexKeys(o, where));
  if (keys[kType] == nullptr) return Invalid(where, "no \"type\" key");
  const object& type_obj = *keys[kType];
  if (type_obj.type != mtype::STR) return WrongType(where.Field("type"), "a str", type_obj);
  const std::string_view type = StrOf(type_obj);
  const Path at = where.Label(type);
  if (type != "BlockStored" && keys[kSessionId] != nullptr) {
    return Invalid(at.Field("session_id"), "sessions appear only on BlockStored");
  }
  if (type == "BlockStored") return ReadStored(keys, at);
  if (type == "BlockRemoved") return ReadRemoved(keys, at);
  if (type == "AllBlocksCleared") return KvEvent(AllBlocksCleared{});
  return Invalid(where.Field("type"), "unknown event type \"" + std::string(type) +
                                          "\"; known: BlockStored, BlockRemoved, AllBlocksCleared");
}

Result<EventBatch> ReadBatch(const object& root) {
  if (root.type != mtype::ARRAY || root.via.array.size != 3) {
    const std::string got = root.type == mtype::ARRAY
                                ? "an array of " + std::to_string(root.via.array.size)
                                : std::string(TypeName(root));
    return Invalid(Path("batch"),
                   "expected an array of exactly 3 [ts, events, dp_rank], got " + got);
  }
  const object& ts = root.via.array.ptr[0];
  const object& events = root.via.array.ptr[1];
  const object& rank = root.via.array.ptr[2];
  EventBatch batch;
  if (ts.type == mtype::FLOAT32 || ts.type == mtype::FLOAT64) {
    batch.ts = ts.via.f64;
  } else if (ts.type == mtype::POSITIVE_INTEGER) {
    batch.ts = static_cast<double>(ts.via.u64);  // widened, as rmp-serde and msgspec do
  } else if (ts.type == mtype::NEGATIVE_INTEGER) {
    batch.ts = static_cast<double>(ts.via.i64);
  } else {
    return WrongType(Path("ts"), "a float (seconds since the epoch)", ts);
  }
  const Path events_path("events");
  if (events.type != mtype::ARRAY) return WrongType(events_path, "an array of event maps", events);
  if (rank.type != mtype::NIL) {
    const Path rank_path("dp_rank");
    int64_t r = 0;
    KVAGENT_ASSIGN_OR_RETURN(r, ReadI64(rank, rank_path));
    if (r < std::numeric_limits<int32_t>::min() || r > std::numeric_limits<int32_t>::max()) {
      return Invalid(rank_path, std::to_string(r) + " does not fit in int32 (Dynamo reads i32)");
    }
    batch.dp_rank = r;
  } else {
    batch.dp_rank.reset();
  }
  batch.events.reserve(events.via.array.size);
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    Result<KvEvent> e = ReadEvent(events.via.array.ptr[i], events_path.Index(i));
    if (!e.ok()) return e.status();
    batch.events.push_back(std::move(*e));
  }
  return batch;
}

#undef KVAGENT_ASSIGN_OR_RETURN

}  // namespace

Result<EventBatch> DecodeEventBatch(std::string_view payload) {
  const Path where("payload");
  if (payload.empty()) return Invalid(where, "empty; expected a msgpack [ts, events, dp_rank]");
  // Limits derived from the payload size, as python-msgpack's unpackb does: no container can
  // declare more elements than there are bytes, so a 5-byte payload claiming 2^32 elements
  // cannot make the parser allocate gigabytes.
  const size_t n = payload.size();
  const msgpack::unpack_limit limits(n, n / 2, n, n, n, kMaxDepth);
  // Strings reference `payload`, which outlives the object handle below.
  auto reference = [](mtype::object_type, size_t, void*) { return true; };
  msgpack::object_handle handle;
  size_t offset = 0;
  try {
    handle = msgpack::unpack(payload.data(), n, offset, reference, nullptr, limits);
  } catch (const std::exception& e) {
    return Invalid(where, std::string("not valid msgpack (") + e.what() + ")");
  }
  if (offset != n) {
    return Invalid(where, std::to_string(n - offset) +
                              " bytes follow the batch; a payload "
                              "is exactly one msgpack array");
  }
  KVAGENT_RETURN_IF_ERROR(CheckBatchTree(handle.get()));
  return ReadBatch(handle.get());
}

}  // namespace kvagent::events

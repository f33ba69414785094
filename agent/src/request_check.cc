#include "request_check.h"

#include <string>
#include <string_view>

#include "kvagent/common/validate.h"
#include "kvagent/schemas/flatbuffer_checks.h"
#include "process_memory.h"

namespace kvagent::agent {
namespace {

using flatbuffers::uoffset_t;
using proto::Op;

// Verifier limits: a request is a flat table with per-key vectors; BlockMeta tables are the
// deepest thing in it. Anything deeper or larger is garbage.
constexpr uoffset_t kMaxDepth = 8;
constexpr uoffset_t kMaxTables = 4 * kMaxBatchKeys + 16;

std::string_view View(const flatbuffers::String* s) {
  return s == nullptr ? std::string_view() : std::string_view(s->c_str(), s->size());
}

template <typename T>
size_t Count(const flatbuffers::Vector<T>* v) {
  return v == nullptr ? 0 : v->size();
}

Status MustBeAbsent(size_t count, const char* field, Op op) {
  if (count == 0) return Status::Ok();
  return InvalidParams(std::string(field) + " is not used by " + proto::EnumNameOp(op) +
                       "; leave it empty");
}

// A put's values or a get's targets in the client's own memory (Request.memory).
Status CheckMemory(const proto::Request& req, size_t key_count, bool process_memory, bool values) {
  if (!process_memory) {
    return InvalidParams(
        "memory ranges need process memory, which the agent did not grant this client at "
        "connect (see its log); pass arena buffers instead");
  }
  if (Count(req.buffers()) != 0) {
    return InvalidParams("the request gives both buffers and memory ranges; give one of them");
  }
  const auto* counts = req.memory_counts();
  const size_t ranges = Count(req.memory());
  if (Count(counts) != key_count) {
    return InvalidParams("memory_counts has " + std::to_string(Count(counts)) + " entries for " +
                         std::to_string(key_count) + " keys; give one count per key");
  }
  size_t first = 0;
  for (size_t i = 0; i < key_count; ++i) {
    const uint32_t n = counts->Get(static_cast<uoffset_t>(i));
    auto what = [i] { return "memory of key " + std::to_string(i); };
    if (n == 0 || n > ranges - first) {
      return InvalidParams(what() + ": memory_counts[" + std::to_string(i) + "] is " +
                           std::to_string(n) + " with " + std::to_string(ranges - first) +
                           " ranges left; give at least one range per key");
    }
    auto length = RangesLength(ProcessRanges(req, first, n), std::string_view());
    if (!length.ok()) length = RangesLength(ProcessRanges(req, first, n), what());
    KVAGENT_RETURN_IF_ERROR(length.status());
    if (values && *length == 0)
      return InvalidParams(what() + " is empty; a value is at least 1 byte");
    if (*length > kMaxValueBytes) {
      return InvalidParams(what() + " holds " + std::to_string(*length) +
                           " bytes; a value has at most " + std::to_string(kMaxValueBytes));
    }
    first += n;
  }
  if (first != ranges) {
    return InvalidParams("memory holds " + std::to_string(ranges) +
                         " ranges but memory_counts "
                         "add up to " +
                         std::to_string(first));
  }
  return Status::Ok();
}

Status CheckBuffers(const proto::Request& req, size_t key_count, uint64_t arena_bytes,
                    bool process_memory, bool values) {
  if (req.memory_counts() != nullptr || req.memory() != nullptr) {
    return CheckMemory(req, key_count, process_memory, values);
  }
  const auto* buffers = req.buffers();
  if (Count(buffers) != key_count) {
    return InvalidParams("buffers has " + std::to_string(Count(buffers)) + " entries for " +
                         std::to_string(key_count) + " keys; give one buffer per key");
  }
  for (size_t i = 0; i < key_count; ++i) {
    const proto::BufferRef* b = buffers->Get(static_cast<uoffset_t>(i));
    auto what = [i] { return "buffers[" + std::to_string(i) + "]"; };
    KVAGENT_RETURN_IF_ERROR(CheckNamed(
        [&](std::string_view w) {
          return ValidateBufferRef(b->offset(), b->length(), arena_bytes, w);
        },
        what));
    if (values && b->length() == 0) {
      return InvalidParams(what() + " is empty; a value is at least 1 byte");
    }
  }
  return Status::Ok();
}

Status CheckBlocks(const proto::Request& req, size_t key_count) {
  const auto* blocks = req.blocks();
  const size_t n = Count(blocks);
  if (n != 0 && n != key_count) {
    return InvalidParams("blocks has " + std::to_string(n) + " entries for " +
                         std::to_string(key_count) +
                         " keys; give one entry per key (an empty one for none) or none");
  }
  for (size_t i = 0; i < n; ++i) {
    const proto::BlockMeta* b = blocks->Get(static_cast<uoffset_t>(i));
    if (Count(b->block_hashes()) == 0 && Count(b->token_ids()) == 0 && b->lora_name() == nullptr) {
      continue;  // an empty entry: this key carries no block metadata
    }
    KVAGENT_RETURN_IF_ERROR(CheckNamed(
        [&](std::string_view w) {
          return ValidateBlockMeta(Count(b->block_hashes()), Count(b->token_ids()), b->block_size(),
                                   View(b->lora_name()), w);
        },
        [i] { return "blocks[" + std::to_string(i) + "]"; }));
  }
  return Status::Ok();
}

Status CheckWrite(const proto::Request& req, size_t key_count, uint64_t arena_bytes,
                  bool process_memory) {
  const auto* keys = req.keys();
  const auto* sessions = req.session_ids();
  KVAGENT_RETURN_IF_ERROR(ValidateWriteKeys(
      key_count, [&](size_t i) { return View(keys->Get(static_cast<uoffset_t>(i))); },
      Count(sessions), [&](size_t i) { return View(sessions->Get(static_cast<uoffset_t>(i))); }));
  KVAGENT_RETURN_IF_ERROR(
      CheckBuffers(req, key_count, arena_bytes, process_memory, /*values=*/true));
  KVAGENT_RETURN_IF_ERROR(CheckBlocks(req, key_count));
  if (const proto::WriteOptions* o = req.options(); o != nullptr && o->replica_count() == 0) {
    return InvalidParams("options.replica_count is 0; ask for at least 1 replica");
  }
  return Status::Ok();
}

Status CheckListArguments(const proto::Request& req) {
  KVAGENT_RETURN_IF_ERROR(ValidateListPrefix(View(req.prefix())));
  return ValidateListLimit(req.limit());
}

// What the Verifier leaves to the reader: vectors of 8-byte structs aligned for them, and a
// request that refers to no more bytes than it holds. FlatBuffers lets every key point at one
// shared string: the master batch built from such a frame (each key written out) would be
// thousands of times larger than the frame.
Status CheckShape(const proto::Request& req, size_t frame_bytes) {
  if (!fbcheck::ElementsAligned(req.buffers()) || !fbcheck::ElementsAligned(req.memory())) {
    return InvalidParams(
        "buffers or memory is not 8-byte aligned in the frame; send frames built by the "
        "kvagent SDK");
  }
  uint64_t referred = fbcheck::StringBytes(req.keys()) + fbcheck::StringBytes(req.session_ids()) +
                      fbcheck::VectorBytes(req.buffers()) + fbcheck::VectorBytes(req.memory()) +
                      fbcheck::VectorBytes(req.memory_counts()) +
                      fbcheck::StringBytes(req.prefix());
  if (const auto* blocks = req.blocks()) {
    for (uoffset_t i = 0; i < blocks->size(); ++i) {
      const proto::BlockMeta* b = blocks->Get(i);
      if (!fbcheck::ElementsAligned(b->block_hashes())) {
        return InvalidParams("blocks[" + std::to_string(i) +
                             "].block_hashes is not 8-byte aligned in the frame");
      }
      referred += sizeof(uoffset_t) + fbcheck::VectorBytes(b->block_hashes()) +
                  fbcheck::VectorBytes(b->token_ids()) + fbcheck::StringBytes(b->lora_name());
    }
  }
  if (referred > frame_bytes) {
    return InvalidParams("the request refers to " + std::to_string(referred) +
                         " bytes of keys, IDs and metadata in a frame of " +
                         std::to_string(frame_bytes) +
                         " bytes: its entries share data; write each key once");
  }
  return Status::Ok();
}

Status CheckOp(const proto::Request& req, size_t key_count, uint64_t arena_bytes,
               bool process_memory) {
  const Op op = req.op();
  const auto* keys = req.keys();
  auto key_at = [&](size_t i) { return View(keys->Get(static_cast<uoffset_t>(i))); };
  switch (op) {
    case Op::Put:
    case Op::Upsert:
      return CheckWrite(req, key_count, arena_bytes, process_memory);
    case Op::Get:
      KVAGENT_RETURN_IF_ERROR(ValidateKeys(key_count, key_at));
      KVAGENT_RETURN_IF_ERROR(MustBeAbsent(Count(req.session_ids()), "session_ids", op));
      return CheckBuffers(req, key_count, arena_bytes, process_memory, /*values=*/false);
    default:
      break;
  }
  // The other ops name no values.
  KVAGENT_RETURN_IF_ERROR(MustBeAbsent(Count(req.memory()), "memory", op));
  KVAGENT_RETURN_IF_ERROR(MustBeAbsent(Count(req.memory_counts()), "memory_counts", op));
  switch (op) {
    case Op::Ping:
    case Op::RemoveAll:
      return MustBeAbsent(key_count, "keys", op);
    case Op::Exist:
    case Op::Remove:
      KVAGENT_RETURN_IF_ERROR(ValidateKeys(key_count, key_at));
      KVAGENT_RETURN_IF_ERROR(MustBeAbsent(Count(req.session_ids()), "session_ids", op));
      return MustBeAbsent(Count(req.buffers()), "buffers", op);
    case Op::List:
      KVAGENT_RETURN_IF_ERROR(MustBeAbsent(key_count, "keys", op));
      KVAGENT_RETURN_IF_ERROR(MustBeAbsent(Count(req.buffers()), "buffers", op));
      return CheckListArguments(req);
    case Op::Stat:
      KVAGENT_RETURN_IF_ERROR(MustBeAbsent(key_count, "keys", op));
      return MustBeAbsent(Count(req.buffers()), "buffers", op);
    case Op::Sessions:
      KVAGENT_RETURN_IF_ERROR(MustBeAbsent(key_count, "keys", op));
      KVAGENT_RETURN_IF_ERROR(MustBeAbsent(Count(req.buffers()), "buffers", op));
      if (Count(req.session_ids()) > 1) {
        return InvalidParams("Sessions takes at most one session ID (none: every session)");
      }
      if (Count(req.session_ids()) == 1) {
        KVAGENT_RETURN_IF_ERROR(ValidateSessionId(View(req.session_ids()->Get(0))));
      }
      return ValidateListLimit(req.limit());
    default:
      break;
  }
  return InvalidParams("unknown op " + std::to_string(static_cast<int>(op)) +
                       "; the SDK is newer than this agent: upgrade the agent");
}

// Request.call_word: 1 + the offset of a 4-byte aligned uint32 inside the arena, on an op that
// moves values (the others have no bytes to guard).
Status CheckCallWord(const proto::Request& req, uint64_t arena_bytes) {
  const uint64_t word = req.call_word();
  if (word == 0) return Status::Ok();
  const Op op = req.op();
  if (op != Op::Put && op != Op::Upsert && op != Op::Get) {
    return InvalidParams("call_word is only for Put, Upsert and Get");
  }
  const uint64_t offset = word - 1;
  if (offset % 4 != 0 || arena_bytes < 4 || offset > arena_bytes - 4) {
    return Status(ErrorCode::kBufferOutOfRange,
                  "call_word names arena offset " + std::to_string(offset) +
                      ", not a 4-byte aligned word inside the arena of " +
                      std::to_string(arena_bytes) + " bytes; send requests built by the SDK");
  }
  return Status::Ok();
}

}  // namespace

ProcessMemory::Ranges ProcessRanges(const proto::Request& req, size_t first, size_t count) {
  // A vector of structs is the structs back to back (aligned: the Verifier checked).
  const auto* all = reinterpret_cast<const proto::MemoryRange*>(req.memory()->Data());
  return ProcessMemory::Ranges(all + first, count);
}

CheckedRequest CheckRequest(std::span<const uint8_t> frame, uint64_t request_id,
                            uint64_t arena_bytes, bool process_memory) {
  CheckedRequest out;
  flatbuffers::Verifier verifier(frame.data(), frame.size(), kMaxDepth, kMaxTables);
  if (frame.size() < sizeof(uoffset_t) || !verifier.VerifyBuffer<proto::Request>(nullptr)) {
    out.status = InvalidParams("request frame of " + std::to_string(frame.size()) +
                               " bytes is not a valid Request FlatBuffer (truncated or "
                               "corrupted); send frames built by the kvagent SDK");
    return out;
  }
  out.request = flatbuffers::GetRoot<proto::Request>(frame.data());
  out.key_count = Count(out.request->keys());
  if (out.request->request_id() != request_id) {
    out.status =
        InvalidParams("request_id " + std::to_string(out.request->request_id()) +
                      " differs from the frame's request id " + std::to_string(request_id));
    return out;
  }
  out.status = CheckShape(*out.request, frame.size());
  if (out.status.ok()) {
    out.status = CheckOp(*out.request, out.key_count, arena_bytes, process_memory);
  }
  if (out.status.ok()) out.status = CheckCallWord(*out.request, arena_bytes);
  return out;
}

}  // namespace kvagent::agent

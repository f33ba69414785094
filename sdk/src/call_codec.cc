#include "call_codec.h"

#include <algorithm>
#include <cstdint>

#include "kvagent/common/validate.h"

namespace kvagent::sdk_detail {
namespace {

bool IsWrite(proto::Op op) { return op == proto::Op::Put || op == proto::Op::Upsert; }

Status CheckParallel(size_t count, size_t key_count, const char* what) {
  if (count == key_count) return Status::Ok();
  return InvalidParams(std::string(what) + " has " + std::to_string(count) + " entries for " +
                       std::to_string(key_count) + " keys; give one per key");
}

// List's page, Stat's counters and the sessions of Sessions, when present.
void DecodeListAndCounters(const proto::Completion& c, Reply* reply) {
  if (const auto* sessions = c.sessions()) {
    reply->sessions.reserve(sessions->size());
    for (const proto::SessionUsage* u : *sessions) {
      reply->sessions.push_back(SessionUsage{
          u->session_id() ? u->session_id()->str() : std::string(), u->blocks(), u->bytes()});
    }
  }
  reply->next_cursor = c.next_cursor();
  if (const auto* listed = c.listed()) {
    reply->listed.reserve(listed->size());
    for (const proto::ListedKey* k : *listed) {
      reply->listed.push_back(ListedKey{k->key() ? k->key()->str() : std::string(), k->size(),
                                        k->session_id() ? k->session_id()->str() : std::string()});
    }
  }
  if (const auto* counters = c.counters()) {
    reply->counters.reserve(counters->size());
    for (const proto::Counter* k : *counters) {
      reply->counters.push_back(Counter{k->name() ? k->name()->str() : std::string(), k->value(),
                                        k->text() ? k->text()->str() : std::string()});
    }
  }
}

// Ranges of the caller's memory: no null range with bytes, no range wrapping the address space.
// `what()` names the value, built only when a range is bad.
template <typename Name>
Status CheckRanges(MemoryValue ranges, Name what) {
  for (size_t j = 0; j < ranges.size(); ++j) {
    const MemoryRange& r = ranges[j];
    const auto start = reinterpret_cast<uintptr_t>(r.data);
    if ((r.data == nullptr && r.size > 0) || start + r.size < start) {
      return InvalidParams(what() + " range " + std::to_string(j) + " (" + std::to_string(r.size) +
                           " bytes) has no valid address; pass memory "
                           "of this process");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateCall(const CallSpec& spec) {
  const CallOptions& o = *spec.options;
  const size_t n = spec.keys.size();
  auto key_at = [&](size_t i) -> std::string_view { return spec.keys[i]; };
  switch (spec.op) {
    case proto::Op::Ping:
    case proto::Op::RemoveAll:
      return Status::Ok();
    case proto::Op::Put:
    case proto::Op::Upsert:
      KVAGENT_RETURN_IF_ERROR(
          ValidateWriteKeys(n, key_at, o.session_ids.size(),
                            [&](size_t i) -> std::string_view { return o.session_ids[i]; }));
      KVAGENT_RETURN_IF_ERROR(CheckParallel(spec.values.size(), n, "values"));
      for (size_t i = 0; i < n; ++i) {
        const Value& v = spec.values[i];
        if (v.length() == 0) {
          return InvalidParams("values[" + std::to_string(i) +
                               "] is empty; a value is at least 1 byte");
        }
        KVAGENT_RETURN_IF_ERROR(
            CheckRanges(v.ranges(), [i] { return "values[" + std::to_string(i) + "]"; }));
        if (v.buffer() != nullptr && (!v.buffer()->valid() || v.length() > v.buffer()->size())) {
          return Status(ErrorCode::kBufferOutOfRange,
                        "values[" + std::to_string(i) + "] names " + std::to_string(v.length()) +
                            " bytes of a " + std::to_string(v.buffer()->size()) +
                            "-byte arena buffer; pass a length within the buffer");
        }
      }
      if (!o.blocks.empty()) {
        KVAGENT_RETURN_IF_ERROR(CheckParallel(o.blocks.size(), n, "blocks"));
        for (size_t i = 0; i < n; ++i) {
          const BlockMetadata& b = o.blocks[i];
          // An empty entry means "no metadata for this key", as the agent reads it (agent.fbs).
          if (b.block_hashes.empty() && b.token_ids.empty() && b.lora_name.empty()) continue;
          KVAGENT_RETURN_IF_ERROR(CheckNamed(
              [&](std::string_view w) {
                return ValidateBlockMeta(b.block_hashes.size(), b.token_ids.size(), b.block_size,
                                         b.lora_name, w);
              },
              [i] { return "blocks[" + std::to_string(i) + "]"; }));
        }
      }
      if (o.write.replica_count == 0) {
        return InvalidParams("write.replica_count is 0; ask for at least 1 replica");
      }
      return Status::Ok();
    case proto::Op::Get:
      KVAGENT_RETURN_IF_ERROR(ValidateKeys(n, key_at));
      if (!spec.memory_targets.empty() || spec.targets.empty()) {
        KVAGENT_RETURN_IF_ERROR(CheckParallel(spec.memory_targets.size(), n, "targets"));
        for (size_t i = 0; i < n; ++i) {
          auto what = [i] { return "targets[" + std::to_string(i) + "]"; };
          if (spec.memory_targets[i].empty()) {
            return InvalidParams(what() + " has no ranges; give at least one per key");
          }
          KVAGENT_RETURN_IF_ERROR(CheckRanges(spec.memory_targets[i], what));
        }
        return Status::Ok();
      }
      KVAGENT_RETURN_IF_ERROR(CheckParallel(spec.targets.size(), n, "buffers"));
      for (size_t i = 0; i < n; ++i) {
        if (spec.targets[i] == nullptr || !spec.targets[i]->valid()) {
          return InvalidParams("buffers[" + std::to_string(i) +
                               "] is not an allocated arena buffer; use Client::Allocate");
        }
      }
      return Status::Ok();
    case proto::Op::Exist:
    case proto::Op::Remove:
      return ValidateKeys(n, key_at);
    case proto::Op::List:
      KVAGENT_RETURN_IF_ERROR(ValidateListPrefix(spec.list->prefix));
      return ValidateListLimit(spec.list->limit);
    case proto::Op::Stat:
      return Status::Ok();
    case proto::Op::Sessions:
      if (!spec.sessions->session_id.empty()) {
        KVAGENT_RETURN_IF_ERROR(ValidateSessionId(spec.sessions->session_id));
      }
      return ValidateListLimit(spec.sessions->limit);
  }
  return InvalidParams("unknown op");
}

std::span<const uint8_t> EncodeRequest(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                       const CallSpec& spec, const ValueLocations& where,
                                       std::chrono::milliseconds timeout,
                                       std::chrono::steady_clock::time_point deadline) {
  fbb.Clear();
  const CallOptions& o = *spec.options;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> keys;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> sessions;
  flatbuffers::Offset<flatbuffers::Vector<const proto::BufferRef*>> buffer_vec;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<proto::BlockMeta>>> blocks;
  flatbuffers::Offset<proto::WriteOptions> options;
  if (!spec.keys.empty()) keys = fbb.CreateVectorOfStrings(spec.keys.begin(), spec.keys.end());
  if (IsWrite(spec.op) && !o.session_ids.empty()) {
    sessions = fbb.CreateVectorOfStrings(o.session_ids.begin(), o.session_ids.end());
  }
  if (spec.sessions != nullptr && !spec.sessions->session_id.empty()) {
    const std::string* one = &spec.sessions->session_id;
    sessions = fbb.CreateVectorOfStrings(one, one + 1);
  }
  flatbuffers::Offset<flatbuffers::Vector<const proto::MemoryRange*>> memory_vec;
  flatbuffers::Offset<flatbuffers::Vector<uint32_t>> counts_vec;
  if (!where.buffers.empty()) {
    buffer_vec = fbb.CreateVectorOfStructs(where.buffers.data(), where.buffers.size());
  }
  if (!where.memory_counts.empty()) {
    memory_vec = fbb.CreateVectorOfStructs(where.memory.data(), where.memory.size());
    counts_vec = fbb.CreateVector(where.memory_counts.data(), where.memory_counts.size());
  }
  if (IsWrite(spec.op) && !o.blocks.empty()) {
    std::vector<flatbuffers::Offset<proto::BlockMeta>> metas;
    metas.reserve(o.blocks.size());
    for (const BlockMetadata& b : o.blocks) {
      std::vector<block_proto::BlockHash> hashes;
      hashes.reserve(b.block_hashes.size());
      for (uint64_t h : b.block_hashes) hashes.emplace_back(h, b.hashes_signed);
      auto hash_vec = fbb.CreateVectorOfStructs(hashes);
      flatbuffers::Offset<flatbuffers::Vector<uint32_t>> tokens;
      if (!b.token_ids.empty()) tokens = fbb.CreateVector(b.token_ids);
      flatbuffers::Offset<flatbuffers::String> lora;
      if (!b.lora_name.empty()) lora = fbb.CreateString(b.lora_name);
      const block_proto::BlockHash parent(b.parent_block_hash, b.hashes_signed);
      metas.push_back(proto::CreateBlockMeta(fbb, hash_vec, b.has_parent ? &parent : nullptr,
                                             tokens, b.block_size, lora));
    }
    blocks = fbb.CreateVector(metas);
  }
  if (IsWrite(spec.op)) {
    options = proto::CreateWriteOptions(fbb, o.write.replica_count, o.write.soft_pin,
                                        o.write.soft_pin_ttl_ms, o.write.hard_pin);
  }
  flatbuffers::Offset<flatbuffers::String> prefix;
  if (spec.list != nullptr && !spec.list->prefix.empty()) {
    prefix = fbb.CreateString(spec.list->prefix);
  }
  proto::RequestBuilder b(fbb);
  b.add_request_id(request_id);
  if (spec.list != nullptr) {
    if (!prefix.IsNull()) b.add_prefix(prefix);
    b.add_cursor(spec.list->cursor);
    b.add_limit(spec.list->limit);
  }
  if (spec.sessions != nullptr) {
    b.add_cursor(spec.sessions->cursor);
    b.add_limit(spec.sessions->limit);
  }
  b.add_op(spec.op);
  if (!keys.IsNull()) b.add_keys(keys);
  if (!sessions.IsNull()) b.add_session_ids(sessions);
  if (!buffer_vec.IsNull()) b.add_buffers(buffer_vec);
  if (!memory_vec.IsNull()) b.add_memory(memory_vec);
  if (!counts_vec.IsNull()) b.add_memory_counts(counts_vec);
  if (!blocks.IsNull()) b.add_blocks(blocks);
  if (!options.IsNull()) b.add_options(options);
  if (o.force) b.add_force(true);
  if (where.call_word != 0) b.add_call_word(where.call_word);
  const auto clamp_ms = std::min<int64_t>(timeout.count(), UINT32_MAX);
  if (clamp_ms > 0) {
    b.add_timeout_ms(static_cast<uint32_t>(clamp_ms));
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch());
    if (ns.count() > 0) b.add_deadline_ns(static_cast<uint64_t>(ns.count()));
  }
  fbb.Finish(b.Finish());
  return {fbb.GetBufferPointer(), fbb.GetSize()};
}

Reply FailedReply(const Status& status, size_t key_count) {
  Reply reply;
  reply.status = status;
  reply.keys.assign(key_count, KeyResult{status.code(), status.message(), 0, false});
  return reply;
}

Reply DecodeCompletion(std::span<const uint8_t> frame, size_t key_count) {
  flatbuffers::Verifier verifier(frame.data(), frame.size(), 8, 1u << 20);
  if (frame.size() < sizeof(flatbuffers::uoffset_t) ||
      !verifier.VerifyBuffer<proto::Completion>(nullptr)) {
    return FailedReply(Internal("the agent sent a malformed completion; report this bug"),
                       key_count);
  }
  const auto* c = flatbuffers::GetRoot<proto::Completion>(frame.data());
  Reply reply;
  const ErrorCode code = ErrorCodeFromWire(c->status());
  reply.status = Status(code, c->message() ? c->message()->str() : std::string());
  reply.removed_count = c->removed_count();
  const auto* codes = c->codes();
  if (codes == nullptr || codes->size() == 0) {
    if (key_count > 0 && code == ErrorCode::kOk) {
      // The agent answers every key of a call that did not fail as a whole: a success without
      // them would make each key OK with a length of 0.
      return FailedReply(Internal("the agent answered OK without a result for each of the " +
                                  std::to_string(key_count) + " keys; report this bug"),
                         key_count);
    }
    // No per-key answer: the request-level status applies to every key.
    if (key_count > 0) reply.keys.assign(key_count, KeyResult{code, reply.status.message()});
    DecodeListAndCounters(*c, &reply);
    return reply;
  }
  if (codes->size() != key_count) {
    return FailedReply(Internal("the agent answered " + std::to_string(codes->size()) +
                                " keys for a request of " + std::to_string(key_count)),
                       key_count);
  }
  DecodeListAndCounters(*c, &reply);
  const auto* messages = c->messages();
  const auto* lengths = c->lengths();
  const auto* exists = c->exists();
  const auto* replicas = c->replicas();
  reply.keys.resize(key_count);
  for (flatbuffers::uoffset_t i = 0; i < key_count; ++i) {
    KeyResult& k = reply.keys[i];
    k.code = ErrorCodeFromWire(codes->Get(i));
    if (messages != nullptr && i < messages->size()) k.message = messages->Get(i)->str();
    if (lengths != nullptr && i < lengths->size()) k.length = lengths->Get(i);
    if (exists != nullptr && i < exists->size()) k.exists = exists->Get(i) != 0;
    if (replicas != nullptr && i < replicas->size()) k.replicas = replicas->Get(i);
  }
  return reply;
}

void CheckGetLengths(std::span<const uint64_t> capacities, Reply* reply) {
  if (reply->keys.size() != capacities.size()) return;  // already failed as a whole
  for (size_t i = 0; i < capacities.size(); ++i) {
    const KeyResult& k = reply->keys[i];
    if (k.code != ErrorCode::kOk || (k.length > 0 && k.length <= capacities[i])) continue;
    *reply = FailedReply(
        Internal("the agent answered key " + std::to_string(i) + " OK with a length of " +
                 std::to_string(k.length) + " for a target of " + std::to_string(capacities[i]) +
                 " bytes; report this bug"),
        capacities.size());
    return;
  }
}

}  // namespace kvagent::sdk_detail

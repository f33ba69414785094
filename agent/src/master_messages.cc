#include "master_messages.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include "client_values.h"
#include "kvagent/schemas/flatbuffer_checks.h"

namespace kvagent::agent {
namespace {

using flatbuffers::Offset;
using flatbuffers::uoffset_t;
using StringVector = flatbuffers::Vector<Offset<flatbuffers::String>>;

std::string_view View(const flatbuffers::String* s) {
  return s == nullptr ? std::string_view() : std::string_view(s->c_str(), s->size());
}

template <typename T>
size_t Count(const flatbuffers::Vector<T>* v) {
  return v == nullptr ? 0 : v->size();
}

Status Malformed(const std::string& what) {
  return Internal("the master's reply is malformed (" + what +
                  "); check that kvmaster and kvagent are the same version");
}

bool EmptyMeta(const proto::BlockMeta* b) {
  return Count(b->block_hashes()) == 0 && Count(b->token_ids()) == 0 && b->lora_name() == nullptr;
}

}  // namespace

std::string_view KeyAt(std::span<const HeldRequest> requests, KeyRef ref) {
  return View(requests[ref.request].request.request().keys()->Get(ref.index));
}

Offset<StringVector> MasterMessages::Keys(std::span<const HeldRequest> requests,
                                          std::span<const KeyRef> keys) {
  strings_.clear();
  for (const KeyRef& k : keys) strings_.push_back(fbb_.CreateString(KeyAt(requests, k)));
  return fbb_.CreateVector(strings_);
}

Offset<flatbuffers::Vector<Offset<mfb::BlockMeta>>> MasterMessages::Blocks(
    std::span<const HeldRequest> requests, std::span<const KeyRef> keys) {
  bool any = false;
  for (const KeyRef& k : keys) any |= Count(requests[k.request].request.request().blocks()) != 0;
  if (!any) return 0;
  blocks_.clear();
  Offset<mfb::BlockMeta> empty;  // shared by every key without metadata
  for (const KeyRef& k : keys) {
    const auto* metas = requests[k.request].request.request().blocks();
    const proto::BlockMeta* b = metas == nullptr ? nullptr : metas->Get(k.index);
    if (b == nullptr || EmptyMeta(b)) {
      if (empty.IsNull()) empty = mfb::CreateBlockMeta(fbb_);
      blocks_.push_back(empty);
      continue;
    }
    // BlockHash is one type in both schemas (blocks.fbs): the hashes are copied as they are.
    // The request was checked: a BlockMeta that is not empty holds at least one hash.
    const auto* from = b->block_hashes();
    // A vector of structs is their bytes in a row (Data()); its element accessors yield copies.
    const auto hashes = fbb_.CreateVectorOfStructs(
        reinterpret_cast<const block_proto::BlockHash*>(from->Data()), from->size());
    Offset<flatbuffers::Vector<const block_proto::BlockHash*>> parent;
    if (const block_proto::BlockHash* p = b->parent_block_hash()) {
      parent = fbb_.CreateVectorOfStructs(p, 1);
    }
    Offset<flatbuffers::Vector<uint32_t>> tokens;
    if (b->token_ids() != nullptr) {
      tokens = fbb_.CreateVector(b->token_ids()->data(), b->token_ids()->size());
    }
    Offset<flatbuffers::String> lora;
    if (b->lora_name() != nullptr) lora = fbb_.CreateString(View(b->lora_name()));
    blocks_.push_back(mfb::CreateBlockMeta(fbb_, hashes, parent, tokens, b->block_size(), lora));
  }
  return fbb_.CreateVector(blocks_);
}

flatbuffers::DetachedBuffer MasterMessages::Finish(uint64_t id, mfb::Body type, Offset<void> body) {
  fbb_.Finish(mfb::CreateRequest(fbb_, id, type, body, agent_key_));
  return fbb_.Release();
}

Offset<mfb::WriteStart> MasterMessages::StartTable(uint32_t agent,
                                                   std::span<const HeldRequest> requests,
                                                   std::span<const KeyRef> keys) {
  const auto key_vec = Keys(requests, keys);
  sizes_.clear();
  bool any_session = false;
  for (const KeyRef& k : keys) {
    const proto::Request& r = requests[k.request].request.request();
    sizes_.push_back(ClientValue(requests[k.request].request, k.index).length());
    any_session |= Count(r.session_ids()) != 0;
  }
  const auto size_vec = fbb_.CreateVector(sizes_);
  Offset<StringVector> session_vec;
  if (any_session) {
    strings_.clear();
    Offset<flatbuffers::String> untagged;  // one "" for every key of a request without IDs
    for (const KeyRef& k : keys) {
      const auto* ids = requests[k.request].request.request().session_ids();
      if (ids == nullptr) {
        if (untagged.IsNull()) untagged = fbb_.CreateString("");
        strings_.push_back(untagged);
      } else {
        strings_.push_back(fbb_.CreateString(View(ids->Get(k.index))));
      }
    }
    session_vec = fbb_.CreateVector(strings_);
  }
  const auto block_vec = Blocks(requests, keys);
  const proto::WriteOptions* o = requests[keys.front().request].request.request().options();
  const auto options = o == nullptr
                           ? mfb::CreateWriteOptions(fbb_)
                           : mfb::CreateWriteOptions(fbb_, o->replica_count(), o->soft_pin(),
                                                     o->soft_pin_ttl_ms(), o->hard_pin());
  return mfb::CreateWriteStart(fbb_, agent, key_vec, size_vec, session_vec, block_vec, options);
}

flatbuffers::DetachedBuffer MasterMessages::WriteStart(uint64_t id, uint32_t agent, bool upsert,
                                                       std::span<const HeldRequest> requests,
                                                       std::span<const KeyRef> keys) {
  const auto body = StartTable(agent, requests, keys);
  return Finish(id, upsert ? mfb::Body::BatchUpsertStart : mfb::Body::BatchPutStart, body.Union());
}

flatbuffers::DetachedBuffer MasterMessages::WriteFinish(uint64_t id, uint32_t agent, mfb::Body type,
                                                        std::span<const HeldRequest> requests,
                                                        std::span<const KeyRef> keys,
                                                        const WriteFinishFields& fields) {
  const auto key_vec = Keys(requests, keys);
  return Finish(id, type, FinishTable(agent, key_vec, fields).Union());
}

flatbuffers::DetachedBuffer MasterMessages::WriteCommit(uint64_t id, uint32_t agent,
                                                        std::span<const HeldRequest> requests,
                                                        std::span<const KeyRef> keys,
                                                        const WriteFinishFields& fields,
                                                        uint64_t master_epoch) {
  const auto start = StartTable(agent, requests, keys);
  const auto finish = FinishTable(agent, 0, fields);  // the keys are the start's
  return Finish(id, mfb::Body::BatchPutCommit,
                mfb::CreateWriteCommit(fbb_, start, finish, master_epoch).Union());
}

flatbuffers::DetachedBuffer MasterMessages::ReserveWrites(uint64_t id, uint32_t agent,
                                                          uint64_t size, uint8_t replica_count,
                                                          uint32_t count,
                                                          std::span<const uint64_t> returned) {
  Offset<flatbuffers::Vector<uint64_t>> returned_vec;
  if (!returned.empty()) returned_vec = fbb_.CreateVector(returned.data(), returned.size());
  return Finish(
      id, mfb::Body::ReserveWrites,
      mfb::CreateReserveWrites(fbb_, agent, size, replica_count, count, returned_vec).Union());
}

Offset<mfb::WriteFinish> MasterMessages::FinishTable(uint32_t agent, Offset<StringVector> key_vec,
                                                     const WriteFinishFields& fields) {
  const auto write_ids = fbb_.CreateVector(fields.write_ids.data(), fields.write_ids.size());
  Offset<flatbuffers::Vector<uint32_t>> part_counts, checksums;
  if (!fields.part_counts.empty()) {
    part_counts = fbb_.CreateVector(fields.part_counts.data(), fields.part_counts.size());
    checksums = fbb_.CreateVector(fields.checksums.data(), fields.checksums.size());
  }
  Offset<flatbuffers::Vector<const mfb::FailedReplica*>> failed;
  if (!fields.failed.empty()) {
    failed = fbb_.CreateVectorOfStructs(fields.failed.data(), fields.failed.size());
  }
  return mfb::CreateWriteFinish(fbb_, agent, key_vec, write_ids, part_counts, checksums, failed);
}

flatbuffers::DetachedBuffer MasterMessages::ReportBadReplicas(
    uint64_t id, uint32_t agent, std::span<const BadReplicaReport> bad) {
  strings_.clear();
  std::vector<uint64_t> versions;
  std::vector<uint32_t> parts, pools;
  for (const BadReplicaReport& b : bad) {
    strings_.push_back(fbb_.CreateString(b.key));
    versions.push_back(b.version);
    parts.push_back(b.part);
    pools.push_back(b.pool_id);
  }
  const auto keys = fbb_.CreateVector(strings_);
  return Finish(id, mfb::Body::ReportBadReplicas,
                mfb::CreateReportBadReplicas(fbb_, agent, keys, fbb_.CreateVector(versions),
                                             fbb_.CreateVector(parts), fbb_.CreateVector(pools))
                    .Union());
}

flatbuffers::DetachedBuffer MasterMessages::KeyList(uint64_t id, mfb::Body type,
                                                    std::span<const HeldRequest> requests,
                                                    std::span<const KeyRef> keys, bool force) {
  const auto key_vec = Keys(requests, keys);
  switch (type) {
    case mfb::Body::BatchGet:
      return Finish(id, type, mfb::CreateBatchGet(fbb_, key_vec).Union());
    case mfb::Body::BatchExist:
      return Finish(id, type, mfb::CreateBatchExist(fbb_, key_vec).Union());
    default:
      return Finish(id, mfb::Body::BatchRemove,
                    mfb::CreateBatchRemove(fbb_, key_vec, force).Union());
  }
}

flatbuffers::DetachedBuffer MasterMessages::RemoveAll(uint64_t id, bool force) {
  return Finish(id, mfb::Body::RemoveAll, mfb::CreateRemoveAll(fbb_, force).Union());
}

flatbuffers::DetachedBuffer MasterMessages::ListKeys(uint64_t id, uint64_t cursor, uint32_t limit,
                                                     std::string_view prefix) {
  Offset<flatbuffers::String> p;
  if (!prefix.empty()) p = fbb_.CreateString(prefix);
  return Finish(id, mfb::Body::ListKeys, mfb::CreateListKeys(fbb_, cursor, limit, p).Union());
}

flatbuffers::DetachedBuffer MasterMessages::SessionStats(uint64_t id, std::string_view session_id,
                                                         uint64_t cursor, uint32_t limit) {
  fbb_.Clear();
  const auto session = session_id.empty() ? 0 : fbb_.CreateString(session_id).o;
  return Finish(id, mfb::Body::SessionStats,
                mfb::CreateSessionStats(fbb_, flatbuffers::Offset<flatbuffers::String>(session),
                                        cursor, limit)
                    .Union());
}

flatbuffers::DetachedBuffer MasterMessages::Stats(uint64_t id) {
  return Finish(id, mfb::Body::Stats, mfb::CreateStats(fbb_).Union());
}

Status ReplyStatus(const mfb::Reply& reply, mfb::ReplyBody expected) {
  if (reply.status() != 0) {
    return Status(ErrorCodeFromWire(reply.status()), std::string(View(reply.message())));
  }
  if (reply.body_type() != expected) {
    return Malformed(std::string("expected ") + mfb::EnumNameReplyBody(expected) + ", got " +
                     mfb::EnumNameReplyBody(reply.body_type()));
  }
  // The Verifier accepts a body_type without its table.
  if (reply.body() == nullptr) {
    return Malformed(std::string("its ") + mfb::EnumNameReplyBody(expected) + " is missing");
  }
  return Status::Ok();
}

Status KeyStatus(const flatbuffers::Vector<uint16_t>* codes, const StringVector* messages,
                 size_t i) {
  const auto at = static_cast<uoffset_t>(i);
  const ErrorCode code = ErrorCodeFromWire(codes->Get(at));
  if (code == ErrorCode::kOk) return Status::Ok();
  std::string message(messages != nullptr && at < messages->size() ? View(messages->Get(at))
                                                                   : std::string_view());
  if (message.empty()) message = std::string(ErrorCodeName(code)) + " (the master gave no reason)";
  return Status(code, std::move(message));
}

Result<const mfb::PlacementReply*> ReadPlacements(std::span<const uint8_t> bytes, size_t key_count,
                                                  bool with_sizes) {
  const auto* reply = flatbuffers::GetRoot<mfb::Reply>(bytes.data());
  KVAGENT_RETURN_IF_ERROR(ReplyStatus(*reply, mfb::ReplyBody::PlacementReply));
  const mfb::PlacementReply* p = reply->body_as_PlacementReply();
  if (p == nullptr) return Malformed("no PlacementReply body");
  if (Count(p->codes()) != key_count) return Malformed("codes do not match the keys");
  if (Count(p->write_ids()) != key_count) return Malformed("write_ids do not match the keys");
  if (p->messages() != nullptr && p->messages()->size() != key_count) {
    return Malformed("messages do not match the keys");
  }
  if (with_sizes && Count(p->sizes()) != key_count) return Malformed("sizes do not match the keys");
  if (Count(p->first()) != key_count + 1) return Malformed("first has the wrong length");
  // 8-byte elements the Verifier only checked for 4-byte alignment.
  if (!fbcheck::ElementsAligned(p->sizes()) || !fbcheck::ElementsAligned(p->placements()) ||
      !fbcheck::ElementsAligned(p->write_ids())) {
    return Malformed("sizes, placements or write_ids are not 8-byte aligned");
  }
  const size_t placements = Count(p->placements());
  uint32_t previous = 0;
  for (uint32_t f : *p->first()) {
    if (f < previous || f > placements) return Malformed("first is not a valid index");
    previous = f;
  }
  // Pools with an endpoint, sorted: each placement is looked up in O(log pools), so a
  // reply with many of both costs no quadratic time.
  thread_local std::vector<uint32_t> reachable;  // kept: no allocation per reply
  reachable.clear();
  if (p->pools() != nullptr) {
    reachable.reserve(p->pools()->size());
    for (const mfb::PoolInfo* s : *p->pools()) {
      if (Count(s->endpoints()) > 0) reachable.push_back(s->pool_id());
    }
  }
  std::sort(reachable.begin(), reachable.end());
  for (size_t i = 0; i < placements; ++i) {
    const mfb::Placement* pl = p->placements()->Get(static_cast<uoffset_t>(i));
    if (!std::binary_search(reachable.begin(), reachable.end(), pl->pool_id())) {
      return Malformed("a placement names a pool without endpoints");
    }
    if (pl->length() == 0) return Malformed("a placement has length 0");
  }
  return p;
}

Result<const mfb::PlacementReply*> ReadReservations(std::span<const uint8_t> bytes, size_t max) {
  const auto* reply = flatbuffers::GetRoot<mfb::Reply>(bytes.data());
  KVAGENT_RETURN_IF_ERROR(ReplyStatus(*reply, mfb::ReplyBody::PlacementReply));
  const mfb::PlacementReply* p = reply->body_as_PlacementReply();
  if (p == nullptr) return Malformed("no PlacementReply body");
  const size_t granted = Count(p->codes());
  if (granted > max) return Malformed("more reserved writes than asked for");
  auto checked = ReadPlacements(bytes, granted, false);
  if (!checked.ok()) return checked.status();
  for (size_t i = 0; i < granted; ++i) {
    if (p->codes()->Get(static_cast<uoffset_t>(i)) != 0)
      return Malformed("a reserved write failed");
    if (p->first()->Get(static_cast<uoffset_t>(i)) ==
        p->first()->Get(static_cast<uoffset_t>(i + 1)))
      return Malformed("a reserved write has no placement");
  }
  if (p->pools() == nullptr) return Malformed("no pools");
  return p;
}

Result<const mfb::KeyCodesReply*> ReadKeyCodes(std::span<const uint8_t> bytes, size_t key_count,
                                               bool with_exists) {
  const auto* reply = flatbuffers::GetRoot<mfb::Reply>(bytes.data());
  KVAGENT_RETURN_IF_ERROR(ReplyStatus(*reply, mfb::ReplyBody::KeyCodesReply));
  const mfb::KeyCodesReply* k = reply->body_as_KeyCodesReply();
  if (k == nullptr) return Malformed("no KeyCodesReply body");
  if (Count(k->codes()) != key_count) return Malformed("codes do not match the keys");
  if (k->replicas() != nullptr && k->replicas()->size() != key_count) {
    return Malformed("replicas do not match the keys");
  }
  if (k->messages() != nullptr && k->messages()->size() != key_count) {
    return Malformed("messages do not match the keys");
  }
  if (with_exists && Count(k->exists()) != key_count) {
    return Malformed("exists does not match the keys");
  }
  return k;
}

}  // namespace kvagent::agent

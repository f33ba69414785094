#include "request_check.h"

#include <string>

#include "kvagent/schemas/flatbuffer_checks.h"

namespace kvagent::master {
namespace {

namespace fb = kvagent::master_proto;
using fbcheck::ElementsAligned;
using fbcheck::StringBytes;
using fbcheck::VectorBytes;
using StringVector = flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>;

// Endpoints a pool may list (one per transport in practice).
constexpr size_t kMaxEndpoints = 16;
// Hash slots one ListKeys page may cover: a page's reply then stays bounded (agents ask for
// 256, the event relay for 1000).
constexpr uint32_t kMaxListKeysLimit = 10000;
// A follower names itself with its --name (coord::CheckName: at most 64 characters).
constexpr size_t kMaxFollowerName = 64;

std::string BodyName(fb::Body type) { return fb::EnumNameBody(type); }

Status Missing(fb::Body type, const char* field) {
  return InvalidParams(BodyName(type) + " has no " + field + "; a " + BodyName(type) +
                       " needs it (is the client of another protocol version?)");
}

Status Misaligned(fb::Body type, const std::string& field) {
  return InvalidParams(BodyName(type) + "." + field +
                       " is not 8-byte aligned inside the message; build requests with a "
                       "FlatBufferBuilder");
}

// Bytes a WriteStart refers to; fails for misaligned hash vectors.
Result<uint64_t> WriteStartBytes(fb::Body type, const fb::WriteStart& m) {
  if (m.keys() == nullptr) return Missing(type, "keys");
  if (m.sizes() == nullptr) return Missing(type, "sizes");
  if (!ElementsAligned(m.sizes())) return Misaligned(type, "sizes");
  uint64_t bytes = StringBytes(m.keys()) + VectorBytes(m.sizes()) + StringBytes(m.session_ids());
  if (const auto* blocks = m.blocks()) {
    for (flatbuffers::uoffset_t i = 0; i < blocks->size(); ++i) {
      const fb::BlockMeta* b = blocks->Get(i);
      if (!ElementsAligned(b->block_hashes()) || !ElementsAligned(b->parent_block_hash())) {
        return Misaligned(type, "blocks[" + std::to_string(i) + "] hashes");
      }
      bytes += sizeof(flatbuffers::uoffset_t) + VectorBytes(b->block_hashes()) +
               VectorBytes(b->parent_block_hash()) + VectorBytes(b->token_ids()) +
               StringBytes(b->lora_name());
    }
  }
  return bytes;
}

Result<uint64_t> KeysBytes(fb::Body type, const StringVector* keys) {
  if (keys == nullptr) return Missing(type, "keys");
  return StringBytes(keys);
}

Result<uint64_t> WriteFinishBytes(fb::Body type, const fb::WriteFinish& m) {
  if (m.keys() == nullptr) return Missing(type, "keys");
  if (!ElementsAligned(m.write_ids())) return Misaligned(type, "write_ids");
  return StringBytes(m.keys()) + VectorBytes(m.write_ids()) + VectorBytes(m.part_counts()) +
         VectorBytes(m.checksums()) + VectorBytes(m.failed());
}

// A commit's finish names no keys (the start's); its per-key vectors are checked as an End's.
Result<uint64_t> CommitBytes(fb::Body type, const fb::WriteCommit& m) {
  if (m.start() == nullptr) return Missing(type, "start");
  if (m.finish() == nullptr) return Missing(type, "finish");
  Result<uint64_t> start = WriteStartBytes(type, *m.start());
  if (!start.ok()) return start.status();
  const fb::WriteFinish& f = *m.finish();
  if (!ElementsAligned(f.write_ids())) return Misaligned(type, "finish.write_ids");
  return *start + StringBytes(f.keys()) + VectorBytes(f.write_ids()) +
         VectorBytes(f.part_counts()) + VectorBytes(f.checksums()) + VectorBytes(f.failed());
}

Result<uint64_t> ReserveBytes(fb::Body type, const fb::ReserveWrites& m) {
  if (!ElementsAligned(m.returned())) return Misaligned(type, "returned");
  return VectorBytes(m.returned());
}

Result<uint64_t> BadReplicasBytes(fb::Body type, const fb::ReportBadReplicas& m) {
  if (m.keys() == nullptr) return Missing(type, "keys");
  if (!ElementsAligned(m.versions())) return Misaligned(type, "versions");
  return StringBytes(m.keys()) + VectorBytes(m.versions()) + VectorBytes(m.parts()) +
         VectorBytes(m.pool_ids());
}

// Bytes the body refers to, or why it is malformed.
Result<uint64_t> BodyBytes(const fb::Request& r) {
  const fb::Body type = r.body_type();
  switch (type) {
    case fb::Body::RegisterAgent:
      return StringBytes(r.body_as_RegisterAgent()->name());
    case fb::Body::MountPool: {
      const auto* eps = r.body_as_MountPool()->endpoints();
      if (eps != nullptr && eps->size() > kMaxEndpoints) {
        return InvalidParams("MountPool lists " + std::to_string(eps->size()) +
                             " endpoints; at most " + std::to_string(kMaxEndpoints));
      }
      return StringBytes(eps);
    }
    case fb::Body::BatchPutStart:
      return WriteStartBytes(type, *r.body_as_BatchPutStart());
    case fb::Body::BatchUpsertStart:
      return WriteStartBytes(type, *r.body_as_BatchUpsertStart());
    case fb::Body::BatchPutEnd:
      return WriteFinishBytes(type, *r.body_as_BatchPutEnd());
    case fb::Body::BatchPutRevoke:
      return WriteFinishBytes(type, *r.body_as_BatchPutRevoke());
    case fb::Body::BatchUpsertEnd:
      return WriteFinishBytes(type, *r.body_as_BatchUpsertEnd());
    case fb::Body::BatchUpsertRevoke:
      return WriteFinishBytes(type, *r.body_as_BatchUpsertRevoke());
    case fb::Body::ReportBadReplicas:
      return BadReplicasBytes(type, *r.body_as_ReportBadReplicas());
    case fb::Body::ReserveWrites:
      return ReserveBytes(type, *r.body_as_ReserveWrites());
    case fb::Body::BatchPutCommit:
      return CommitBytes(type, *r.body_as_BatchPutCommit());
    case fb::Body::BatchGet:
      return KeysBytes(type, r.body_as_BatchGet()->keys());
    case fb::Body::BatchExist:
      return KeysBytes(type, r.body_as_BatchExist()->keys());
    case fb::Body::BatchRemove:
      return KeysBytes(type, r.body_as_BatchRemove()->keys());
    case fb::Body::ListKeys: {
      const fb::ListKeys* m = r.body_as_ListKeys();
      if (m->limit() > kMaxListKeysLimit) {
        return InvalidParams("ListKeys.limit " + std::to_string(m->limit()) + " is above " +
                             std::to_string(kMaxListKeysLimit) + "; page with next_cursor");
      }
      return StringBytes(m->prefix());
    }
    case fb::Body::Replicate: {
      const fb::Replicate* m = r.body_as_Replicate();
      if (m->follower() != nullptr && m->follower()->size() > kMaxFollowerName) {
        return InvalidParams("Replicate.follower is " + std::to_string(m->follower()->size()) +
                             " bytes; a follower's name (its --name) has at most " +
                             std::to_string(kMaxFollowerName));
      }
      return StringBytes(m->follower());
    }
    case fb::Body::Heartbeat:
    case fb::Body::RemoveAll:
    case fb::Body::Stats:
    case fb::Body::NONE:
      return uint64_t{0};
    default:  // a body type of a newer peer: MasterRpc answers it
      return uint64_t{0};
  }
}

bool KnownBody(fb::Body type) {
  return type != fb::Body::NONE && static_cast<int>(type) >= static_cast<int>(fb::Body::MIN) &&
         static_cast<int>(type) <= static_cast<int>(fb::Body::MAX);
}

}  // namespace

Status CheckRequestShape(const fb::Request& request, size_t request_bytes) {
  const fb::Body type = request.body_type();
  if (type == fb::Body::NONE) {
    return InvalidParams("the request has no body; send one of the master.fbs request tables");
  }
  if (!KnownBody(type)) return Status::Ok();
  if (request.body() == nullptr) {
    return InvalidParams("body_type " + BodyName(type) +
                         " comes without its table; send the table the type names");
  }
  Result<uint64_t> referred = BodyBytes(request);
  if (!referred.ok()) return referred.status();
  if (*referred > request_bytes) {
    return InvalidParams(BodyName(type) + " refers to " + std::to_string(*referred) +
                         " bytes of strings and vectors in a message of " +
                         std::to_string(request_bytes) +
                         " bytes: entries share their data; write each key and value once");
  }
  return Status::Ok();
}

}  // namespace kvagent::master

// master.fbs messages built from client requests, and the replies read back.
//
// Builders take the batch's requests and its keys by original position (KeyRef), so per-key
// arrays (sizes, session IDs, block metadata) are always taken from the key's own request at
// the key's own index (SEMANTICS rule 9), and nothing per key is copied more than once: each
// key string goes straight from the client's (private copy of the) frame into the message.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvagent/common/status.h"
#include "kvagent/schemas/master_generated.h"
#include "pipeline_context.h"

namespace kvagent::agent {

namespace mfb = kvagent::master_proto;

// What an End or Revoke carries besides its keys (master.fbs WriteFinish).
struct WriteFinishFields {
  std::span<const uint64_t> write_ids = {};         // per key
  std::span<const uint32_t> part_counts = {};       // End: per key (empty: no checksums)
  std::span<const uint32_t> checksums = {};         // End: part_counts[i] per key, keys in order
  std::span<const mfb::FailedReplica> failed = {};  // End: replicas not written
};

// A replica a Get found corrupt, for ReportBadReplicas.
struct BadReplicaReport {
  std::string key;
  uint64_t version = 0;
  uint32_t part = 0;
  uint32_t pool_id = 0;
};

// Builds master requests. Keeps scratch vectors across calls (service thread only).
class MasterMessages {
 public:
  // The agent key every request carries (MasterIdentity::agent_key).
  void set_agent_key(uint64_t key) { agent_key_ = key; }
  // BatchPutStart / BatchUpsertStart for `keys` of `requests`, all with the same write options
  // (those of the first key's request).
  flatbuffers::DetachedBuffer WriteStart(uint64_t id, uint32_t agent, bool upsert,
                                         std::span<const HeldRequest> requests,
                                         std::span<const KeyRef> keys);
  // BatchPutEnd / BatchPutRevoke / BatchUpsertEnd / BatchUpsertRevoke.
  flatbuffers::DetachedBuffer WriteFinish(uint64_t id, uint32_t agent, mfb::Body type,
                                          std::span<const HeldRequest> requests,
                                          std::span<const KeyRef> keys,
                                          const WriteFinishFields& fields);
  // BatchPutCommit: a put of `keys` into reserved writes (fields.write_ids) that master
  // `master_epoch` reserved: WriteStart and End in one message.
  flatbuffers::DetachedBuffer WriteCommit(uint64_t id, uint32_t agent,
                                          std::span<const HeldRequest> requests,
                                          std::span<const KeyRef> keys,
                                          const WriteFinishFields& fields, uint64_t master_epoch);
  // ReserveWrites: `count` writes of `size` bytes, giving back `returned`.
  flatbuffers::DetachedBuffer ReserveWrites(uint64_t id, uint32_t agent, uint64_t size,
                                            uint8_t replica_count, uint32_t count,
                                            std::span<const uint64_t> returned);
  flatbuffers::DetachedBuffer ReportBadReplicas(uint64_t id, uint32_t agent,
                                                std::span<const BadReplicaReport> bad);
  // BatchGet / BatchExist / BatchRemove (with `force`).
  flatbuffers::DetachedBuffer KeyList(uint64_t id, mfb::Body type,
                                      std::span<const HeldRequest> requests,
                                      std::span<const KeyRef> keys, bool force = false);
  flatbuffers::DetachedBuffer RemoveAll(uint64_t id, bool force);
  // A page of readable keys starting with `prefix` (the master filters).
  flatbuffers::DetachedBuffer ListKeys(uint64_t id, uint64_t cursor, uint32_t limit,
                                       std::string_view prefix);
  flatbuffers::DetachedBuffer Stats(uint64_t id);
  flatbuffers::DetachedBuffer SessionStats(uint64_t id, std::string_view session_id,
                                           uint64_t cursor, uint32_t limit);

 private:
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> Keys(
      std::span<const HeldRequest> requests, std::span<const KeyRef> keys);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<mfb::BlockMeta>>> Blocks(
      std::span<const HeldRequest> requests, std::span<const KeyRef> keys);
  flatbuffers::DetachedBuffer Finish(uint64_t id, mfb::Body type, flatbuffers::Offset<void> body);
  using StringVector = flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>;
  flatbuffers::Offset<mfb::WriteStart> StartTable(uint32_t agent,
                                                  std::span<const HeldRequest> requests,
                                                  std::span<const KeyRef> keys);
  flatbuffers::Offset<mfb::WriteFinish> FinishTable(uint32_t agent,
                                                    flatbuffers::Offset<StringVector> keys,
                                                    const WriteFinishFields& fields);

  // Each message leaves with its buffer (Release): the first block of the next one is a fresh
  // allocation. Under 1 KiB it comes from malloc's per-thread cache; a larger one takes the
  // allocator's slow path (and a consolidation of its free lists) for every single-key call.
  flatbuffers::FlatBufferBuilder fbb_{960};
  std::vector<flatbuffers::Offset<flatbuffers::String>> strings_;
  std::vector<flatbuffers::Offset<mfb::BlockMeta>> blocks_;
  std::vector<uint64_t> sizes_;
  uint64_t agent_key_ = 0;
};

// The key at `ref` as it appears in the client's request.
std::string_view KeyAt(std::span<const HeldRequest> requests, KeyRef ref);

// A reply's request-level outcome: the master's status when it is not OK, else OK. INTERNAL when
// the body is not of the expected type (a master speaking another protocol version) or absent,
// so that after an OK the caller may read reply.body_as_X() without a null check.
Status ReplyStatus(const mfb::Reply& reply, mfb::ReplyBody expected);

// The PlacementReply of a WriteStart or BatchGet for `key_count` keys, checked for internal
// consistency (codes, first, sizes, write ids and pool references agree) so the pipeline can
// index it freely. Errors: the master's own request-level status, or INTERNAL for a malformed
// reply.
Result<const mfb::PlacementReply*> ReadPlacements(std::span<const uint8_t> bytes, size_t key_count,
                                                  bool with_sizes);

// The PlacementReply of a ReserveWrites: at most `max` reserved writes, checked as
// ReadPlacements checks a WriteStart's.
Result<const mfb::PlacementReply*> ReadReservations(std::span<const uint8_t> bytes, size_t max);

// The KeyCodesReply of a finish, exist or remove call for `key_count` keys (exists checked when
// `with_exists`).
Result<const mfb::KeyCodesReply*> ReadKeyCodes(std::span<const uint8_t> bytes, size_t key_count,
                                               bool with_exists);

// Per-key status `i` of a reply: its code and (when present) its message.
Status KeyStatus(const flatbuffers::Vector<uint16_t>* codes,
                 const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* messages,
                 size_t i);

}  // namespace kvagent::agent

// Builders for master.fbs requests and a checked reader for replies, shared by the RPC tests,
// the kvmaster process tests and the driver the Python test runs.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <string>
#include <vector>

#include "kvagent/schemas/master_generated.h"

namespace kvagent::master::testing {

namespace fb = kvagent::master_proto;
using Bytes = std::vector<uint8_t>;

inline Bytes Finish(flatbuffers::FlatBufferBuilder& b, fb::Body type,
                    flatbuffers::Offset<void> body, uint64_t id = 1) {
  b.Finish(fb::CreateRequest(b, id, type, body));
  return Bytes(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

inline Bytes RegisterAgentMsg(const std::string& name, uint64_t incarnation) {
  flatbuffers::FlatBufferBuilder b;
  auto m = fb::CreateRegisterAgent(b, b.CreateString(name), incarnation);
  return Finish(b, fb::Body::RegisterAgent, m.Union());
}

inline Bytes MountPoolMsg(uint32_t agent, uint64_t size, const std::string& endpoint) {
  flatbuffers::FlatBufferBuilder b;
  std::vector<std::string> eps = {endpoint};
  auto m = fb::CreateMountPool(b, agent, 0, size, b.CreateVectorOfStrings(eps));
  return Finish(b, fb::Body::MountPool, m.Union());
}

// keys/sizes/sessions as given (they may disagree on purpose); sessions empty: absent.
inline Bytes WriteStartMsg(uint32_t agent, const std::vector<std::string>& keys,
                           const std::vector<uint64_t>& sizes,
                           const std::vector<std::string>& sessions = {}, bool upsert = false,
                           uint8_t replicas = 1) {
  flatbuffers::FlatBufferBuilder b;
  auto k = b.CreateVectorOfStrings(keys);
  auto s = b.CreateVector(sizes);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> ss;
  if (!sessions.empty()) ss = b.CreateVectorOfStrings(sessions);
  auto opts = fb::CreateWriteOptions(b, replicas);
  auto m = fb::CreateWriteStart(b, agent, k, s, ss, 0, opts);
  return Finish(b, upsert ? fb::Body::BatchUpsertStart : fb::Body::BatchPutStart, m.Union());
}

inline Bytes WriteFinishMsg(fb::Body type, uint32_t agent, const std::vector<std::string>& keys) {
  flatbuffers::FlatBufferBuilder b;
  auto m = fb::CreateWriteFinish(b, agent, b.CreateVectorOfStrings(keys));
  return Finish(b, type, m.Union());
}

inline Bytes KeysMsg(fb::Body type, const std::vector<std::string>& keys, bool force = false) {
  flatbuffers::FlatBufferBuilder b;
  auto k = b.CreateVectorOfStrings(keys);
  switch (type) {
    case fb::Body::BatchGet:
      return Finish(b, type, fb::CreateBatchGet(b, k).Union());
    case fb::Body::BatchExist:
      return Finish(b, type, fb::CreateBatchExist(b, k).Union());
    default:
      return Finish(b, fb::Body::BatchRemove, fb::CreateBatchRemove(b, k, force).Union());
  }
}

inline Bytes RemoveAllMsg(bool force) {
  flatbuffers::FlatBufferBuilder b;
  return Finish(b, fb::Body::RemoveAll, fb::CreateRemoveAll(b, force).Union());
}

inline Bytes StatsMsg() {
  flatbuffers::FlatBufferBuilder b;
  return Finish(b, fb::Body::Stats, fb::CreateStats(b).Union());
}

// A follower's fetch: records after `after_seq` of the master of epoch `master_epoch`, held
// up to `wait_ms`; `detached`: the records asked for as a message part of their own.
inline Bytes ReplicateMsg(uint64_t after_seq, uint64_t master_epoch, uint32_t wait_ms = 0,
                          const std::string& follower = "", uint64_t id = 1,
                          bool detached = false) {
  flatbuffers::FlatBufferBuilder b;
  auto name = b.CreateString(follower);
  return Finish(b, fb::Body::Replicate,
                fb::CreateReplicate(b, after_seq, master_epoch, 4u << 20, wait_ms, name,
                                    /*electable=*/false, detached)
                    .Union(),
                id);
}

// The Reply in `bytes`, or nullptr when it does not verify.
inline const fb::Reply* ParseReply(const void* data, size_t size) {
  flatbuffers::Verifier v(static_cast<const uint8_t*>(data), size);
  if (!v.VerifyBuffer<fb::Reply>(nullptr)) return nullptr;
  return flatbuffers::GetRoot<fb::Reply>(data);
}

inline uint64_t StatValue(const fb::Reply* r, const std::string& name) {
  const fb::StatsReply* s = r->body_as_StatsReply();
  if (!s) return ~0ull;
  for (size_t i = 0; i < s->names()->size(); ++i) {
    if (s->names()->Get(i)->str() == name) return s->values()->Get(i);
  }
  return ~0ull;
}

}  // namespace kvagent::master::testing

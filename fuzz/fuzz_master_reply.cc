// kvmaster's replies as the agent reads them (agent/src/master_messages.cc): any bytes a
// (buggy, or impersonated) master could send. The link verifies first, then the pipeline reads
// with ReadPlacements / ReadKeyCodes / ReplyStatus. Must never crash or hit UB.
#include <flatbuffers/flatbuffers.h>

#include <glog/logging.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "master_messages.h"

// The code under test logs refusals; millions of runs must not print them.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte picks the key count the caller expects; the rest is the reply.
  const size_t keys = data[0] % 8;
  std::vector<uint64_t> aligned((size - 1 + 7) / 8 + 1);  // the link's 8-byte aligned copy
  auto* bytes = reinterpret_cast<uint8_t*>(aligned.data());
  std::copy(data + 1, data + size, bytes);
  const std::span<const uint8_t> reply(bytes, size - 1);
  flatbuffers::Verifier verifier(reply.data(), reply.size());
  if (reply.empty() || !verifier.VerifyBuffer<kvagent::master_proto::Reply>(nullptr)) return 0;
  using namespace kvagent::agent;
  uint64_t sink = 0;
  for (bool sizes : {false, true}) {
    auto placements = ReadPlacements(reply, keys, sizes);
    if (!placements.ok()) continue;
    const auto* p = *placements;
    for (size_t k = 0; k < keys; ++k) {
      sink += static_cast<uint64_t>(KeyStatus(p->codes(), p->messages(), k).code());
      sink += p->write_ids()->Get(static_cast<flatbuffers::uoffset_t>(k));
      if (sizes) sink += p->sizes()->Get(static_cast<flatbuffers::uoffset_t>(k));
      const uint32_t from = p->first()->Get(static_cast<flatbuffers::uoffset_t>(k));
      const uint32_t to = p->first()->Get(static_cast<flatbuffers::uoffset_t>(k + 1));
      for (uint32_t i = from; i < to; ++i) {
        const auto* pl = p->placements()->Get(i);
        sink += pl->offset() + pl->length() + pl->pool_id() + pl->part();
      }
    }
  }
  for (bool exists : {false, true}) {
    auto codes = ReadKeyCodes(reply, keys, exists);
    if (!codes.ok()) continue;
    for (size_t k = 0; k < keys; ++k) {
      sink += static_cast<uint64_t>(KeyStatus((*codes)->codes(), (*codes)->messages(), k).code());
      if (exists) sink += (*codes)->exists()->Get(static_cast<flatbuffers::uoffset_t>(k));
    }
  }
  const auto* root = flatbuffers::GetRoot<kvagent::master_proto::Reply>(reply.data());
  for (auto type : {kvagent::master_proto::ReplyBody::ListKeysReply,
                    kvagent::master_proto::ReplyBody::StatsReply}) {
    if (ReplyStatus(*root, type).ok()) sink += root->body() != nullptr;
  }
  volatile uint64_t keep = sink;
  (void)keep;
  return 0;
}

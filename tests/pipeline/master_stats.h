// A kvmaster's counters read straight from its RPC socket (a Stats request on a DEALER), for
// tests that must watch the master while its agents are stopped or cut off.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "kvagent/schemas/master_generated.h"

namespace kvagent::testing {

// The reply of the master at `endpoint` to `request` (a finished master.fbs Request), verified;
// nullopt when it does not answer in 2 s or the reply is not a Reply.
inline std::optional<std::vector<uint8_t>> CallMaster(
    const std::string& endpoint, const flatbuffers::FlatBufferBuilder& request) {
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 2000);
  dealer.connect(endpoint);
  dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  dealer.send(zmq::const_buffer(request.GetBufferPointer(), request.GetSize()),
              zmq::send_flags::none);
  zmq::message_t empty, body;
  if (!dealer.recv(empty) || !dealer.recv(body)) return std::nullopt;
  // ZMQ may hand the body at any address; FlatBuffers reads it aligned (UBSan checks), so copy.
  std::vector<uint8_t> bytes(static_cast<const uint8_t*>(body.data()),
                             static_cast<const uint8_t*>(body.data()) + body.size());
  flatbuffers::Verifier verifier(bytes.data(), bytes.size());
  if (!verifier.VerifyBuffer<kvagent::master_proto::Reply>(nullptr)) return std::nullopt;
  return bytes;
}

// Every counter of the master at `endpoint`, or nullopt when it does not answer in 2 s.
inline std::optional<std::map<std::string, uint64_t>> MasterStats(const std::string& endpoint) {
  namespace fb = kvagent::master_proto;
  flatbuffers::FlatBufferBuilder b;
  b.Finish(fb::CreateRequest(b, 1, fb::Body::Stats, fb::CreateStats(b).Union()));
  const auto bytes = CallMaster(endpoint, b);
  if (!bytes) return std::nullopt;
  const fb::StatsReply* r = flatbuffers::GetRoot<fb::Reply>(bytes->data())->body_as_StatsReply();
  if (r == nullptr || r->names() == nullptr || r->values() == nullptr) return std::nullopt;
  std::map<std::string, uint64_t> out;
  for (flatbuffers::uoffset_t i = 0; i < r->names()->size() && i < r->values()->size(); ++i) {
    out[r->names()->Get(i)->str()] = r->values()->Get(i);
  }
  return out;
}

// One counter (0 when the master does not answer or has no such counter).
inline uint64_t MasterStat(const std::string& endpoint, const std::string& name) {
  auto all = MasterStats(endpoint);
  if (!all) return 0;
  auto it = all->find(name);
  return it == all->end() ? 0 : it->second;
}

}  // namespace kvagent::testing

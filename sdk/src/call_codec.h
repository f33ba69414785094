// Local validation and FlatBuffers encoding of SDK calls, and decoding of completions.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "kvagent/client.h"
#include "kvagent/schemas/agent_generated.h"

namespace kvagent::sdk_detail {

// One call as the public API received it. Spans point at the caller's memory.
struct CallSpec {
  proto::Op op = proto::Op::Ping;
  std::span<const std::string> keys;
  std::span<const Value> values;                // Put/Upsert
  std::span<const ArenaBuffer* const> targets;  // Get into arena buffers
  std::span<const MemoryValue> memory_targets;  // Get into memory of this process (GetInto)
  const CallOptions* options = nullptr;
  const ListOptions* list = nullptr;          // List
  const SessionsOptions* sessions = nullptr;  // Sessions
};

// The shared validation boundary applied before anything is sent (the agent checks again):
// keys, session IDs and their count, one value/target per key, block metadata, write options.
Status ValidateCall(const CallSpec& spec);

// Where a request's values or targets are: arena ranges parallel to the keys (`buffers`), or
// ranges of the client's memory (`memory`, key after key, `memory_counts` per key); both empty
// for ops without values.
struct ValueLocations {
  std::span<const proto::BufferRef> buffers;
  std::span<const proto::MemoryRange> memory;
  std::span<const uint32_t> memory_counts;
  uint64_t call_word = 0;  // Request.call_word: 1 + the arena offset of the call's word; 0: none
};

// Encodes the request into `fbb` (cleared first). `timeout` and `deadline` (steady_clock:
// CLOCK_MONOTONIC) are the call's, sent so the agent can skip expired work.
std::span<const uint8_t> EncodeRequest(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                       const CallSpec& spec, const ValueLocations& where,
                                       std::chrono::milliseconds timeout,
                                       std::chrono::steady_clock::time_point deadline);

// Verifies and decodes a completion frame for a request of `key_count` keys. A frame that fails
// verification or has the wrong number of per-key codes becomes an INTERNAL reply.
Reply DecodeCompletion(std::span<const uint8_t> frame, size_t key_count);

// A Get's reply checked against each key's room (`capacities`, one per key): a key answered OK
// with no length or one its target cannot hold fails the whole reply with INTERNAL (the agent is
// buggy or of another version, and a caller would read past its buffer).
void CheckGetLengths(std::span<const uint64_t> capacities, Reply* reply);

// A reply in which the request and each of its `key_count` keys failed with `status`.
Reply FailedReply(const Status& status, size_t key_count);

}  // namespace kvagent::sdk_detail

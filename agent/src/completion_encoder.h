// Builds Completion FlatBuffers for the completion ring.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <span>

#include "kvagent/agent/request_handler.h"

namespace kvagent::agent {

// How much per-key text a completion carries.
enum class KeyMessages {
  kEach,     // every key's message (identical messages are stored once)
  kSummary,  // none per key; the request-level message counts the failed keys and quotes the
             // first failure (for a batch whose messages would not fit the completion ring)
};

// Encodes `data` as the completion of `request_id` into `fbb` (cleared first) and returns the
// finished bytes (valid until `fbb` is touched again).
std::span<const uint8_t> EncodeCompletion(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                          const CompletionData& data,
                                          KeyMessages key_messages = KeyMessages::kEach);

// Every one of `key_count` keys fails with `status`; the message is stored once and shared by
// every key, so the frame stays small for large batches.
std::span<const uint8_t> EncodeFailure(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                       const Status& status, size_t key_count);

// The answer to a Ping: OK, no keys.
std::span<const uint8_t> EncodePingReply(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id);

}  // namespace kvagent::agent

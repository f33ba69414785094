// Verification and validation of one request frame, before anything else looks at it.
#pragma once

#include <cstdint>
#include <span>

#include "kvagent/common/status.h"
#include "kvagent/schemas/agent_generated.h"
#include "process_memory.h"

namespace kvagent::agent {

struct CheckedRequest {
  // The verified request, or null when the frame is not a valid Request FlatBuffer.
  const proto::Request* request = nullptr;
  // OK, or why the request is refused (INVALID_PARAMS, BUFFER_OUT_OF_RANGE).
  Status status;
  // Keys in the request (0 when it failed verification): every one gets `status` on failure.
  size_t key_count = 0;
};

// Runs the FlatBuffers Verifier over `frame` (a private copy: the client cannot change it
// underneath), checks that its request_id equals the ring record's `request_id`, and checks the
// request against the shared validation boundary (common/validate.h) for its op: keys, session IDs,
// counts, buffer references inside an arena of `arena_bytes` (or, for a client granted
// `process_memory`, well-formed memory ranges), block metadata, write options, List's prefix
// and limit.
CheckedRequest CheckRequest(std::span<const uint8_t> frame, uint64_t request_id,
                            uint64_t arena_bytes, bool process_memory = false);

// The memory ranges [first, first + count) of a request (Request.memory; checked to exist).
ProcessMemory::Ranges ProcessRanges(const proto::Request& req, size_t first, size_t count);

}  // namespace kvagent::agent

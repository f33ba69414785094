// The agent's reading of the handshake messages a client sends on agent.sock (schemas/agent.fbs:
// Hello, Attached): verified, then copied into plain values, so the acceptor never touches a
// FlatBuffer it has not checked (and the fuzz harness reaches exactly this code).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kvagent/common/status.h"

namespace kvagent::agent {

struct HelloRequest {
  uint32_t protocol_version = 0;
  std::string client_name;  // sanitized for logs (SanitizedClientName)
  uint64_t arena_bytes = 0;
  uint64_t ring_bytes = 0;
  // Process memory asked for (0: not asked): the address in the client that holds the value.
  uint64_t memory_probe_address = 0;
  uint64_t memory_probe_value = 0;
};

struct AttachedRequest {
  uint64_t client_id = 0;
  bool has_peer_scratch = false;  // a process-memory client's scratch range in its arena
  uint64_t peer_scratch_offset = 0;
  uint64_t peer_scratch_length = 0;
};

// INVALID_PARAMS when `message` is not a valid Hello FlatBuffer.
[[nodiscard]] Result<HelloRequest> ReadHello(std::span<const uint8_t> message);
// What an Attached names; INVALID_PARAMS when `message` is not a valid Attached.
[[nodiscard]] Result<AttachedRequest> ReadAttached(std::span<const uint8_t> message);

// `name` as it may appear in a log line: printable ASCII kept, anything else (newlines, escape
// sequences, bytes of other scripts) as \xNN, at most 64 bytes of the original.
std::string SanitizedClientName(std::string_view name);

}  // namespace kvagent::agent

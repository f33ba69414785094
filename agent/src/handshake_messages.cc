#include "handshake_messages.h"

#include "kvagent/schemas/agent_generated.h"

namespace kvagent::agent {
namespace {

// Handshake messages are flat tables: nothing deeper or wider is legitimate.
template <typename T>
const T* VerifiedRoot(std::span<const uint8_t> message) {
  flatbuffers::Verifier verifier(message.data(), message.size(), 8, 64);
  if (message.size() < sizeof(flatbuffers::uoffset_t) || !verifier.VerifyBuffer<T>(nullptr)) {
    return nullptr;
  }
  return flatbuffers::GetRoot<T>(message.data());
}

}  // namespace

std::string SanitizedClientName(std::string_view name) {
  constexpr size_t kMaxShown = 64;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < name.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  if (name.size() > kMaxShown) out += "...";
  return out;
}

Result<HelloRequest> ReadHello(std::span<const uint8_t> message) {
  const proto::Hello* hello = VerifiedRoot<proto::Hello>(message);
  if (hello == nullptr) return InvalidParams("the Hello message is not a valid FlatBuffer");
  HelloRequest out;
  out.protocol_version = hello->protocol_version();
  out.client_name =
      SanitizedClientName(hello->client_name() ? hello->client_name()->string_view() : "");
  out.arena_bytes = hello->arena_bytes();
  out.ring_bytes = hello->ring_bytes();
  out.memory_probe_address = hello->memory_probe_address();
  out.memory_probe_value = hello->memory_probe_value();
  return out;
}

Result<AttachedRequest> ReadAttached(std::span<const uint8_t> message) {
  const proto::Attached* attached = VerifiedRoot<proto::Attached>(message);
  if (attached == nullptr) return InvalidParams("the Attached message is not a valid FlatBuffer");
  AttachedRequest out;
  out.client_id = attached->client_id();
  if (const proto::BufferRef* scratch = attached->peer_scratch()) {
    out.has_peer_scratch = true;
    out.peer_scratch_offset = scratch->offset();
    out.peer_scratch_length = scratch->length();
  }
  return out;
}

}  // namespace kvagent::agent

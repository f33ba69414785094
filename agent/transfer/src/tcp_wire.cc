#include "tcp_wire.h"

#include <endian.h>

#include <cstdio>
#include <cstring>

#include "kvagent/common/checksum.h"

namespace kvagent::transfer::wire {
namespace {

void Put16(uint8_t* out, uint16_t v) {
  v = htole16(v);
  std::memcpy(out, &v, sizeof(v));
}
void Put32(uint8_t* out, uint32_t v) {
  v = htole32(v);
  std::memcpy(out, &v, sizeof(v));
}
void Put64(uint8_t* out, uint64_t v) {
  v = htole64(v);
  std::memcpy(out, &v, sizeof(v));
}
uint16_t Get16(const uint8_t* in) {
  uint16_t v;
  std::memcpy(&v, in, sizeof(v));
  return le16toh(v);
}
uint32_t Get32(const uint8_t* in) {
  uint32_t v;
  std::memcpy(&v, in, sizeof(v));
  return le32toh(v);
}
uint64_t Get64(const uint8_t* in) {
  uint64_t v;
  std::memcpy(&v, in, sizeof(v));
  return le64toh(v);
}

Status BadMagic(const char* what, uint32_t got) {
  char text[96];
  std::snprintf(text, sizeof(text), "%s has bad magic 0x%08x (not a kvagent data-plane peer)", what,
                got);
  return InvalidParams(text);
}

}  // namespace

void EncodeHello(const Hello& hello, uint8_t out[kHelloBytes]) {
  Put32(out, kHelloMagic);
  Put16(out + 4, hello.version);
  Put16(out + 6, hello.flags);
  Put64(out + 8, hello.pool_size);
  Put64(out + 16, hello.pool_incarnation);
  std::memcpy(out + 24, hello.nonce.data(), kNonceBytes);
}

void EncodeAuth(const Auth& auth, uint8_t out[kAuthBytes]) {
  Put32(out, kAuthMagic);
  Put32(out + 4, 0);
  std::memcpy(out + 8, auth.nonce.data(), kNonceBytes);
  std::memcpy(out + 24, auth.proof.data(), kProofBytes);
}

void EncodeAuthOk(const std::array<uint8_t, kProofBytes>& proof, uint8_t out[kAuthOkBytes]) {
  Put32(out, kAuthOkMagic);
  Put32(out + 4, 0);
  std::memcpy(out + 8, proof.data(), kProofBytes);
}

Status DecodeAuth(const uint8_t in[kAuthBytes], Auth* auth) {
  if (Get32(in) != kAuthMagic) return BadMagic("authentication", Get32(in));
  if (Get32(in + 4) != 0) return InvalidParams("authentication has non-zero reserved bytes");
  std::memcpy(auth->nonce.data(), in + 8, kNonceBytes);
  std::memcpy(auth->proof.data(), in + 24, kProofBytes);
  return Status::Ok();
}

Status DecodeAuthOk(const uint8_t in[kAuthOkBytes], std::array<uint8_t, kProofBytes>* proof) {
  if (Get32(in) != kAuthOkMagic) return BadMagic("authentication answer", Get32(in));
  if (Get32(in + 4) != 0) return InvalidParams("authentication answer has non-zero reserved bytes");
  std::memcpy(proof->data(), in + 8, kProofBytes);
  return Status::Ok();
}

std::array<uint8_t, kProofBytes> AuthProof(const SymmetricKey& key, bool server,
                                           const uint8_t hello[kHelloBytes],
                                           const std::array<uint8_t, kNonceBytes>& client_nonce) {
  static constexpr char kClient[] = "kvagent data plane client";
  static constexpr char kServer[] = "kvagent data plane server";
  const char* label = server ? kServer : kClient;
  const size_t label_bytes = (server ? sizeof(kServer) : sizeof(kClient)) - 1;
  std::array<uint8_t, 64 + kHelloBytes + kNonceBytes> message{};
  std::memcpy(message.data(), label, label_bytes);
  std::memcpy(message.data() + label_bytes, hello, kHelloBytes);
  std::memcpy(message.data() + label_bytes + kHelloBytes, client_nonce.data(), kNonceBytes);
  return HmacSha256(key, std::span(message.data(), label_bytes + kHelloBytes + kNonceBytes));
}

void EncodeRequest(const Request& request, uint8_t out[kRequestBytes]) {
  Put32(out, kRequestMagic);
  out[4] = static_cast<uint8_t>(request.opcode);
  out[5] = request.has_payload_crc ? kRequestPayloadCrc : 0;
  out[6] = out[7] = 0;
  Put64(out + 8, request.id);
  Put64(out + 16, request.offset);
  Put64(out + 24, request.length);
  Put64(out + 32, request.pool_incarnation);
  Put64(out + 40, request.master_epoch);
  Put64(out + 48, request.write_id);
  Put32(out + 56, request.has_payload_crc ? request.payload_crc : 0);
  Put32(out + 60, Crc32c(out, kRequestBytes - 4));
}

void EncodeReply(const Reply& reply, uint8_t out[kReplyBytes]) {
  Put32(out, kReplyMagic);
  Put16(out + 4, reply.status);
  Put16(out + 6, 0);
  Put64(out + 8, reply.id);
  Put64(out + 16, reply.length);
}

Status DecodeHello(const uint8_t in[kHelloBytes], Hello* hello) {
  if (Get32(in) != kHelloMagic) return BadMagic("hello", Get32(in));
  hello->version = Get16(in + 4);
  if (hello->version != kVersion) {
    return InvalidParams("peer speaks data-plane version " + std::to_string(hello->version) +
                         ", this agent speaks " + std::to_string(kVersion) +
                         "; run the same kvagent version on every node");
  }
  hello->flags = Get16(in + 6);
  if ((hello->flags & ~kHelloAuthRequired) != 0) {
    return InvalidParams("hello has unknown flags " + std::to_string(hello->flags));
  }
  hello->pool_size = Get64(in + 8);
  hello->pool_incarnation = Get64(in + 16);
  std::memcpy(hello->nonce.data(), in + 24, kNonceBytes);
  return Status::Ok();
}

Status DecodeRequest(const uint8_t in[kRequestBytes], Request* request) {
  if (Get32(in) != kRequestMagic) return BadMagic("request", Get32(in));
  const uint8_t opcode = in[4];
  if (opcode != static_cast<uint8_t>(Opcode::kWrite) &&
      opcode != static_cast<uint8_t>(Opcode::kRead)) {
    return InvalidParams("request has unknown opcode " + std::to_string(opcode));
  }
  const uint32_t header_crc = Crc32c(in, kRequestBytes - 4);
  if (Get32(in + 60) != header_crc) {
    char text[96];
    std::snprintf(text, sizeof(text),
                  "request header CRC32C 0x%08x does not match its bytes (0x%08x): damaged",
                  Get32(in + 60), header_crc);
    return InvalidParams(text);
  }
  if ((in[5] & ~kRequestPayloadCrc) != 0 || in[6] != 0 || in[7] != 0) {
    return InvalidParams("request has non-zero reserved bytes");
  }
  const bool has_payload_crc = (in[5] & kRequestPayloadCrc) != 0;
  if (has_payload_crc && opcode != static_cast<uint8_t>(Opcode::kWrite)) {
    return InvalidParams("a READ request has a payload CRC");
  }
  if (!has_payload_crc && Get32(in + 56) != 0) {
    return InvalidParams("request has non-zero reserved bytes");
  }
  request->opcode = static_cast<Opcode>(opcode);
  request->id = Get64(in + 8);
  request->offset = Get64(in + 16);
  request->length = Get64(in + 24);
  request->pool_incarnation = Get64(in + 32);
  request->master_epoch = Get64(in + 40);
  request->write_id = Get64(in + 48);
  request->has_payload_crc = has_payload_crc;
  request->payload_crc = Get32(in + 56);
  return Status::Ok();
}

Status DecodeReply(const uint8_t in[kReplyBytes], Reply* reply) {
  if (Get32(in) != kReplyMagic) return BadMagic("reply", Get32(in));
  reply->status = Get16(in + 4);
  if (Get16(in + 6) != 0) return InvalidParams("reply has non-zero reserved bytes");
  reply->id = Get64(in + 8);
  reply->length = Get64(in + 16);
  if (reply->status != 0 && reply->length > kMaxErrorMessage) {
    return InvalidParams("reply carries an error message of " + std::to_string(reply->length) +
                         " bytes (limit " + std::to_string(kMaxErrorMessage) + ")");
  }
  return Status::Ok();
}

}  // namespace kvagent::transfer::wire

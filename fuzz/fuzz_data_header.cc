// The TCP data plane's fixed headers (agent/transfer/src/tcp_wire.h, read-only here): Hello,
// Auth, AuthOk, Request and Reply as a peer could send them. Must never crash or hit UB, and
// whatever decodes must encode back to the same bytes (the decoders reject reserved bits and
// unknown values). A request is decoded as given and again with its header CRC made right, so
// that the checks behind the CRC are reached.
#include <endian.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kvagent/common/checksum.h"
#include "tcp_wire.h"

namespace wire = kvagent::transfer::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t out[wire::kRequestBytes];
  if (size >= wire::kHelloBytes) {
    wire::Hello hello;
    if (wire::DecodeHello(data, &hello).ok()) {
      wire::EncodeHello(hello, out);
      if (std::memcmp(out, data, wire::kHelloBytes) != 0) std::abort();
    }
  }
  if (size >= wire::kAuthBytes) {
    wire::Auth auth;
    if (wire::DecodeAuth(data, &auth).ok()) {
      wire::EncodeAuth(auth, out);
      if (std::memcmp(out, data, wire::kAuthBytes) != 0) std::abort();
    }
  }
  if (size >= wire::kAuthOkBytes) {
    std::array<uint8_t, wire::kProofBytes> proof;
    if (wire::DecodeAuthOk(data, &proof).ok()) {
      wire::EncodeAuthOk(proof, out);
      if (std::memcmp(out, data, wire::kAuthOkBytes) != 0) std::abort();
    }
  }
  if (size >= wire::kRequestBytes) {
    uint8_t fixed[wire::kRequestBytes];
    std::memcpy(fixed, data, wire::kRequestBytes);
    const uint32_t crc = htole32(kvagent::Crc32c(fixed, wire::kRequestBytes - 4));
    std::memcpy(fixed + wire::kRequestBytes - 4, &crc, 4);
    for (const uint8_t* header : {data, static_cast<const uint8_t*>(fixed)}) {
      wire::Request request;
      if (wire::DecodeRequest(header, &request).ok()) {
        wire::EncodeRequest(request, out);
        if (std::memcmp(out, header, wire::kRequestBytes) != 0) std::abort();
      }
    }
  }
  if (size >= wire::kReplyBytes) {
    wire::Reply reply;
    if (wire::DecodeReply(data, &reply).ok()) {
      wire::EncodeReply(reply, out);
      if (std::memcmp(out, data, wire::kReplyBytes) != 0) std::abort();
    }
  }
  return 0;
}

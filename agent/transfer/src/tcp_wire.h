// The TCP data-plane protocol (version 4). One TCP connection per peer pair, requests pipelined
// and answered strictly in order. All integers little-endian, fixed-size headers:
//
//   server -> client, once, on accept      Hello   40 B  magic "KVTH" | version u16 | flags u16
//                                                        (bit 0: authentication required) |
//                                                        pool_size u64 | pool incarnation u64 |
//                                                        server nonce u8[16] (zero without auth)
//   with authentication (a cluster secret), before anything else:
//   client -> server                       Auth    56 B  magic "KVTA" | 0 u32 | client nonce
//                                                        u8[16] | proof u8[32]
//   server -> client                       AuthOk  40 B  magic "KVTK" | 0 u32 | proof u8[32]
//     client proof: HMAC-SHA-256(data-plane key, "kvagent data plane client" ++ Hello ++ client
//     nonce); server proof: the same with "kvagent data plane server". Each side proves it holds
//     the cluster secret; the nonces make a recorded exchange useless. A server requiring auth
//     closes a connection whose Auth is wrong or late; a client holding a secret refuses a server
//     that does not require auth (it could not prove membership).
//   client -> server                       Request 64 B  magic "KVTQ" | opcode u8 (1 WRITE,
//                                                        2 READ) | flags u8 (bit 0: payload
//                                                        CRC given) | 0 u16 | id u64 |
//                                                        offset u64 | length u64 |
//                                                        pool incarnation u64 | master epoch u64
//                                                        | write id u64 (WRITE; 0 for READ) |
//                                                        payload CRC32C u32 (WRITE with bit 0;
//                                                        else 0) | header CRC32C u32 (of the
//                                                        60 bytes before it)
//                                          WRITE: followed by `length` payload bytes
//   server -> client, one per request      Reply   24 B  magic "KVTR" | status u16 (ErrorCode
//                                                        wire value) | 0 u16 | id u64 |
//                                                        length u64
//                                          READ OK: followed by `length` bytes of pool data;
//                                          error: followed by `length` bytes of message text
//                                          (at most kMaxErrorMessage); WRITE OK: length 0
//
// Payloads are never framed or copied in user space: the client sends WRITE data from the
// caller's pointer (sendmsg with an iovec) and receives READ data straight into it; the server
// receives WRITE data straight into the pool and sends READ data from it.
//
// A request whose range is outside the pool, or that the pool's fence refuses (another pool
// incarnation, another master epoch, an abandoned write: pool_fence.h), gets an error reply (a
// WRITE's payload is read and discarded so the stream stays in step); a header that is not a
// valid request (bad magic, opcode, flags, reserved bytes or header CRC: bytes damaged on the
// way could name another offset) means the stream cannot be trusted: the server drops the
// connection. A WRITE whose payload does not match its payload CRC (damaged on the way) is
// answered DATA_CORRUPTED: its bytes are in the pool, but the write failed, so the master never
// makes that replica readable. The client also compares the Hello's pool incarnation with the
// one each op names and fails a mismatching op without sending it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/status.h"

namespace kvagent::transfer::wire {

inline constexpr uint32_t kHelloMagic = 0x4854564B;    // "KVTH" in little-endian byte order
inline constexpr uint32_t kRequestMagic = 0x5154564B;  // "KVTQ"
inline constexpr uint32_t kReplyMagic = 0x5254564B;    // "KVTR"
inline constexpr uint32_t kAuthMagic = 0x4154564B;     // "KVTA"
inline constexpr uint32_t kAuthOkMagic = 0x4B54564B;   // "KVTK"
inline constexpr uint16_t kVersion = 4;
inline constexpr uint16_t kHelloAuthRequired = 1;

inline constexpr size_t kHelloBytes = 40;
inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kProofBytes = 32;
inline constexpr size_t kAuthBytes = 56;
inline constexpr size_t kAuthOkBytes = 40;
inline constexpr size_t kRequestBytes = 64;
inline constexpr uint8_t kRequestPayloadCrc = 1;  // Request flags bit 0
inline constexpr size_t kReplyBytes = 24;
inline constexpr uint64_t kMaxErrorMessage = 4096;

enum class Opcode : uint8_t { kWrite = 1, kRead = 2 };

struct Hello {
  uint16_t version = kVersion;
  uint16_t flags = 0;
  uint64_t pool_size = 0;
  uint64_t pool_incarnation = 0;
  std::array<uint8_t, kNonceBytes> nonce{};
};

struct Auth {
  std::array<uint8_t, kNonceBytes> nonce{};
  std::array<uint8_t, kProofBytes> proof{};
};

struct Request {
  Opcode opcode = Opcode::kWrite;
  uint64_t id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t pool_incarnation = 0;  // the pool the placement was made in (0: not checked)
  uint64_t master_epoch = 0;      // the master that made it (0: not checked)
  uint64_t write_id = 0;          // WRITE: the write it serves
  bool has_payload_crc = false;   // WRITE: payload_crc is the payload's CRC32C
  uint32_t payload_crc = 0;
};

struct Reply {
  uint16_t status = 0;  // ErrorCode wire value
  uint64_t id = 0;
  uint64_t length = 0;
};

void EncodeHello(const Hello& hello, uint8_t out[kHelloBytes]);
void EncodeAuth(const Auth& auth, uint8_t out[kAuthBytes]);
void EncodeAuthOk(const std::array<uint8_t, kProofBytes>& proof, uint8_t out[kAuthOkBytes]);
void EncodeRequest(const Request& request, uint8_t out[kRequestBytes]);
void EncodeReply(const Reply& reply, uint8_t out[kReplyBytes]);

// Each decoder returns INVALID_PARAMS naming what is wrong ("bad magic 0x...", "unknown opcode
// 7", "reserved bytes not zero", "header CRC32C ...", "unsupported version 3", "error message of
// N bytes").
[[nodiscard]] Status DecodeHello(const uint8_t in[kHelloBytes], Hello* hello);
[[nodiscard]] Status DecodeRequest(const uint8_t in[kRequestBytes], Request* request);
[[nodiscard]] Status DecodeReply(const uint8_t in[kReplyBytes], Reply* reply);
[[nodiscard]] Status DecodeAuth(const uint8_t in[kAuthBytes], Auth* auth);
[[nodiscard]] Status DecodeAuthOk(const uint8_t in[kAuthOkBytes],
                                  std::array<uint8_t, kProofBytes>* proof);

// The proof of the client (`server` false) or the server of a connection: HMAC-SHA-256 under
// the data-plane key of the role's label, the hello as sent, and the client's nonce.
std::array<uint8_t, kProofBytes> AuthProof(const SymmetricKey& key, bool server,
                                           const uint8_t hello[kHelloBytes],
                                           const std::array<uint8_t, kNonceBytes>& client_nonce);

}  // namespace kvagent::transfer::wire

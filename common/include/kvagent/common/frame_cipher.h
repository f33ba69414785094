// The framed RPC transport under a cluster secret (version 2 of its wire, docs/protocol.md
// "Framed RPC"): a handshake that proves both ends hold the secret and agrees on session keys,
// and frames sealed with them.
//
// Handshake. Each side makes a fresh X25519 key pair per connection. The server sends its 8-byte
// hello prefix (version 2) as soon as it accepts; the client sends its prefix and its ephemeral
// public key (kSecureClientHelloRest bytes after the prefix); the server answers with its own
// ephemeral public key and a confirmation (kSecureServerHelloRest bytes). Both derive, with
// BLAKE2b keyed by the framed plane's key (FramedRpcKey: from the cluster secret), from the
// X25519 shared secret and both public keys:
//   base    = BLAKE2b-256(key = psk,  "kvmf v2" || dh || client pk || server pk)
//   c2s     = BLAKE2b-256(key = base, "client to server")
//   s2c     = BLAKE2b-256(key = base, "server to client")
//   confirm = BLAKE2b-256(key = base, "server confirms")
// The client checks `confirm` before it sends anything else: a server without the secret is
// named as such. A client without the secret cannot seal a frame the server opens: its first
// frame fails and the server closes the connection. Fresh key pairs give every connection its
// own keys (a recorded session cannot be replayed into another, and is not readable later from
// the cluster secret alone).
//
// Frames. Each is the 4-byte little-endian length of what follows, then the payload encrypted
// with ChaCha20-Poly1305 (IETF) and its 16-byte tag. The nonce is the frame's number in its
// direction (0, 1, ...: 8 bytes little-endian, then 4 zero bytes) and the length header is
// authenticated with it, so a frame that is changed, dropped, repeated or moved fails to open.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/status.h"

namespace kvagent {

inline constexpr uint32_t kFramedPlainVersion = 1;
inline constexpr uint32_t kFramedSecureVersion = 2;
// "KVMF" then the version as 4 little-endian bytes: the first bytes each side sends.
inline constexpr size_t kFrameHelloPrefixBytes = 8;
inline constexpr size_t kFramePublicKeyBytes = 32;
inline constexpr size_t kFrameConfirmBytes = 32;
inline constexpr size_t kFrameTagBytes = 16;
// What follows the prefix of a version 2 hello: the client's public key; the server's public key
// and its confirmation.
inline constexpr size_t kSecureClientHelloRest = kFramePublicKeyBytes;
inline constexpr size_t kSecureServerHelloRest = kFramePublicKeyBytes + kFrameConfirmBytes;

// The 8-byte hello prefix of `version`.
std::array<uint8_t, kFrameHelloPrefixBytes> FrameHelloPrefix(uint32_t version);

// The framed plane's key: derived from the cluster secret for this use only.
SymmetricKey FramedRpcKey(const ClusterSecret& secret);

// The two session keys of one end of a connection.
struct FrameSessionKeys {
  SymmetricKey send{};
  SymmetricKey receive{};
};

// Seals the frames of one direction under its session key, numbering them from 0.
class FrameSealer {
 public:
  explicit FrameSealer(const SymmetricKey& key) : key_(key) {}
  ~FrameSealer();
  FrameSealer(FrameSealer&&) noexcept = default;
  FrameSealer& operator=(FrameSealer&&) noexcept = default;

  // Appends one sealed frame holding `payload` (at most 4 GiB - 17 bytes) to `out`.
  void Append(std::vector<uint8_t>* out, std::span<const uint8_t> payload);

 private:
  SymmetricKey key_;
  uint64_t next_ = 0;
};

// Opens the frames of one direction, which must arrive in the order they were sealed.
class FrameOpener {
 public:
  explicit FrameOpener(const SymmetricKey& key) : key_(key) {}
  ~FrameOpener();
  FrameOpener(FrameOpener&&) noexcept = default;
  FrameOpener& operator=(FrameOpener&&) noexcept = default;

  // Decrypts `frame` (what follows a length header: ciphertext and tag) in place and returns the
  // payload, its first size() - 16 bytes. INVALID_PARAMS when it is shorter than a tag or does
  // not open (changed, replayed, reordered, sealed under another key): the stream cannot go on.
  Result<std::span<const uint8_t>> Open(std::span<uint8_t> frame);

 private:
  SymmetricKey key_;
  uint64_t next_ = 0;
};

// The client's half of the handshake: one per connection.
class FramedClientHandshake {
 public:
  explicit FramedClientHandshake(const SymmetricKey& psk);  // a fresh ephemeral key pair
  ~FramedClientHandshake();
  FramedClientHandshake(const FramedClientHandshake&) = delete;
  FramedClientHandshake& operator=(const FramedClientHandshake&) = delete;

  // What the client sends first: the version 2 prefix and its public key.
  std::vector<uint8_t> Hello() const;
  // From the server's kSecureServerHelloRest bytes after its prefix: the session keys, or
  // INVALID_PARAMS when its confirmation does not match (it does not hold the cluster secret,
  // or the bytes were changed on the way) or its public key is unusable.
  Result<FrameSessionKeys> Finish(std::span<const uint8_t> server_rest) const;

 private:
  SymmetricKey psk_;
  std::array<uint8_t, kFramePublicKeyBytes> public_key_{};
  std::array<uint8_t, 32> secret_key_{};
};

// The server's half: from the client's kSecureClientHelloRest bytes after its prefix, what to
// answer (after the prefix the server sent at accept) and the session keys. INVALID_PARAMS for
// an unusable public key.
struct FramedServerHandshake {
  std::array<uint8_t, kSecureServerHelloRest> reply{};
  FrameSessionKeys keys;
};
Result<FramedServerHandshake> AnswerFramedClient(const SymmetricKey& psk,
                                                 std::span<const uint8_t> client_rest);

}  // namespace kvagent

// The cluster secret: one shared secret, read from a file, from which every member of a cluster
// (kvmaster, its standby, the agents, authorised event subscribers) derives the keys it uses to
// prove membership to the others.
//
// Nothing here is sent over a network. A key is derived per purpose, so a key used for one plane
// (for example the data-plane HMAC) says nothing about the keys of another (the master's CURVE
// keys): derive(purpose) = BLAKE2b-256(key = BLAKE2b-256(file content), message = purpose).
//
// The file must be a regular file that only its owner can read or write (mode 0600 or 0400),
// owned by the reading process's user or by root, holding at least 32 bytes (after trailing
// whitespace is dropped, so `echo` and `printf` give the same secret). `kvctl secret generate`
// writes one; `head -c 32 /dev/urandom | base64 > FILE` does too. Under systemd,
// LoadCredential=cluster-secret:/etc/kvagent/cluster-secret puts a copy readable only by the
// service in $CREDENTIALS_DIRECTORY (see docs/operations.md).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kvagent/common/status.h"

namespace kvagent {

inline constexpr size_t kClusterSecretMinBytes = 32;
inline constexpr size_t kClusterSecretMaxBytes = 4096;

// A 32-byte symmetric key (BLAKE2b-256 output; HMAC-SHA-256 key size).
using SymmetricKey = std::array<uint8_t, 32>;
// HMAC-SHA-256 tag.
using MacTag = std::array<uint8_t, 32>;

// A CurveZMQ (X25519) key pair, in the 32-byte binary form ZMQ_CURVE_* options take
// (zmq/curve_auth.h sets them).
struct CurveKeyPair {
  std::array<uint8_t, 32> public_key{};
  std::array<uint8_t, 32> secret_key{};
};

// The two ends of a CURVE connection of one plane: every member holds both pairs (it may be the
// server of one socket and the client of another), so a server checks that its peer presented
// the plane's client public key, and a client pins the plane's server public key.
struct CurvePlaneKeys {
  CurveKeyPair server;
  CurveKeyPair client;
};

// The planes with keys of their own. Part of the protocol: the label of each is hashed into its
// keys, so renaming one changes its keys (never rename; add a new one).
enum class KeyPlane : uint8_t {
  kMasterRpc,     // kvmaster's RPC ROUTER (agents' master links, standbys' replication)
  kEvents,        // event PUB and replay ROUTER (kvmaster's, an agent's --events-tcp)
  kDataPlaneMac,  // the agents' TCP data plane: HMAC key of its challenge-response
};

// "master-rpc", "events", "data-plane-mac".
std::string_view KeyPlaneName(KeyPlane plane);

class ClusterSecret {
 public:
  // Reads and checks the file (see the header comment). Errors are INVALID_PARAMS with the path,
  // what is wrong and the command that fixes it (e.g. "chmod 600 FILE").
  static Result<ClusterSecret> LoadFromFile(const std::string& path);
  // The same checks on the content only; for tests and for secrets that come from elsewhere.
  static Result<ClusterSecret> FromBytes(std::string_view content);

  // 32 bytes for `purpose`, stable across processes and releases for the same secret.
  SymmetricKey DeriveKey(std::string_view purpose) const;
  // The CURVE server and client key pairs of `plane`.
  CurvePlaneKeys CurveKeys(KeyPlane plane) const;
  // The HMAC key of `plane` (meant for KeyPlane::kDataPlaneMac).
  SymmetricKey MacKey(KeyPlane plane) const;
  // 16 hex digits naming this secret (a hash of a hash: reveals nothing usable), for logs and
  // `kvctl stat`, so an operator can see whether two nodes hold the same secret.
  std::string Fingerprint() const;

  ClusterSecret(const ClusterSecret&) = default;
  ClusterSecret& operator=(const ClusterSecret&) = default;
  ~ClusterSecret();  // wipes the key

 private:
  ClusterSecret() = default;
  SymmetricKey root_{};  // BLAKE2b-256 of the trimmed file content
};

// HMAC-SHA-256 of `message` under `key`.
MacTag HmacSha256(const SymmetricKey& key, std::span<const uint8_t> message);
// True when `tag` is the HMAC-SHA-256 of `message` under `key`; compares in constant time.
bool VerifyHmacSha256(const SymmetricKey& key, std::span<const uint8_t> message,
                      std::span<const uint8_t> tag);
// Compares in time that depends only on the sizes (false when they differ).
bool ConstantTimeEqual(std::span<const uint8_t> a, std::span<const uint8_t> b);
// Fills `out` from the kernel's CSPRNG (challenge nonces).
void RandomBytes(std::span<uint8_t> out);
// Initialises libsodium once (thread-safe); aborts when the kernel offers no randomness. Every
// function here calls it; code that calls libsodium itself calls it first.
void EnsureSodium();

// Writes a new random secret (32 random bytes, base64, newline) to `path` with mode 0600; fails
// when the file exists (never overwrites a cluster's secret).
Status GenerateClusterSecretFile(const std::string& path);

}  // namespace kvagent

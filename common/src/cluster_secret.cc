#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/errno_text.h"
#include "kvagent/common/private_file.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace kvagent {
namespace {

std::string_view TrimTrailingWhitespace(std::string_view s) {
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

// The labels hashed into each plane's keys (see KeyPlane: never change one).
constexpr std::string_view kCurveServerLabel = "kvagent curve server v1 ";
constexpr std::string_view kCurveClientLabel = "kvagent curve client v1 ";
constexpr std::string_view kMacLabel = "kvagent hmac-sha256 v1 ";

}  // namespace

std::string_view KeyPlaneName(KeyPlane plane) {
  switch (plane) {
    case KeyPlane::kMasterRpc:
      return "master-rpc";
    case KeyPlane::kEvents:
      return "events";
    case KeyPlane::kDataPlaneMac:
      return "data-plane-mac";
  }
  return "unknown";
}

Result<ClusterSecret> ClusterSecret::FromBytes(std::string_view content) {
  EnsureSodium();
  const std::string_view trimmed = TrimTrailingWhitespace(content);
  if (trimmed.size() < kClusterSecretMinBytes) {
    return InvalidParams("the cluster secret is " + std::to_string(trimmed.size()) +
                         " bytes; it needs at least " + std::to_string(kClusterSecretMinBytes) +
                         " (generate one with `kvctl secret generate FILE`)");
  }
  if (trimmed.size() > kClusterSecretMaxBytes) {
    return InvalidParams("the cluster secret is " + std::to_string(trimmed.size()) +
                         " bytes; at most " + std::to_string(kClusterSecretMaxBytes) +
                         " are read (is it the right file?)");
  }
  ClusterSecret secret;
  crypto_generichash(secret.root_.data(), secret.root_.size(),
                     reinterpret_cast<const unsigned char*>(trimmed.data()), trimmed.size(),
                     nullptr, 0);
  return secret;
}

Result<ClusterSecret> ClusterSecret::LoadFromFile(const std::string& path) {
  const std::string what = "cluster secret file " + path;
  if (path.empty()) return InvalidParams("no cluster secret file given");
  auto read = ReadPrivateFile(path, what, static_cast<size_t>(kClusterSecretMaxBytes) + 64);
  if (!read.ok()) return read.status();
  std::string content = std::move(*read);
  Result<ClusterSecret> secret = FromBytes(content);
  sodium_memzero(content.data(), content.size());
  if (!secret.ok()) return InvalidParams(what + ": " + secret.status().message());
  return secret;
}

ClusterSecret::~ClusterSecret() { sodium_memzero(root_.data(), root_.size()); }

SymmetricKey ClusterSecret::DeriveKey(std::string_view purpose) const {
  EnsureSodium();
  SymmetricKey out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(purpose.data()),
                     purpose.size(), root_.data(), root_.size());
  return out;
}

CurvePlaneKeys ClusterSecret::CurveKeys(KeyPlane plane) const {
  auto pair_for = [&](std::string_view label) {
    std::string purpose(label);
    purpose += KeyPlaneName(plane);
    SymmetricKey seed = DeriveKey(purpose);
    CurveKeyPair pair;
    crypto_box_seed_keypair(pair.public_key.data(), pair.secret_key.data(), seed.data());
    sodium_memzero(seed.data(), seed.size());
    return pair;
  };
  return CurvePlaneKeys{pair_for(kCurveServerLabel), pair_for(kCurveClientLabel)};
}

SymmetricKey ClusterSecret::MacKey(KeyPlane plane) const {
  std::string purpose(kMacLabel);
  purpose += KeyPlaneName(plane);
  return DeriveKey(purpose);
}

std::string ClusterSecret::Fingerprint() const {
  const SymmetricKey id = DeriveKey("kvagent fingerprint v1");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < 8; ++i) {
    out += kHex[id[i] >> 4];
    out += kHex[id[i] & 0xf];
  }
  return out;
}

MacTag HmacSha256(const SymmetricKey& key, std::span<const uint8_t> message) {
  EnsureSodium();
  static_assert(crypto_auth_hmacsha256_BYTES == sizeof(MacTag));
  static_assert(crypto_auth_hmacsha256_KEYBYTES == sizeof(SymmetricKey));
  MacTag tag{};
  crypto_auth_hmacsha256(tag.data(), message.data(), message.size(), key.data());
  return tag;
}

bool VerifyHmacSha256(const SymmetricKey& key, std::span<const uint8_t> message,
                      std::span<const uint8_t> tag) {
  const MacTag expected = HmacSha256(key, message);
  return ConstantTimeEqual(expected, tag);
}

bool ConstantTimeEqual(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  EnsureSodium();
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

// libsodium must be initialised once before use; sodium_init is thread-safe and idempotent, and
// fails only when the kernel offers no randomness at all (then nothing here can be trusted).
void EnsureSodium() {
  static const bool ready = [] {
    if (sodium_init() < 0) {
      std::fprintf(stderr, "kvagent: libsodium failed to initialise (no kernel randomness?)\n");
      std::abort();
    }
    return true;
  }();
  (void)ready;
}

void RandomBytes(std::span<uint8_t> out) {
  EnsureSodium();
  randombytes_buf(out.data(), out.size());
}

Status GenerateClusterSecretFile(const std::string& path) {
  std::array<uint8_t, 32> raw{};
  RandomBytes(raw);
  char text[sodium_base64_ENCODED_LEN(32, sodium_base64_VARIANT_ORIGINAL)];
  sodium_bin2base64(text, sizeof(text), raw.data(), raw.size(), sodium_base64_VARIANT_ORIGINAL);
  sodium_memzero(raw.data(), raw.size());
  std::string content = std::string(text) + "\n";
  sodium_memzero(text, sizeof(text));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    return InvalidParams("cannot create cluster secret file " + path + ": " + ErrnoText(err) +
                         (err == EEXIST ? " (it exists; a secret is never overwritten)" : ""));
  }
  size_t done = 0;
  Status status;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = Internal("cannot write cluster secret file " + path + ": " + ErrnoText(errno));
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (status.ok() && ::fsync(fd) != 0) {
    status = Internal("cannot sync cluster secret file " + path + ": " + ErrnoText(errno));
  }
  ::close(fd);
  sodium_memzero(content.data(), content.size());
  if (!status.ok()) ::unlink(path.c_str());
  return status;
}

}  // namespace kvagent

#include "kvagent/common/frame_cipher.h"

#include <sodium.h>

#include <cstring>
#include <string>

#include "kvagent/common/frame_stream.h"

namespace kvagent {
namespace {

static_assert(crypto_aead_chacha20poly1305_ietf_ABYTES == kFrameTagBytes);
static_assert(crypto_aead_chacha20poly1305_ietf_KEYBYTES == sizeof(SymmetricKey));
static_assert(crypto_aead_chacha20poly1305_ietf_NPUBBYTES == 12);
static_assert(crypto_scalarmult_BYTES == kFramePublicKeyBytes);
static_assert(crypto_scalarmult_SCALARBYTES == 32);

using Nonce = std::array<uint8_t, crypto_aead_chacha20poly1305_ietf_NPUBBYTES>;

Nonce NonceOf(uint64_t n) {
  Nonce nonce{};
  for (int i = 0; i < 8; ++i) nonce[i] = static_cast<uint8_t>(n >> (8 * i));
  return nonce;
}

std::array<uint8_t, kFrameHeaderBytes> LengthHeader(size_t n) {
  return {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n >> 16),
          static_cast<uint8_t>(n >> 24)};
}

// BLAKE2b-256 keyed by `key` over the concatenation of `parts`.
SymmetricKey Blake2b(const SymmetricKey& key,
                     std::initializer_list<std::span<const uint8_t>> parts) {
  crypto_generichash_state state;
  crypto_generichash_init(&state, key.data(), key.size(), sizeof(SymmetricKey));
  for (const auto& p : parts) crypto_generichash_update(&state, p.data(), p.size());
  SymmetricKey out{};
  crypto_generichash_final(&state, out.data(), out.size());
  sodium_memzero(&state, sizeof(state));
  return out;
}

std::span<const uint8_t> Label(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

struct Derived {
  FrameSessionKeys client;  // send = c2s, receive = s2c
  SymmetricKey confirm{};
};

// The keys of a connection from the X25519 shared secret and both public keys; INVALID_PARAMS
// for a peer key that gives no shared secret (a low-order point).
Result<Derived> Derive(const SymmetricKey& psk, const std::array<uint8_t, 32>& own_secret,
                       std::span<const uint8_t> peer_public, std::span<const uint8_t> client_public,
                       std::span<const uint8_t> server_public) {
  std::array<uint8_t, crypto_scalarmult_BYTES> dh{};
  if (crypto_scalarmult(dh.data(), own_secret.data(), peer_public.data()) != 0) {
    return InvalidParams("the framed RPC peer sent an unusable public key");
  }
  SymmetricKey base = Blake2b(psk, {Label("kvmf v2"), dh, client_public, server_public});
  sodium_memzero(dh.data(), dh.size());
  Derived d;
  d.client.send = Blake2b(base, {Label("client to server")});
  d.client.receive = Blake2b(base, {Label("server to client")});
  d.confirm = Blake2b(base, {Label("server confirms")});
  sodium_memzero(base.data(), base.size());
  return d;
}

}  // namespace

std::array<uint8_t, kFrameHelloPrefixBytes> FrameHelloPrefix(uint32_t version) {
  return {'K',
          'V',
          'M',
          'F',
          static_cast<uint8_t>(version),
          static_cast<uint8_t>(version >> 8),
          static_cast<uint8_t>(version >> 16),
          static_cast<uint8_t>(version >> 24)};
}

SymmetricKey FramedRpcKey(const ClusterSecret& secret) {
  return secret.DeriveKey("kvagent framed master rpc v2");
}

FrameSealer::~FrameSealer() { sodium_memzero(key_.data(), key_.size()); }

void FrameSealer::Append(std::vector<uint8_t>* out, std::span<const uint8_t> payload) {
  const size_t sealed = payload.size() + kFrameTagBytes;
  const auto header = LengthHeader(sealed);
  const size_t at = out->size();
  out->resize(at + kFrameHeaderBytes + sealed);
  uint8_t* p = out->data() + at;
  std::memcpy(p, header.data(), header.size());
  const Nonce nonce = NonceOf(next_++);
  crypto_aead_chacha20poly1305_ietf_encrypt_detached(
      p + kFrameHeaderBytes, p + kFrameHeaderBytes + payload.size(), nullptr, payload.data(),
      payload.size(), header.data(), header.size(), nullptr, nonce.data(), key_.data());
}

FrameOpener::~FrameOpener() { sodium_memzero(key_.data(), key_.size()); }

Result<std::span<const uint8_t>> FrameOpener::Open(std::span<uint8_t> frame) {
  if (frame.size() < kFrameTagBytes) {
    return InvalidParams("a sealed frame of " + std::to_string(frame.size()) +
                         " bytes, shorter than its tag");
  }
  const size_t n = frame.size() - kFrameTagBytes;
  const auto header = LengthHeader(frame.size());
  const Nonce nonce = NonceOf(next_);
  if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(
          frame.data(), nullptr, frame.data(), n, frame.data() + n, header.data(), header.size(),
          nonce.data(), key_.data()) != 0) {
    return InvalidParams("frame " + std::to_string(next_) +
                         " does not authenticate: sealed under another key (the peer does not "
                         "hold this cluster secret), or changed, dropped or repeated on the way");
  }
  ++next_;
  return std::span<const uint8_t>(frame.data(), n);
}

FramedClientHandshake::FramedClientHandshake(const SymmetricKey& psk) : psk_(psk) {
  EnsureSodium();
  crypto_box_keypair(public_key_.data(), secret_key_.data());
}

FramedClientHandshake::~FramedClientHandshake() {
  sodium_memzero(secret_key_.data(), secret_key_.size());
  sodium_memzero(psk_.data(), psk_.size());
}

std::vector<uint8_t> FramedClientHandshake::Hello() const {
  const auto prefix = FrameHelloPrefix(kFramedSecureVersion);
  std::vector<uint8_t> out(prefix.size() + public_key_.size());
  std::memcpy(out.data(), prefix.data(), prefix.size());
  std::memcpy(out.data() + prefix.size(), public_key_.data(), public_key_.size());
  return out;
}

Result<FrameSessionKeys> FramedClientHandshake::Finish(std::span<const uint8_t> server_rest) const {
  if (server_rest.size() != kSecureServerHelloRest) {
    return InvalidParams("a framed RPC server hello of " + std::to_string(server_rest.size()) +
                         " bytes after its prefix; expected " +
                         std::to_string(kSecureServerHelloRest));
  }
  const auto server_public = server_rest.first(kFramePublicKeyBytes);
  auto d = Derive(psk_, secret_key_, server_public, public_key_, server_public);
  if (!d.ok()) return d.status();
  if (!ConstantTimeEqual(d->confirm, server_rest.subspan(kFramePublicKeyBytes))) {
    return InvalidParams(
        "the framed RPC server does not hold this cluster secret (its handshake does not "
        "confirm the key; or the bytes were changed on the way)");
  }
  return d->client;
}

Result<FramedServerHandshake> AnswerFramedClient(const SymmetricKey& psk,
                                                 std::span<const uint8_t> client_rest) {
  if (client_rest.size() != kSecureClientHelloRest) {
    return InvalidParams("a framed RPC client hello of " + std::to_string(client_rest.size()) +
                         " bytes after its prefix; expected " +
                         std::to_string(kSecureClientHelloRest));
  }
  EnsureSodium();
  std::array<uint8_t, kFramePublicKeyBytes> server_public{};
  std::array<uint8_t, 32> server_secret{};
  crypto_box_keypair(server_public.data(), server_secret.data());
  auto d = Derive(psk, server_secret, client_rest, client_rest, server_public);
  sodium_memzero(server_secret.data(), server_secret.size());
  if (!d.ok()) return d.status();
  FramedServerHandshake h;
  std::memcpy(h.reply.data(), server_public.data(), server_public.size());
  std::memcpy(h.reply.data() + kFramePublicKeyBytes, d->confirm.data(), d->confirm.size());
  h.keys.send = d->client.receive;
  h.keys.receive = d->client.send;
  return h;
}

// OutgoingBytes (frame_stream.h) seals here, so that a user of the plain wire links no cipher.
void OutgoingBytes::AppendSealedFrame(FrameSealer& sealer, std::span<const uint8_t> payload) {
  sealer.Append(&bytes_, payload);
}

}  // namespace kvagent

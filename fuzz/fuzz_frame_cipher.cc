// The framed RPC wire under a cluster secret (common/frame_cipher.h), as kvmaster's
// --framed-listen reads it. The first byte picks a mode and how the stream is cut into reads:
//   even: a hostile peer: the rest is the stream itself (hello, then frames). Must never crash or
//         hit UB, and no frame may open (the fuzzer does not hold the key).
//   odd:  a member: the rest is cut into payloads (a length byte, then that many bytes), sealed
//         by a real client after a real handshake; every payload must come out of the server's
//         reader and opener exactly as it went in.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "kvagent/common/frame_cipher.h"
#include "kvagent/common/frame_stream.h"

namespace {

constexpr size_t kLimit = 4096;

const kvagent::SymmetricKey& Key() {
  static const kvagent::SymmetricKey key = kvagent::FramedRpcKey(
      *kvagent::ClusterSecret::FromBytes("the fuzzer's cluster secret, 32 bytes or more"));
  return key;
}

// Feeds `stream` to a server-side reader in reads of `piece` bytes and opens every frame with
// `opener`, or, without one, with the keys of its own answer to the stream's hello. Calls
// `on_payload` for each opened payload; returns false when the stream ended the connection.
template <class OnPayload>
bool Serve(const uint8_t* stream, size_t size, size_t piece,
           std::optional<kvagent::FrameOpener> opener, OnPayload&& on_payload) {
  kvagent::FrameReader reader(kLimit + kvagent::kFrameTagBytes, kvagent::kFramedSecureVersion,
                              kvagent::kSecureClientHelloRest);
  size_t at = 0;
  while (at < size) {
    const size_t n = std::min(piece, size - at);
    std::span<uint8_t> space = reader.Space(n);
    std::memcpy(space.data(), stream + at, n);
    reader.Commit(n);
    at += n;
    while (true) {
      auto frame = reader.Next();
      if (!frame.ok()) return false;
      if (!opener && reader.hello_done()) {
        auto answer = kvagent::AnswerFramedClient(Key(), reader.hello_rest());
        if (!answer.ok()) return false;
        opener.emplace(answer->keys.receive);
      }
      if (!frame->has_value()) break;
      if ((*frame)->size() > kLimit + kvagent::kFrameTagBytes) std::abort();
      auto plain = opener->Open(**frame);
      if (!plain.ok()) return false;
      on_payload(*plain);
    }
    reader.Compact();
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t piece = 1 + data[0] / 2 % 64 * 37;
  const bool member = (data[0] & 1) != 0;
  ++data;
  --size;
  if (!member) {
    // Nothing the fuzzer makes up may open: it would be a forgery.
    Serve(data, size, piece, std::nullopt, [](std::span<const uint8_t>) { std::abort(); });
    return 0;
  }
  // A member's stream: its hello, then its payloads sealed; the server's answer goes back to it.
  kvagent::FramedClientHandshake client(Key());
  std::vector<uint8_t> stream = client.Hello();
  auto answer = kvagent::AnswerFramedClient(
      Key(), std::span(stream).subspan(kvagent::kFrameHelloPrefixBytes));
  if (!answer.ok()) std::abort();
  auto keys = client.Finish(answer->reply);
  if (!keys.ok()) std::abort();
  kvagent::FrameSealer sealer(keys->send);
  std::vector<std::vector<uint8_t>> sent;
  for (size_t i = 0; i < size;) {
    const size_t n = std::min<size_t>(data[i], size - i - 1);
    sent.emplace_back(data + i + 1, data + i + 1 + n);
    sealer.Append(&stream, sent.back());
    i += 1 + n;
  }
  // The server's half of the same handshake (`answer`) reads them back.
  size_t next = 0;
  const bool served = Serve(
      stream.data(), stream.size(), piece, kvagent::FrameOpener(answer->keys.receive),
      [&](std::span<const uint8_t> plain) {
        if (next >= sent.size() || plain.size() != sent[next].size() ||
            (!plain.empty() && std::memcmp(plain.data(), sent[next].data(), plain.size()) != 0)) {
          std::abort();
        }
        ++next;
      });
  if (!served) std::abort();
  if (next != sent.size()) std::abort();
  return 0;
}

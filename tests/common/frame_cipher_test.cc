// The framed RPC wire under a cluster secret (common/frame_cipher.h): both halves of the
// handshake agree on keys only with the same secret, every connection gets keys of its own, and
// a sealed frame opens only unchanged, in its place, under its key.
#include "kvagent/common/frame_cipher.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "kvagent/common/frame_stream.h"
#include "kvagent/common/unique_fd.h"

namespace kvagent {
namespace {

SymmetricKey SecretKey(const std::string& secret) {
  return FramedRpcKey(*ClusterSecret::FromBytes(secret));
}

const std::string kOurs = "the cluster's own secret: 32 bytes or more, really";
const std::string kOther = "some other cluster's secret, also long enough!!";

// Both halves of one handshake: the client's keys, then the server's.
struct Handshake {
  Result<FrameSessionKeys> client = Status::Ok();
  Result<FramedServerHandshake> server = Status::Ok();
};

Handshake Shake(const SymmetricKey& client_key, const SymmetricKey& server_key) {
  FramedClientHandshake client(client_key);
  const std::vector<uint8_t> hello = client.Hello();
  EXPECT_EQ(hello.size(), kFrameHelloPrefixBytes + kSecureClientHelloRest);
  const auto prefix = FrameHelloPrefix(kFramedSecureVersion);
  EXPECT_EQ(std::memcmp(hello.data(), prefix.data(), prefix.size()), 0);
  Handshake h;
  h.server = AnswerFramedClient(server_key, std::span(hello).subspan(kFrameHelloPrefixBytes));
  if (h.server.ok()) h.client = client.Finish(h.server->reply);
  return h;
}

std::vector<uint8_t> Plain(const std::string& s) { return {s.begin(), s.end()}; }

// The frames of `stream` after its length headers, as FrameReader hands them out.
std::vector<std::vector<uint8_t>> SealedFrames(const std::vector<uint8_t>& stream) {
  FrameReader reader(1 << 20, /*hello=*/false);
  auto space = reader.Space(stream.size());
  std::memcpy(space.data(), stream.data(), stream.size());
  reader.Commit(stream.size());
  std::vector<std::vector<uint8_t>> out;
  while (true) {
    auto f = reader.Next();
    EXPECT_TRUE(f.ok());
    if (!f.ok() || !f->has_value()) break;
    out.emplace_back((*f)->begin(), (*f)->end());
  }
  return out;
}

TEST(FrameCipher, BothEndsAgreeOnKeysAndFramesOpenInOrder) {
  const Handshake h = Shake(SecretKey(kOurs), SecretKey(kOurs));
  ASSERT_TRUE(h.server.ok()) << h.server.status().ToString();
  ASSERT_TRUE(h.client.ok()) << h.client.status().ToString();
  EXPECT_EQ(h.client->send, h.server->keys.receive);
  EXPECT_EQ(h.client->receive, h.server->keys.send);
  EXPECT_NE(h.client->send, h.client->receive);  // each direction its own key

  FrameSealer to_server(h.client->send);
  FrameOpener server_in(h.server->keys.receive);
  std::vector<uint8_t> stream;
  const std::vector<std::string> payloads = {"first request", "", std::string(70000, 'x'), "last"};
  for (const auto& p : payloads) to_server.Append(&stream, Plain(p));
  // Nothing of a payload is on the wire in the clear.
  const std::string wire(stream.begin(), stream.end());
  EXPECT_EQ(wire.find("first request"), std::string::npos);
  EXPECT_EQ(wire.find(std::string(64, 'x')), std::string::npos);
  auto frames = SealedFrames(stream);
  ASSERT_EQ(frames.size(), payloads.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ(frames[i].size(), payloads[i].size() + kFrameTagBytes);
    auto plain = server_in.Open(frames[i]);
    ASSERT_TRUE(plain.ok()) << plain.status().ToString();
    EXPECT_EQ(std::string(plain->begin(), plain->end()), payloads[i]);
  }
  // And the other way.
  FrameSealer to_client(h.server->keys.send);
  FrameOpener client_in(h.client->receive);
  std::vector<uint8_t> back;
  to_client.Append(&back, Plain("a reply"));
  auto reply = SealedFrames(back);
  ASSERT_EQ(reply.size(), 1u);
  auto plain = client_in.Open(reply[0]);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(std::string(plain->begin(), plain->end()), "a reply");
}

TEST(FrameCipher, AClientFindsOutThatTheServerHoldsAnotherSecret) {
  const Handshake h = Shake(SecretKey(kOurs), SecretKey(kOther));
  ASSERT_TRUE(h.server.ok());  // the server cannot tell yet: the client's first frame tells it
  ASSERT_FALSE(h.client.ok());
  EXPECT_EQ(h.client.status().code(), ErrorCode::kInvalidParams);
  EXPECT_NE(h.client.status().message().find("does not hold this cluster secret"),
            std::string::npos)
      << h.client.status().message();
}

TEST(FrameCipher, AServerOpensNothingSealedWithoutTheSecret) {
  // An outsider that ignores the failed confirmation and sends frames anyway.
  FramedClientHandshake outsider(SecretKey(kOther));
  const std::vector<uint8_t> hello = outsider.Hello();
  auto server =
      AnswerFramedClient(SecretKey(kOurs), std::span(hello).subspan(kFrameHelloPrefixBytes));
  ASSERT_TRUE(server.ok());
  // The outsider's own keys, from the same exchange under its secret, as it would compute them.
  FrameSealer forged(SecretKey(kOther));
  std::vector<uint8_t> stream;
  forged.Append(&stream, Plain("remove everything"));
  FrameOpener in(server->keys.receive);
  auto frames = SealedFrames(stream);
  auto plain = in.Open(frames[0]);
  ASSERT_FALSE(plain.ok());
  EXPECT_NE(plain.status().message().find("does not authenticate"), std::string::npos);
}

TEST(FrameCipher, AChangedRepeatedDroppedOrShortFrameDoesNotOpen) {
  const Handshake h = Shake(SecretKey(kOurs), SecretKey(kOurs));
  ASSERT_TRUE(h.client.ok());
  FrameSealer sealer(h.client->send);
  std::vector<uint8_t> stream;
  for (const char* p : {"zero", "one", "two"}) sealer.Append(&stream, Plain(p));
  const auto frames = SealedFrames(stream);
  ASSERT_EQ(frames.size(), 3u);
  {  // one bit flipped, in the payload or in the tag
    for (size_t at : {size_t{0}, frames[0].size() - 1}) {
      FrameOpener in(h.server->keys.receive);
      auto f = frames[0];
      f[at] ^= 0x01;
      EXPECT_FALSE(in.Open(f).ok()) << at;
    }
  }
  {  // a frame repeated
    FrameOpener in(h.server->keys.receive);
    auto f0 = frames[0], again = frames[0];
    ASSERT_TRUE(in.Open(f0).ok());
    EXPECT_FALSE(in.Open(again).ok());
  }
  {  // a frame dropped (or two swapped)
    FrameOpener in(h.server->keys.receive);
    auto f1 = frames[1];
    EXPECT_FALSE(in.Open(f1).ok());
  }
  {  // a frame cut (its length header authenticates its length)
    FrameOpener in(h.server->keys.receive);
    std::vector<uint8_t> cut(frames[0].begin(), frames[0].end() - 1);
    EXPECT_FALSE(in.Open(cut).ok());
    std::vector<uint8_t> tiny(kFrameTagBytes - 1, 0);
    EXPECT_FALSE(in.Open(tiny).ok());
  }
  {  // a frame sealed in the other direction, reflected back
    FrameOpener in(h.client->receive);
    auto f0 = frames[0];
    EXPECT_FALSE(in.Open(f0).ok());
  }
}

TEST(FrameCipher, EveryConnectionHasKeysOfItsOwn) {
  const Handshake a = Shake(SecretKey(kOurs), SecretKey(kOurs));
  const Handshake b = Shake(SecretKey(kOurs), SecretKey(kOurs));
  ASSERT_TRUE(a.client.ok() && b.client.ok());
  EXPECT_NE(a.client->send, b.client->send);
  // A frame recorded on one connection does not open on another.
  FrameSealer sealer(a.client->send);
  std::vector<uint8_t> stream;
  sealer.Append(&stream, Plain("recorded"));
  FrameOpener other(b.server->keys.receive);
  auto f = SealedFrames(stream);
  EXPECT_FALSE(other.Open(f[0]).ok());
}

TEST(FrameCipher, UnusableHelloBytesAreRefused) {
  // A public key of zeros gives no shared secret (a low-order point).
  const std::vector<uint8_t> zeros(kSecureClientHelloRest, 0);
  auto s = AnswerFramedClient(SecretKey(kOurs), zeros);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(AnswerFramedClient(SecretKey(kOurs), std::span(zeros).first(5)).ok());
  FramedClientHandshake client(SecretKey(kOurs));
  EXPECT_FALSE(client.Finish(std::vector<uint8_t>(kSecureServerHelloRest, 0)).ok());
  EXPECT_FALSE(client.Finish(std::vector<uint8_t>(3, 1)).ok());
}

TEST(FrameCipher, TheReaderChecksTheVersionBeforeTheRestOfTheHello) {
  FrameReader secure(1 << 20, kFramedSecureVersion, kSecureClientHelloRest);
  auto space = secure.Space(kFrameHello.size());
  std::memcpy(space.data(), kFrameHello.data(), kFrameHello.size());  // a plain client's hello
  secure.Commit(kFrameHello.size());
  auto r = secure.Next();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("version 1, this end version 2"), std::string::npos)
      << r.status().message();
  // The rest of a version 2 hello comes out once whole.
  FrameReader reader(1 << 20, kFramedSecureVersion, kSecureClientHelloRest);
  FramedClientHandshake client(SecretKey(kOurs));
  const auto hello = client.Hello();
  for (size_t i = 0; i < hello.size(); ++i) {
    auto s = reader.Space(1);
    s[0] = hello[i];
    reader.Commit(1);
    auto next = reader.Next();
    ASSERT_TRUE(next.ok());
    EXPECT_FALSE(next->has_value());
    EXPECT_EQ(reader.hello_done(), i + 1 == hello.size());
  }
  ASSERT_EQ(reader.hello_rest().size(), kSecureClientHelloRest);
  EXPECT_EQ(std::memcmp(reader.hello_rest().data(), hello.data() + kFrameHelloPrefixBytes,
                        kSecureClientHelloRest),
            0);
}

TEST(FrameCipher, OutgoingBytesQueueAndWriteWhatTheSealerSeals) {
  const SymmetricKey key = SecretKey(kOurs);
  FrameSealer direct(key);
  FrameSealer queued_by(key);  // the same key and sequence: the same bytes
  const std::vector<uint8_t> payload = {'r', 'e', 'p', 'l', 'y'};
  std::vector<uint8_t> expected;
  direct.Append(&expected, payload);
  OutgoingBytes out;
  out.AppendSealedFrame(queued_by, payload);
  EXPECT_EQ(out.queued(), expected.size());

  int fds[2] = {-1, -1};
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  const UniqueFd writer(fds[0]), reader(fds[1]);
  ASSERT_TRUE(out.FlushTo(writer.get(), "peer").ok());
  EXPECT_TRUE(out.empty());
  std::vector<uint8_t> got(expected.size() + 1);
  ASSERT_EQ(::read(reader.get(), got.data(), got.size()), static_cast<ssize_t>(expected.size()));
  got.resize(expected.size());
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace kvagent

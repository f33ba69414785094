// The framed RPC transport's wire (common/frame_stream.h): frames cut anywhere by the stream,
// the hello, the limit that bounds what a connection holds, and the outgoing bytes written as a
// non-blocking socket takes them.
#include "kvagent/common/frame_stream.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvagent/common/errno_text.h"
#include "kvagent/common/unique_fd.h"

namespace kvagent {
namespace {

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Feeds `stream` to `reader` in pieces of the given sizes (cycled) and returns the frames.
Result<std::vector<std::string>> ReadAll(FrameReader& reader, const std::vector<uint8_t>& stream,
                                         const std::vector<size_t>& pieces) {
  std::vector<std::string> frames;
  size_t at = 0;
  for (size_t i = 0; at < stream.size(); ++i) {
    const size_t n = std::min(pieces[i % pieces.size()], stream.size() - at);
    std::span<uint8_t> space = reader.Space(n);
    std::memcpy(space.data(), stream.data() + at, n);
    reader.Commit(n);
    at += n;
    while (true) {
      auto frame = reader.Next();
      if (!frame.ok()) return frame.status();
      if (!frame->has_value()) break;
      frames.emplace_back(reinterpret_cast<const char*>((*frame)->data()), (*frame)->size());
    }
    reader.Compact();
  }
  return frames;
}

TEST(FrameStream, FramesComeOutWholeHoweverTheStreamIsCut) {
  std::vector<uint8_t> stream(kFrameHello.begin(), kFrameHello.end());
  const std::vector<std::string> sent = {"", "a", std::string(1000, 'x'), "last one"};
  for (const std::string& f : sent) AppendFrame(&stream, Bytes(f));
  for (const std::vector<size_t>& pieces :
       std::vector<std::vector<size_t>>{{1}, {3}, {7, 1, 2}, {4096}, {5, 1000}}) {
    FrameReader reader(1 << 20, /*hello=*/true);
    auto frames = ReadAll(reader, stream, pieces);
    ASSERT_TRUE(frames.ok()) << frames.status().ToString();
    EXPECT_EQ(*frames, sent);
    EXPECT_EQ(reader.buffered(), 0u);
    EXPECT_TRUE(reader.hello_done());
  }
}

TEST(FrameStream, AnotherProtocolIsRefusedAtItsFirstByte) {
  // A ZMQ greeting starts with 0xFF: the reader says so before 8 bytes arrived.
  FrameReader reader(1 << 20, /*hello=*/true);
  const uint8_t zmtp[] = {0xFF, 0, 0};
  std::span<uint8_t> space = reader.Space(sizeof(zmtp));
  std::memcpy(space.data(), zmtp, sizeof(zmtp));
  reader.Commit(sizeof(zmtp));
  auto frame = reader.Next();
  ASSERT_FALSE(frame.ok());
  EXPECT_EQ(frame.status().code(), ErrorCode::kInvalidParams);
  EXPECT_NE(frame.status().message().find("hello"), std::string::npos);
}

TEST(FrameStream, AnotherVersionIsRefused) {
  std::string hello(kFrameHello);
  hello[4] = 2;
  FrameReader reader(1 << 20, /*hello=*/true);
  auto frames = ReadAll(reader, Bytes(hello), {8});
  EXPECT_FALSE(frames.ok());
}

TEST(FrameStream, AFrameOverTheLimitIsRefusedBeforeItsBytesAreKept) {
  FrameReader reader(100, /*hello=*/false);
  std::vector<uint8_t> stream;
  AppendFrame(&stream, std::vector<uint8_t>(100, 1));  // at the limit: fine
  const uint8_t huge[] = {0xFF, 0xFF, 0xFF, 0x7F};     // ~2 GiB named
  stream.insert(stream.end(), huge, huge + sizeof(huge));
  auto frames = ReadAll(reader, stream, {stream.size()});
  ASSERT_FALSE(frames.ok());
  EXPECT_NE(frames.status().message().find("over the limit of 100"), std::string::npos);
  EXPECT_LE(reader.buffered(), 4u);  // only the header of the refused frame
}

TEST(FrameStream, WhatAReaderHoldsIsBoundedByTheLimitNotByTheStream) {
  // 64 frames of 64 KiB fed in 256 KiB pieces: the buffer never holds much more than a frame
  // and a piece, however long the stream.
  constexpr size_t kFrame = 64 * 1024, kPiece = 256 * 1024;
  FrameReader reader(kFrame, /*hello=*/false);
  std::vector<uint8_t> stream;
  for (int i = 0; i < 64; ++i) AppendFrame(&stream, std::vector<uint8_t>(kFrame, i));
  auto frames = ReadAll(reader, stream, {kPiece});
  ASSERT_TRUE(frames.ok());
  ASSERT_EQ(frames->size(), 64u);
  EXPECT_EQ((*frames)[63], std::string(kFrame, static_cast<char>(63)));
}

TEST(FrameStream, RandomCutsOfRandomFrames) {
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::vector<uint8_t> stream(kFrameHello.begin(), kFrameHello.end());
    std::vector<std::string> sent;
    for (int i = 0; i < 20; ++i) {
      std::string f(rng() % 3000, '\0');
      for (char& c : f) c = static_cast<char>(rng());
      AppendFrame(&stream, Bytes(f));
      sent.push_back(f);
    }
    std::vector<size_t> pieces;
    for (int i = 0; i < 16; ++i) pieces.push_back(1 + rng() % 5000);
    FrameReader reader(3000, /*hello=*/true);
    auto frames = ReadAll(reader, stream, pieces);
    ASSERT_TRUE(frames.ok());
    EXPECT_EQ(*frames, sent);
  }
}

// A connected pair of non-blocking stream sockets: [0] is written by OutgoingBytes, [1] read.
std::array<UniqueFd, 2> NonBlockingPair() {
  int fds[2] = {-1, -1};
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Everything `fd` has to read now.
std::string ReadEverything(int fd) {
  std::string got;
  char chunk[64 * 1024];
  ssize_t n;
  while ((n = ::read(fd, chunk, sizeof(chunk))) > 0) got.append(chunk, static_cast<size_t>(n));
  return got;
}

TEST(FrameStream, OutgoingBytesWriteTheHelloThenTheFramesInOrder) {
  auto pair = NonBlockingPair();
  OutgoingBytes out;
  EXPECT_TRUE(out.empty());
  out.Append(kFrameHello);
  out.AppendFrame(Bytes("first"));
  out.AppendFrame(Bytes(""));
  out.AppendFrame(Bytes("third"));
  EXPECT_EQ(out.queued(), kFrameHello.size() + 3 * kFrameHeaderBytes + 10);
  ASSERT_TRUE(out.FlushTo(pair[0].get(), "peer").ok());
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(out.queued(), 0u);

  std::vector<uint8_t> expected(kFrameHello.begin(), kFrameHello.end());
  for (const char* f : {"first", "", "third"}) AppendFrame(&expected, Bytes(f));
  EXPECT_EQ(ReadEverything(pair[1].get()), std::string(expected.begin(), expected.end()));
}

TEST(FrameStream, OutgoingBytesKeepWhatTheSocketDoesNotTakeForTheNextFlush) {
  auto pair = NonBlockingPair();
  const int small = 4096;
  setsockopt(pair[0].get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  OutgoingBytes out;
  const std::vector<uint8_t> frame(4 << 20, 7);
  out.AppendFrame(frame);
  ASSERT_TRUE(out.FlushTo(pair[0].get(), "peer").ok());  // EAGAIN is not an error
  const size_t left = out.queued();
  EXPECT_GT(left, 0u);
  EXPECT_LT(left, frame.size() + kFrameHeaderBytes);
  EXPECT_FALSE(out.empty());

  std::string got;
  while (!out.empty()) {
    got += ReadEverything(pair[1].get());
    ASSERT_TRUE(out.FlushTo(pair[0].get(), "peer").ok());
  }
  got += ReadEverything(pair[1].get());
  std::vector<uint8_t> expected;
  AppendFrame(&expected, frame);
  EXPECT_EQ(got.size(), expected.size());
  EXPECT_TRUE(got == std::string(expected.begin(), expected.end()));
}

TEST(FrameStream, OutgoingBytesToAClosedPeerFailWithTheReasonAndKeepTheBytes) {
  auto pair = NonBlockingPair();
  pair[1] = UniqueFd();  // the peer is gone: send() fails with EPIPE (and raises no SIGPIPE)
  OutgoingBytes out;
  out.AppendFrame(Bytes("lost"));
  Status sent = out.FlushTo(pair[0].get(), "tcp://10.0.0.1:7000");
  ASSERT_FALSE(sent.ok());
  EXPECT_EQ(sent.code(), ErrorCode::kInternal);
  EXPECT_EQ(sent.message(), "sending to tcp://10.0.0.1:7000 failed: " + ErrnoText(EPIPE));
  EXPECT_EQ(out.queued(), kFrameHeaderBytes + 4);
  out.Clear();
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(out.queued(), 0u);
}

}  // namespace
}  // namespace kvagent

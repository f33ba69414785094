// The framed RPC transport's wire (common/frame_stream.h): frames cut anywhere by the stream,
// the hello, and the limit that bounds what a connection holds.
#include "kvagent/common/frame_stream.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace kvagent

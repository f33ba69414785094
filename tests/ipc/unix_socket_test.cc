// Length-prefixed handshake messages (ReceiveMessage) and what each failure answers.
#include "kvagent/ipc/unix_socket.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kvagent::ipc {
namespace {

constexpr std::chrono::milliseconds kTimeout{10000};

struct SocketPair {
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = UniqueFd(fds[0]);
    b = UniqueFd(fds[1]);
  }
  UniqueFd a, b;
};

std::array<uint8_t, 4> LengthPrefix(uint32_t n) {
  return {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n >> 16),
          static_cast<uint8_t>(n >> 24)};
}

TEST(ReceiveMessage, ReturnsOneMessage) {
  SocketPair p;
  const std::vector<uint8_t> sent = {1, 2, 3};
  ASSERT_TRUE(SendMessage(p.a.get(), sent, kTimeout).ok());
  auto got = ReceiveMessage(p.b.get(), kTimeout);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, sent);
}

// A peer that announces more than the limit is not an agent this SDK can talk to: the caller
// gets AGENT_UNAVAILABLE saying so (not INVALID_PARAMS: the caller's arguments were fine).
TEST(ReceiveMessage, AnOversizedMessageIsAgentUnavailableNamingItsSize) {
  SocketPair p;
  const uint32_t announced = static_cast<uint32_t>(kMaxHandshakeMessage) + 1;
  const auto prefix = LengthPrefix(announced);
  ASSERT_EQ(::write(p.a.get(), prefix.data(), prefix.size()), 4);
  auto got = ReceiveMessage(p.b.get(), kTimeout);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), ErrorCode::kAgentUnavailable);
  EXPECT_NE(got.status().message().find(std::to_string(announced)), std::string::npos)
      << got.status().message();
}

TEST(ReceiveMessage, EndOfFileIsAgentUnavailable) {
  SocketPair p;
  p.a.Reset();
  auto got = ReceiveMessage(p.b.get(), kTimeout);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), ErrorCode::kAgentUnavailable);
}

TEST(ReceiveMessage, SilenceIsTimeout) {
  SocketPair p;
  auto got = ReceiveMessage(p.b.get(), std::chrono::milliseconds(1));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), ErrorCode::kTimeout);
}

}  // namespace
}  // namespace kvagent::ipc

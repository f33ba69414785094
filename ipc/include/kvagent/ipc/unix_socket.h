// Unix-domain stream sockets for the handshake: listening, connecting, peer credentials and
// length-prefixed messages (a 4-byte little-endian length, then that many bytes).
//
// The connection stays open for the client's whole life and carries nothing after the
// handshake: end-of-file on it is how each side learns that the other is gone.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvagent/common/status.h"

namespace kvagent::ipc {

// Owns a file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release();  // gives up ownership and returns the fd
  void Reset();   // closes now

 private:
  int fd_ = -1;
};

// Largest handshake message either side accepts.
inline constexpr size_t kMaxHandshakeMessage = 64 * 1024;

// Binds and listens on `path` (non-blocking, close-on-exec, mode 0666: who may attach is decided
// by peer credentials, not file permissions). A leftover socket file nobody listens on is
// replaced; a live one is an error ("another agent serves ...").
[[nodiscard]] Result<UniqueFd> ListenUnix(const std::string& path);

// Connects to `path` (blocking, close-on-exec). AGENT_UNAVAILABLE when nobody listens there.
[[nodiscard]] Result<UniqueFd> ConnectUnix(const std::string& path);

// Accepts one pending connection (non-blocking, close-on-exec); an invalid UniqueFd when none is
// pending.
UniqueFd AcceptUnix(int listen_fd);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The credentials of the process at the other end of a connected unix socket (SO_PEERCRED).
[[nodiscard]] Result<PeerCredentials> GetPeerCredentials(int fd);

// Writes one length-prefixed message, waiting at most `timeout` for buffer space. With
// `pass_fd` >= 0 the descriptor travels with the message's first bytes (SCM_RIGHTS); the
// caller keeps its own copy.
[[nodiscard]] Status SendMessage(int fd, std::span<const uint8_t> message,
                                 std::chrono::milliseconds timeout, int pass_fd = -1);

// Reads one length-prefixed message, waiting at most `timeout`. AGENT_UNAVAILABLE on EOF,
// TIMEOUT on timeout, INVALID_PARAMS when the peer announces more than kMaxHandshakeMessage.
// With `received_fd`, a descriptor the peer passed with the message (SCM_RIGHTS) lands there
// (close-on-exec); without it, passed descriptors are discarded by the kernel.
[[nodiscard]] Result<std::vector<uint8_t>> ReceiveMessage(int fd, std::chrono::milliseconds timeout,
                                                          UniqueFd* received_fd = nullptr);

// Incremental reader of length-prefixed messages for non-blocking sockets driven by epoll.
class MessageReader {
 public:
  enum class State { kNeedMore, kMessage, kEof, kError };

  // Reads what the socket has. kMessage: message() holds one complete message (call again to
  // continue); kNeedMore: wait for readability; kEof: the peer closed; kError: a read error or
  // an oversized message (the connection should be closed).
  State Read(int fd);
  const std::vector<uint8_t>& message() const { return message_; }
  // Bytes received that do not yet form a whole message.
  size_t pending_bytes() const { return buffer_.size(); }

  // Accept descriptors passed with the bytes (SCM_RIGHTS; at most one is kept, later ones are
  // closed). Off by default: then the kernel discards any a peer sends.
  void AcceptFds() { accept_fds_ = true; }
  // The last descriptor received (invalid when none).
  UniqueFd TakeFd() { return std::move(fd_); }

 private:
  ssize_t Receive(int fd, uint8_t* data, size_t size);

  std::vector<uint8_t> buffer_;
  std::vector<uint8_t> message_;
  bool accept_fds_ = false;
  UniqueFd fd_;
};

}  // namespace kvagent::ipc

#include "kvagent/ipc/unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kvagent/common/errno_text.h"

namespace kvagent::ipc {

namespace {

Result<sockaddr_un> Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return InvalidParams("socket path " + path + " is longer than " +
                         std::to_string(sizeof(addr.sun_path) - 1) +
                         " bytes; use a shorter --run-dir");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

// Waits until `fd` is ready for `events`; false on timeout.
bool PollFor(int fd, short events, std::chrono::milliseconds timeout) {
  pollfd p{fd, events, 0};
  while (true) {
    int rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
    if (rc < 0 && errno == EINTR) continue;
    return rc > 0;
  }
}

}  // namespace

Result<UniqueFd> ConnectUnix(const std::string& path) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Internal(WithErrno("socket"));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return Status(ErrorCode::kAgentUnavailable,
                  "no agent listens on " + path + " (" + ErrnoText(errno) +
                      "); start it with `kvagent --run-dir <dir>` or fix ClientOptions.run_dir");
  }
  return fd;
}

Result<UniqueFd> ListenUnix(const std::string& path) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  if (::access(path.c_str(), F_OK) == 0) {
    if (ConnectUnix(path).ok()) {
      return InvalidParams("another agent already serves " + path +
                           "; stop it or give this one another --run-dir");
    }
    ::unlink(path.c_str());  // left by an agent that died without cleaning up
  }
  // Bind and listen under a temporary name, then rename into place: the socket file appears
  // only once it accepts connections, so a client racing the agent's start never sees a file
  // that refuses it.
  const std::string staging = path + ".tmp." + std::to_string(::getpid());
  auto staging_addr = Address(staging);
  if (!staging_addr.ok()) return staging_addr.status();
  ::unlink(staging.c_str());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Internal(WithErrno("socket"));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*staging_addr), sizeof(*staging_addr)) !=
      0) {
    return Internal(WithErrno("bind " + staging));
  }
  ::chmod(staging.c_str(), 0666);
  if (::listen(fd.get(), SOMAXCONN) != 0 || ::rename(staging.c_str(), path.c_str()) != 0) {
    const std::string error = WithErrno("listen on " + path);
    ::unlink(staging.c_str());
    return Internal(error);
  }
  return fd;
}

UniqueFd AcceptUnix(int listen_fd) {
  return UniqueFd(::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
}

Result<PeerCredentials> GetPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Internal(WithErrno("getsockopt(SO_PEERCRED)"));
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

namespace {

// send(), with `pass_fd` attached as SCM_RIGHTS when it is >= 0.
ssize_t SendWithFd(int fd, const uint8_t* data, size_t size, int pass_fd) {
  if (pass_fd < 0) return ::send(fd, data, size, MSG_NOSIGNAL);
  iovec iov{const_cast<uint8_t*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  return ::sendmsg(fd, &msg, MSG_NOSIGNAL);
}

}  // namespace

Status SendMessage(int fd, std::span<const uint8_t> message, std::chrono::milliseconds timeout,
                   int pass_fd) {
  if (message.size() > kMaxHandshakeMessage) return Internal("handshake message too large");
  std::vector<uint8_t> frame(4 + message.size());
  const uint32_t n = static_cast<uint32_t>(message.size());
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(frame.data() + 4, message.data(), message.size());
  size_t sent = 0;
  while (sent < frame.size()) {
    // The descriptor goes with the first bytes that leave; once any did, it went with them.
    ssize_t rc = SendWithFd(fd, frame.data() + sent, frame.size() - sent, sent == 0 ? pass_fd : -1);
    if (rc > 0) {
      sent += static_cast<size_t>(rc);
    } else if (rc < 0 && errno == EINTR) {
      continue;
    } else if (rc < 0 && errno == EAGAIN) {
      if (!PollFor(fd, POLLOUT, timeout)) return Status(ErrorCode::kTimeout, "send timed out");
    } else {
      return Status(ErrorCode::kAgentUnavailable, WithErrno("the peer closed the connection"));
    }
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> ReceiveMessage(int fd, std::chrono::milliseconds timeout,
                                            UniqueFd* received_fd) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  MessageReader reader;
  if (received_fd != nullptr) reader.AcceptFds();
  while (true) {
    switch (reader.Read(fd)) {
      case MessageReader::State::kMessage:
        if (received_fd != nullptr) *received_fd = reader.TakeFd();
        return reader.message();
      case MessageReader::State::kEof:
        return Status(ErrorCode::kAgentUnavailable,
                      "the agent closed the connection during the handshake; see its log");
      case MessageReader::State::kError:
        if (reader.oversized() != 0) {
          return Status(ErrorCode::kAgentUnavailable,
                        "the agent's handshake message announces " +
                            std::to_string(reader.oversized()) + " bytes, above the limit of " +
                            std::to_string(kMaxHandshakeMessage) +
                            "; it is not a kvagent this SDK can talk to (check the run dir and "
                            "that agent and SDK are of the same release)");
        }
        return Status(ErrorCode::kAgentUnavailable,
                      "reading the agent's handshake failed (a read error, or more bytes than a "
                      "handshake holds); check the agent's log and retry");
      case MessageReader::State::kNeedMore:
        break;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !PollFor(fd, POLLIN, left)) {
      return Status(ErrorCode::kTimeout, "the agent did not answer the handshake in " +
                                             std::to_string(timeout.count()) +
                                             " ms; is it overloaded or stuck?");
    }
  }
}

MessageReader::State MessageReader::Read(int fd) {
  while (true) {
    // A complete message already buffered?
    if (buffer_.size() >= 4) {
      uint32_t n = 0;
      for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(buffer_[i]) << (8 * i);
      if (n > kMaxHandshakeMessage) {
        oversized_ = n;
        return State::kError;
      }
      if (buffer_.size() >= 4 + n) {
        message_.assign(buffer_.begin() + 4, buffer_.begin() + 4 + n);
        buffer_.erase(buffer_.begin(), buffer_.begin() + 4 + n);
        return State::kMessage;
      }
    }
    uint8_t chunk[4096];
    ssize_t rc = Receive(fd, chunk, sizeof(chunk));
    if (rc > 0) {
      buffer_.insert(buffer_.end(), chunk, chunk + rc);
      if (buffer_.size() > kMaxHandshakeMessage + 4) return State::kError;
    } else if (rc == 0) {
      return State::kEof;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return State::kNeedMore;
    } else {
      return State::kError;
    }
  }
}

ssize_t MessageReader::Receive(int fd, uint8_t* data, size_t size) {
  if (!accept_fds_) return ::recv(fd, data, size, MSG_DONTWAIT);
  iovec iov{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t rc = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (rc < 0) return rc;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fd_ = UniqueFd(received);  // keeps the last one; any earlier one is closed
    }
  }
  return rc;
}

}  // namespace kvagent::ipc

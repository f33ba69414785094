#include "socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kvagent/common/host_port.h"

namespace kvagent::transfer {
namespace {

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

Result<SocketAddress> NumericAddress(const std::string& host, uint16_t port) {
  SocketAddress address;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address.storage);
  if (host.empty() || inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    if (host.empty()) v4->sin_addr.s_addr = htonl(INADDR_ANY);
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    address.length = sizeof(sockaddr_in);
    return address;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address.storage);
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    address.length = sizeof(sockaddr_in6);
    return address;
  }
  return InvalidParams("'" + host + "' is not a numeric IPv4 or IPv6 address");
}

std::string HostOf(const SocketAddress& address) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (address.family() == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address.storage);
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
  } else if (address.family() == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address.storage);
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
  }
  return host;
}

uint16_t PortOf(const SocketAddress& address) {
  if (address.family() == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&address.storage)->sin_port);
  }
  if (address.family() == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&address.storage)->sin6_port);
  }
  return 0;
}

std::string FormatAddress(const SocketAddress& address) {
  return SocketAddressText(address.storage);
}

Result<UniqueFd> ListenTcp(const SocketAddress& address) {
  UniqueFd fd(socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Internal("socket() for the data server failed: " + ErrnoText(errno));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd.get(), address.get(), address.length) != 0) {
    return Internal("cannot bind the data server to " + FormatAddress(address) + ": " +
                    ErrnoText(errno) + "; pick a free --data-listen address");
  }
  if (listen(fd.get(), SOMAXCONN) != 0) {
    return Internal("cannot listen on " + FormatAddress(address) + ": " + ErrnoText(errno));
  }
  return fd;
}

Result<UniqueFd> StartConnect(const SocketAddress& address) {
  UniqueFd fd(socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return Status(ErrorCode::kTransferFailed, "socket() failed: " + ErrnoText(errno));
  }
  SetNoDelay(fd.get());
  if (connect(fd.get(), address.get(), address.length) != 0 && errno != EINPROGRESS) {
    return Status(ErrorCode::kTransferFailed, "connect failed: " + ErrnoText(errno));
  }
  return fd;
}

Status ConnectResult(int fd) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err == 0) return Status::Ok();
  return Status(ErrorCode::kTransferFailed, "connect failed: " + ErrnoText(err));
}

Result<SocketAddress> LocalAddress(int fd) {
  SocketAddress address;
  address.length = sizeof(address.storage);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address.storage), &address.length) != 0) {
    return Internal("getsockname failed: " + ErrnoText(errno));
  }
  return address;
}

UniqueFd AcceptConnection(int listen_fd, SocketAddress* peer) {
  peer->length = sizeof(peer->storage);
  UniqueFd fd(accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer->storage), &peer->length,
                      SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (fd.valid()) SetNoDelay(fd.get());
  return fd;
}

namespace {
IoResult Outcome(ssize_t n, bool eof_possible) {
  if (n > 0) return {IoResult::kData, static_cast<size_t>(n), 0};
  if (n == 0 && eof_possible) return {IoResult::kEof, 0, 0};
  if (n == 0 || errno == EINTR) return {IoResult::kData, 0, 0};
  if (errno == EAGAIN || errno == EWOULDBLOCK) return {IoResult::kBlocked, 0, 0};
  return {IoResult::kError, 0, errno};
}
}  // namespace

IoResult ReceiveSome(int fd, void* dst, size_t length) {
  return Outcome(recv(fd, dst, length, 0), length > 0);
}

IoResult SendSome(int fd, const iovec* iov, int count) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(count);
  return Outcome(sendmsg(fd, &msg, MSG_NOSIGNAL), false);
}

std::string FirstNonLoopbackIpv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* it = list; it != nullptr && found.empty(); it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if ((it->ifa_flags & IFF_UP) == 0 || (it->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char host[INET_ADDRSTRLEN];
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(it->ifa_addr);
    if (inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host)) != nullptr) found = host;
  }
  freeifaddrs(list);
  return found;
}

}  // namespace kvagent::transfer

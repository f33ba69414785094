// Small socket layer for the data plane (the `anet` of this library): an owning fd and the few
// socket calls the TCP transport makes, each returning Status with the address and errno.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <string>
#include <utility>

#include "kvagent/common/errno_text.h"
#include "kvagent/common/status.h"
#include "kvagent/common/unique_fd.h"

namespace kvagent::transfer {

// A socket address with its length.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
};

// Numeric host ("10.0.0.2", "::1", "" for 0.0.0.0) and port -> address. INVALID_PARAMS when the
// host is not numeric.
[[nodiscard]] Result<SocketAddress> NumericAddress(const std::string& host, uint16_t port);

// "10.0.0.2:7100" / "[::1]:7100" for logs.
std::string FormatAddress(const SocketAddress& address);
// The numeric host ("10.0.0.2", "::1") and the port of an address.
std::string HostOf(const SocketAddress& address);
uint16_t PortOf(const SocketAddress& address);

// A non-blocking, close-on-exec listening TCP socket bound to `address` (SO_REUSEADDR).
// INTERNAL naming the address and errno when bind or listen fails.
[[nodiscard]] Result<UniqueFd> ListenTcp(const SocketAddress& address);

// Starts a non-blocking connect (TCP_NODELAY set). The connect may still be in progress: wait
// for writability and call ConnectResult. INTERNAL/TRANSFER_FAILED with errno when it fails now.
[[nodiscard]] Result<UniqueFd> StartConnect(const SocketAddress& address);
// After writability: OK when the connect completed, else the error that ended it.
[[nodiscard]] Status ConnectResult(int fd);

// The locally bound address of a socket (resolves port 0).
[[nodiscard]] Result<SocketAddress> LocalAddress(int fd);

// Accepts one pending connection as a non-blocking, close-on-exec socket with TCP_NODELAY.
// Returns an invalid UniqueFd when none is pending (EAGAIN) or the peer already left.
UniqueFd AcceptConnection(int listen_fd, SocketAddress* peer);

// One step of a connection's state machine: it moved bytes (or may try again at once), it
// would block, or the connection was closed and must not be touched again.
enum class Step { kProgress, kBlocked, kClosed };

// The outcome of one non-blocking recv or sendmsg (MSG_NOSIGNAL). EINTR is reported as kData
// with 0 bytes: try again.
struct IoResult {
  enum Kind { kData, kBlocked, kEof, kError } kind;
  size_t bytes = 0;
  int error = 0;  // errno for kError
};
IoResult ReceiveSome(int fd, void* dst, size_t length);
IoResult SendSome(int fd, const iovec* iov, int count);

// The first non-loopback IPv4 address of an interface that is up, or "" when there is none.
std::string FirstNonLoopbackIpv4();

}  // namespace kvagent::transfer

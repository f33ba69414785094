#include "kvagent/common/tcp_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <memory>

#include "kvagent/common/errno_text.h"
#include "kvagent/common/host_port.h"

namespace kvagent {
namespace {

// tcp://HOST:PORT as ZMQ reads it, port 0 for a listener.
Result<HostPort> Parse(const std::string& endpoint) {
  return ParseHostPort(endpoint, "endpoint", TcpEndpointRules(/*listener=*/true));
}

Result<ResolvedAddresses> Resolve(const std::string& endpoint, const HostPort& hp, bool passive) {
  auto found = ResolveHostPort(hp, passive);
  if (!found.ok()) return InvalidParams(endpoint + ": " + found.status().message());
  return found;
}

void NoDelay(int fd) {
  const int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

}  // namespace

Result<UniqueFd> ListenTcp(const std::string& endpoint, std::string* bound) {
  auto hp = Parse(endpoint);
  if (!hp.ok()) return hp.status();
  auto addresses = Resolve(endpoint, *hp, /*passive=*/true);
  if (!addresses.ok()) return addresses.status();
  const addrinfo* a = addresses->get();
  auto cannot = [&](int err) {
    return Status(ErrorCode::kInternal, "cannot listen on " + endpoint + ": " + ErrnoText(err));
  };
  UniqueFd fd(socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return cannot(errno);
  const int on = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || listen(fd.get(), 128) != 0) {
    return cannot(errno);
  }
  sockaddr_storage got{};
  socklen_t len = sizeof(got);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&got), &len);
  *bound = "tcp://" + SocketAddressText(got);
  return fd;
}

Result<UniqueFd> ConnectTcp(const std::string& endpoint) {
  auto hp = Parse(endpoint);
  if (!hp.ok()) return hp.status();
  if (hp->host.empty() || hp->port == 0) {
    return InvalidParams("cannot connect to " + endpoint + ": name a host and a port");
  }
  auto addresses = Resolve(endpoint, *hp, /*passive=*/false);
  if (!addresses.ok()) return addresses.status();
  const addrinfo* a = addresses->get();
  UniqueFd fd(socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return Status(ErrorCode::kInternal, "cannot connect to " + endpoint + ": " + ErrnoText(errno));
  }
  NoDelay(fd.get());
  if (connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
    return Status(ErrorCode::kInternal, "cannot connect to " + endpoint + ": " + ErrnoText(errno));
  }
  return fd;
}

UniqueFd AcceptTcp(int listener) {
  UniqueFd fd(accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (fd.valid()) NoDelay(fd.get());
  return fd;
}

std::string PeerAddressOf(int fd) {
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return "";
  return SocketAddressText(peer);
}

}  // namespace kvagent

#include "kvagent/common/tcp_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <memory>

#include "kvagent/common/errno_text.h"

namespace kvagent {
namespace {

struct HostPort {
  std::string host;  // without brackets; empty: every interface
  int port = 0;
};

Result<HostPort> Parse(const std::string& endpoint) {
  auto bad = [&] {
    return InvalidParams("endpoint '" + endpoint +
                         "' is not tcp://HOST:PORT (HOST: an address, [IPv6], a name or *)");
  };
  constexpr std::string_view kScheme = "tcp://";
  if (endpoint.compare(0, kScheme.size(), kScheme) != 0) return bad();
  const std::string rest = endpoint.substr(kScheme.size());
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad();
  HostPort out;
  out.host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), out.port);
  if (ec != std::errc() || end != port.data() + port.size() || out.port < 0 || out.port > 65535) {
    return bad();
  }
  if (out.host.front() == '[') {
    if (out.host.size() < 3 || out.host.back() != ']') return bad();
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  if (out.host == "*") out.host.clear();
  return out;
}

using Addresses = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

Result<Addresses> Resolve(const std::string& endpoint, const HostPort& hp, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(),
                              std::to_string(hp.port).c_str(), &hints, &found);
  if (gai != 0) {
    return Status(ErrorCode::kInvalidParams,
                  "cannot resolve " + endpoint + ": " + gai_strerror(gai));
  }
  return Addresses(found, &freeaddrinfo);
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
  char text[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (got.ss_family == AF_INET6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(&got);
    inet_ntop(AF_INET6, &s6->sin6_addr, text, sizeof(text));
    port = ntohs(s6->sin6_port);
    *bound = "tcp://[" + std::string(text) + "]:" + std::to_string(port);
  } else {
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(&got);
    inet_ntop(AF_INET, &s4->sin_addr, text, sizeof(text));
    port = ntohs(s4->sin_port);
    *bound = "tcp://" + std::string(text) + ":" + std::to_string(port);
  }
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

}  // namespace kvagent

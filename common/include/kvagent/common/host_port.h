// HOST:PORT, the one way an address given as text is read: the framed master transport's
// tcp://HOST:PORT (tcp_socket.h), --metrics-listen (metrics_http.h) and the data plane's
// endpoints and listen addresses (kvagent/transfer/endpoint.h).
//
//   10.0.0.2:7100          an IPv4 address
//   [fd00::2]:7100         an IPv6 address, in brackets
//   node-7:7100            a name (resolved by ResolveHostPort, when the caller takes names)
//   *:7100                 every interface (HostPortRules::star_is_every_interface)
//   tcp://10.0.0.2:7100    with a scheme (HostPortRules::scheme)
//
// Each caller says in HostPortRules which of the optional forms it takes; everything else is the
// same for all: the port is decimal digits only (no sign, no space), at most 65535; nothing may
// follow it; a host has only the characters of an address or a name.
#pragma once

#include <netdb.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kvagent/common/status.h"

namespace kvagent {

// The optional forms a caller takes. The defaults take the strictest form, HOST:PORT with a
// port from 1 to 65535 and a host that is not empty.
struct HostPortRules {
  // When not empty, the text must start with it (e.g. "tcp://"); when empty, a text with a
  // scheme ("...://") is refused.
  std::string_view scheme;
  // "*" as the host means every interface (HostPort::host is then "").
  bool star_is_every_interface = false;
  // ":PORT" and "[]:PORT" mean every interface (HostPort::host is then "").
  bool empty_host = false;
  // Port 0 (a listener's "let the OS pick") is taken.
  bool port_zero = false;
  // An IPv6 host may also be written without brackets: the port is then after the last colon
  // ("::1:7100" is ::1, port 7100), as ZMQ reads tcp:// endpoints.
  bool unbracketed_ipv6 = false;
};

// tcp://HOST:PORT as ZMQ reads it, the form of kvmaster's endpoints: HOST also * (every
// interface) or an IPv6 address without brackets; port 0 only for a `listener` (the OS picks).
HostPortRules TcpEndpointRules(bool listener);

struct HostPort {
  std::string host;  // without brackets; "" for every interface (only where the rules allow it)
  uint16_t port = 0;
};

// Reads `text` as [SCHEME]HOST:PORT under `rules`. On INVALID_PARAMS the message is
// "<what> '<text>' is not <form>: <the defect>", e.g. "endpoint 'tcp://10.0.0.1' is not
// tcp://HOST:PORT: it has no port", where <form> is the scheme (if any) and HOST:PORT; `what`
// names the input for the user (a flag, "endpoint", ...). Checks the form only: whether the host
// is a number or a name, and whether it resolves, is the caller's to check. Thread-safe.
[[nodiscard]] Result<HostPort> ParseHostPort(std::string_view text, std::string_view what,
                                             const HostPortRules& rules);

// "HOST:PORT", with an IPv6 host (one with a colon) in brackets: "[fd00::2]:7100".
std::string JoinHostPort(std::string_view host, uint16_t port);
// The numeric HOST:PORT of an IPv4 or IPv6 socket address, as JoinHostPort writes it (for logs
// and peer names); "" for another family.
std::string SocketAddressText(const sockaddr_storage& address);

// What getaddrinfo found; freed with the pointer.
using ResolvedAddresses = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

// The stream-socket addresses of `address` (getaddrinfo; may block on a name lookup). With
// `passive`, an empty host is every interface (for bind); otherwise an empty host is the
// loopback. INVALID_PARAMS "cannot resolve '<host>': <reason>" when nothing is found. Thread-safe.
[[nodiscard]] Result<ResolvedAddresses> ResolveHostPort(const HostPort& address, bool passive);

}  // namespace kvagent

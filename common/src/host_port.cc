#include "kvagent/common/host_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>

namespace kvagent {
namespace {

// The text split into its parts, before the parts are checked.
struct HostPortParts {
  std::string_view host;
  std::string_view port;
  bool bracketed = false;
};

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '-' || c == '_';
}

// Characters of an IPv6 address, with an optional zone ("fe80::1%eth0").
bool IsIpv6Char(char c) { return IsNameChar(c) || c == ':' || c == '%'; }

// Splits "[HOST]:PORT" or "HOST:PORT"; the empty string when it worked, else the defect.
std::string SplitParts(std::string_view text, const HostPortRules& rules, HostPortParts* parts) {
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return "'[' has no closing ']'";
    if (close + 1 == text.size()) return "it has no port";
    if (text[close + 1] != ':') {
      return "'" + std::string(text.substr(close + 1)) + "' follows ']'; write [ADDR]:PORT";
    }
    parts->host = text.substr(1, close - 1);
    parts->port = text.substr(close + 2);
    parts->bracketed = true;
    return "";
  }
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return "it has no port";
  parts->host = text.substr(0, colon);
  parts->port = text.substr(colon + 1);
  if (!rules.unbracketed_ipv6 && parts->host.find(':') != std::string_view::npos) {
    return "an IPv6 host goes in brackets: [ADDR]:PORT";
  }
  return "";
}

std::string CheckHost(const HostPortParts& parts, const HostPortRules& rules) {
  if (parts.host.empty()) {
    return rules.empty_host ? "" : "the host is empty";
  }
  if (parts.host == "*" && !parts.bracketed) {
    return rules.star_is_every_interface
               ? ""
               : "'*' (every interface) is not taken here; write 0.0.0.0 or [::]";
  }
  const bool ipv6 = parts.bracketed || parts.host.find(':') != std::string_view::npos;
  const auto bad =
      std::find_if_not(parts.host.begin(), parts.host.end(), ipv6 ? IsIpv6Char : IsNameChar);
  if (bad == parts.host.end()) return "";
  return "the host '" + std::string(parts.host) + "' has '" + std::string(1, *bad) +
         "', which is in no address or name";
}

// The port as a number; the empty string when it is one the rules take, else the defect.
std::string CheckPort(std::string_view port, const HostPortRules& rules, uint16_t* out) {
  if (port.empty()) return "it has no port";
  const uint32_t lowest = rules.port_zero ? 0 : 1;
  const std::string range = "a port is a number from " + std::to_string(lowest) + " to 65535";
  uint32_t value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return "port '" + std::string(port) + "' is not a number; " + range;
    value = value * 10 + static_cast<uint32_t>(c - '0');
    if (value > 65535) return "port '" + std::string(port) + "' is too large; " + range;
  }
  if (value < lowest) return "port 0 is not taken here; " + range;
  *out = static_cast<uint16_t>(value);
  return "";
}

}  // namespace

Result<HostPort> ParseHostPort(std::string_view text, std::string_view what,
                               const HostPortRules& rules) {
  auto refuse = [&](const std::string& defect) {
    return InvalidParams(std::string(what) + " '" + std::string(text) + "' is not " +
                         std::string(rules.scheme) + "HOST:PORT: " + defect);
  };
  std::string_view rest = text;
  if (!rules.scheme.empty()) {
    if (!rest.starts_with(rules.scheme)) {
      return refuse("it does not start with " + std::string(rules.scheme));
    }
    rest.remove_prefix(rules.scheme.size());
  } else if (rest.find("://") != std::string_view::npos) {
    return refuse("it has a scheme; write HOST:PORT without one");
  }
  HostPortParts parts;
  std::string defect = SplitParts(rest, rules, &parts);
  if (defect.empty()) defect = CheckHost(parts, rules);
  HostPort out;
  if (defect.empty()) defect = CheckPort(parts.port, rules, &out.port);
  if (!defect.empty()) return refuse(defect);
  if (parts.host != "*" || parts.bracketed) out.host = std::string(parts.host);
  return out;
}

HostPortRules TcpEndpointRules(bool listener) {
  HostPortRules rules;
  rules.scheme = "tcp://";
  rules.star_is_every_interface = true;
  rules.port_zero = listener;
  rules.unbracketed_ipv6 = true;
  return rules;
}

std::string JoinHostPort(std::string_view host, uint16_t port) {
  const std::string port_text = ":" + std::to_string(port);
  if (host.find(':') != std::string_view::npos) return "[" + std::string(host) + "]" + port_text;
  return std::string(host) + port_text;
}

std::string SocketAddressText(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &s6->sin6_addr, text, sizeof(text));
    return JoinHostPort(text, ntohs(s6->sin6_port));
  }
  if (address.ss_family == AF_INET) {
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &s4->sin_addr, text, sizeof(text));
    return JoinHostPort(text, ntohs(s4->sin_port));
  }
  return "";
}

Result<ResolvedAddresses> ResolveHostPort(const HostPort& address, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(address.host.empty() ? nullptr : address.host.c_str(),
                              std::to_string(address.port).c_str(), &hints, &found);
  if (gai != 0) {
    return InvalidParams("cannot resolve '" + address.host + "': " + gai_strerror(gai));
  }
  return ResolvedAddresses(found, &freeaddrinfo);
}

}  // namespace kvagent

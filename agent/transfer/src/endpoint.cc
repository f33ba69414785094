#include "kvagent/transfer/endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <charconv>

namespace kvagent::transfer {
namespace {

// Canonical numeric form of `host` (inet_ntop of inet_pton), or "" when it is not a numeric
// IPv4/IPv6 address.
std::string CanonicalHost(std::string_view host) {
  const std::string text(host);
  char out[INET6_ADDRSTRLEN];
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return inet_ntop(AF_INET, &v4, out, sizeof(out)) != nullptr ? out : "";
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    return inet_ntop(AF_INET6, &v6, out, sizeof(out)) != nullptr ? out : "";
  }
  return "";
}

// Splits "host:port" / "[v6]:port" into its parts; `what` names the input in messages.
Status SplitHostPort(std::string_view text, std::string_view what, std::string* host,
                     uint32_t* port) {
  std::string_view host_part;
  std::string_view port_part;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidParams(std::string(what) + " '" + std::string(text) +
                           "': an IPv6 host is written [addr]:port");
    }
    host_part = text.substr(1, close - 1);
    port_part = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return InvalidParams(std::string(what) + " '" + std::string(text) +
                           "' has no port; write host:port");
    }
    host_part = text.substr(0, colon);
    port_part = text.substr(colon + 1);
    if (host_part.find(':') != std::string_view::npos) {
      return InvalidParams(std::string(what) + " '" + std::string(text) +
                           "': put an IPv6 host in brackets, [addr]:port");
    }
  }
  uint32_t value = 0;
  auto [end, ec] = std::from_chars(port_part.data(), port_part.data() + port_part.size(), value);
  if (port_part.empty() || ec != std::errc() || end != port_part.data() + port_part.size() ||
      value > 65535) {
    return InvalidParams(std::string(what) + " '" + std::string(text) + "' has port '" +
                         std::string(port_part) + "'; a port is a number from 0 to 65535");
  }
  *host = std::string(host_part);
  *port = value;
  return Status::Ok();
}

}  // namespace

std::string_view SchemeName(Scheme scheme) { return scheme == Scheme::kRdma ? "rdma" : "tcp"; }

std::string Endpoint::ToString() const {
  std::string out(SchemeName(scheme));
  out += "://";
  if (host.find(':') != std::string::npos) {
    out += "[" + host + "]";
  } else {
    out += host;
  }
  out += ":" + std::to_string(port);
  return out;
}

Result<Endpoint> ParseEndpoint(std::string_view text) {
  Endpoint endpoint;
  std::string_view rest;
  if (text.starts_with("tcp://")) {
    endpoint.scheme = Scheme::kTcp;
    rest = text.substr(6);
  } else if (text.starts_with("rdma://")) {
    endpoint.scheme = Scheme::kRdma;
    rest = text.substr(7);
  } else {
    return InvalidParams("endpoint '" + std::string(text) +
                         "' must start with tcp:// or rdma:// (as advertised by the peer agent)");
  }
  std::string host;
  uint32_t port = 0;
  KVAGENT_RETURN_IF_ERROR(SplitHostPort(rest, "endpoint", &host, &port));
  if (port == 0) {
    return InvalidParams("endpoint '" + std::string(text) +
                         "' has port 0; a peer's endpoint names the port it listens on");
  }
  endpoint.host = CanonicalHost(host);
  if (endpoint.host.empty()) {
    return InvalidParams("endpoint '" + std::string(text) + "' has host '" + host +
                         "'; endpoints carry numeric IPv4 or IPv6 addresses, not names");
  }
  endpoint.port = static_cast<uint16_t>(port);
  return endpoint;
}

Result<ListenAddress> ParseListenAddress(std::string_view text) {
  ListenAddress address;
  uint32_t port = 0;
  KVAGENT_RETURN_IF_ERROR(SplitHostPort(text, "listen address", &address.host, &port));
  if (!address.host.empty()) {
    std::string canonical = CanonicalHost(address.host);
    if (canonical.empty()) {
      return InvalidParams("listen address '" + std::string(text) +
                           "' must use a numeric host (0.0.0.0 for every interface)");
    }
    address.host = std::move(canonical);
  }
  address.port = static_cast<uint16_t>(port);
  return address;
}

bool IsWildcardHost(std::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::";
}

}  // namespace kvagent::transfer

#include "kvagent/transfer/endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "kvagent/common/host_port.h"

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

}  // namespace

std::string_view SchemeName(Scheme scheme) { return scheme == Scheme::kRdma ? "rdma" : "tcp"; }

std::string Endpoint::ToString() const {
  return std::string(SchemeName(scheme)) + "://" + JoinHostPort(host, port);
}

Result<Endpoint> ParseEndpoint(std::string_view text) {
  Endpoint endpoint;
  HostPortRules rules;
  rules.port_zero = true;  // refused below, with the reason
  if (text.starts_with("tcp://")) {
    endpoint.scheme = Scheme::kTcp;
    rules.scheme = "tcp://";
  } else if (text.starts_with("rdma://")) {
    endpoint.scheme = Scheme::kRdma;
    rules.scheme = "rdma://";
  } else {
    return InvalidParams("endpoint '" + std::string(text) +
                         "' must start with tcp:// or rdma:// (as advertised by the peer agent)");
  }
  Result<HostPort> parsed = ParseHostPort(text, "endpoint", rules);
  if (!parsed.ok()) return parsed.status();
  if (parsed->port == 0) {
    return InvalidParams("endpoint '" + std::string(text) +
                         "' has port 0; a peer's endpoint names the port it listens on");
  }
  endpoint.host = CanonicalHost(parsed->host);
  if (endpoint.host.empty()) {
    return InvalidParams("endpoint '" + std::string(text) + "' has host '" + parsed->host +
                         "'; endpoints carry numeric IPv4 or IPv6 addresses, not names");
  }
  endpoint.port = parsed->port;
  return endpoint;
}

Result<ListenAddress> ParseListenAddress(std::string_view text) {
  HostPortRules rules;
  rules.empty_host = true;  // every interface, as 0.0.0.0
  rules.port_zero = true;   // let the OS pick
  Result<HostPort> parsed = ParseHostPort(text, "listen address", rules);
  if (!parsed.ok()) return parsed.status();
  ListenAddress address;
  if (!parsed->host.empty()) {
    address.host = CanonicalHost(parsed->host);
    if (address.host.empty()) {
      return InvalidParams("listen address '" + std::string(text) +
                           "' must use a numeric host (0.0.0.0 for every interface)");
    }
  }
  address.port = parsed->port;
  return address;
}

bool IsWildcardHost(std::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::";
}

}  // namespace kvagent::transfer

// Data-plane endpoints: the strings an agent advertises to the master for its pool and that
// placements name when bytes must move to or from a peer's pool.
//
//   tcp://10.0.0.2:7100      TCP data server (always available)
//   rdma://10.0.0.2:7100     RDMA connection manager listener (RC QPs, one-sided WRITE/READ)
//   tcp://[fd00::2]:7100     IPv6 literals go in brackets
//
// Hosts are numeric addresses only: the master stores what agents advertise, and a name lookup
// on the data path would block the transfer thread. Names are resolved once, at engine start,
// for the advertised host.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvagent/common/status.h"

namespace kvagent::transfer {

enum class Scheme : uint8_t { kTcp, kRdma };
std::string_view SchemeName(Scheme scheme);  // "tcp", "rdma"

struct Endpoint {
  Scheme scheme = Scheme::kTcp;
  std::string host;  // numeric IPv4 ("10.0.0.2") or IPv6 ("fd00::2", without brackets)
  uint16_t port = 0;

  // The canonical string form, e.g. "tcp://10.0.0.2:7100" or "tcp://[fd00::2]:7100".
  std::string ToString() const;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

// Parses "tcp://host:port" or "rdma://host:port". INVALID_PARAMS naming the defect (unknown
// scheme, missing port, port 0 or > 65535, host that is not a numeric address, stray brackets).
[[nodiscard]] Result<Endpoint> ParseEndpoint(std::string_view text);

// Parses a listen address "host:port" (no scheme; port 0 = let the OS pick; host may be 0.0.0.0
// or [::]). INVALID_PARAMS naming the defect.
struct ListenAddress {
  std::string host;
  uint16_t port = 0;
};
[[nodiscard]] Result<ListenAddress> ParseListenAddress(std::string_view text);

// True for 0.0.0.0, ::, and "" (bind to every interface; not advertisable).
bool IsWildcardHost(std::string_view host);

}  // namespace kvagent::transfer

#include "kvagent/common/cluster_auth_flags.h"

#include <arpa/inet.h>

#include <string_view>

namespace kvagent {

bool IsLocalEndpoint(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return true;
  constexpr std::string_view kTcp = "tcp://";
  if (endpoint.rfind(kTcp, 0) != 0) return false;
  std::string_view rest = std::string_view(endpoint).substr(kTcp.size());
  // tcp://[source_address;]host:port: only the host matters (a connect may name a source).
  if (const size_t semicolon = rest.find(';'); semicolon != std::string_view::npos) {
    rest = rest.substr(semicolon + 1);
  }
  const size_t colon = rest.rfind(':');
  std::string host(rest.substr(0, colon == std::string_view::npos ? rest.size() : colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;  // "*", an interface name, a host name: reachable from elsewhere
}

void ClusterAuthFlags::Declare(FlagSet* flags) {
  flags->String("cluster-secret-file", &secret_file,
                "file holding the cluster secret (mode 0600; `kvctl secret generate FILE`); the "
                "network planes authenticate and encrypt with keys derived from it");
  flags->Bool("insecure-no-auth", &insecure_no_auth,
              "without a cluster secret, listen on / connect to addresses other hosts can "
              "reach anyway (only on a network where every host is trusted)");
}

Result<std::optional<ClusterSecret>> ClusterAuthFlags::Load() const {
  if (secret_file.empty()) return std::optional<ClusterSecret>();
  if (insecure_no_auth) {
    return InvalidParams(
        "--cluster-secret-file and --insecure-no-auth exclude each other; drop "
        "--insecure-no-auth");
  }
  Result<ClusterSecret> secret = ClusterSecret::LoadFromFile(secret_file);
  if (!secret.ok()) return secret.status();
  return std::optional<ClusterSecret>(std::move(*secret));
}

Status ClusterAuthFlags::CheckEndpoint(const std::string& endpoint, std::string_view flag,
                                       bool have_secret) const {
  if (have_secret || insecure_no_auth || endpoint.empty() || IsLocalEndpoint(endpoint)) {
    return Status::Ok();
  }
  return InvalidParams(std::string(flag) + " " + endpoint +
                       " is reachable from other hosts, and without a cluster secret anyone who "
                       "reaches it is trusted: give --cluster-secret-file FILE (create one with "
                       "`kvctl secret generate FILE` and copy it to every node), use a loopback "
                       "address, or pass --insecure-no-auth on a trusted network");
}

}  // namespace kvagent

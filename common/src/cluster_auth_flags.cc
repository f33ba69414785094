#include "kvagent/common/cluster_auth_flags.h"

#include "kvagent/common/curve_auth.h"

namespace kvagent {

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

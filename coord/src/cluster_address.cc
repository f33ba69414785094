#include "kvagent/coord/cluster_address.h"

#include "kvagent/coord/etcd_client.h"

namespace kvagent::coord {

namespace {
constexpr std::string_view kScheme = "etcd://";
}

std::string ClusterAddress::ToString() const {
  std::string out(kScheme);
  for (size_t i = 0; i < etcd_endpoints.size(); ++i) {
    if (i > 0) out += ",";
    out += etcd_endpoints[i];
  }
  return out + "/" + cluster;
}

bool IsClusterAddress(std::string_view text) { return text.rfind(kScheme, 0) == 0; }

Status CheckName(std::string_view name, std::string_view what) {
  bool ok = !name.empty() && name.size() <= 64;
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  }
  if (ok) return Status::Ok();
  return InvalidParams(std::string(what) + " \"" + std::string(name) +
                       "\" is not a name: use 1 to 64 letters, digits, '.', '_' or '-'");
}

Result<ClusterAddress> ParseClusterAddress(std::string_view text) {
  const std::string example =
      "; expected etcd://HOST:PORT[,HOST:PORT...]/CLUSTER, e.g. etcd://10.0.0.1:2379/prod";
  if (!IsClusterAddress(text)) {
    return InvalidParams("\"" + std::string(text) + "\" is not a cluster address" + example);
  }
  const std::string_view rest = text.substr(kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) {
    return InvalidParams("\"" + std::string(text) + "\" names no cluster" + example);
  }
  ClusterAddress out;
  if (Status st = ParseEtcdEndpoints(rest.substr(0, slash), &out.etcd_endpoints); !st.ok()) {
    return InvalidParams(st.message() + example);
  }
  out.cluster = std::string(rest.substr(slash + 1));
  if (Status st = CheckName(out.cluster, "the cluster name"); !st.ok()) {
    return InvalidParams(st.message() + example);
  }
  return out;
}

ClusterKeys::ClusterKeys(std::string_view cluster)
    : prefix_("/kvagent/" + std::string(cluster) + "/") {}

}  // namespace kvagent::coord

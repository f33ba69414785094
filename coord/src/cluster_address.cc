#include "kvagent/coord/cluster_address.h"

#include <algorithm>

#include "kvagent/common/flags.h"
#include "kvagent/common/private_file.h"
#include "kvagent/coord/etcd_client.h"

namespace kvagent::coord {

namespace {
constexpr std::string_view kScheme = "etcd://";
constexpr std::string_view kTlsScheme = "etcds://";
}  // namespace

std::string ClusterAddress::ToString() const {
  std::string out(tls.enabled ? kTlsScheme : kScheme);
  for (size_t i = 0; i < etcd_endpoints.size(); ++i) {
    if (i > 0) out += ",";
    out += etcd_endpoints[i];
  }
  return out + "/" + cluster;
}

bool IsClusterAddress(std::string_view text) {
  return text.rfind(kScheme, 0) == 0 || text.rfind(kTlsScheme, 0) == 0;
}

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
      "; expected etcd://HOST:PORT[,HOST:PORT...]/CLUSTER, e.g. etcd://10.0.0.1:2379/prod "
      "(etcds://... for etcd over TLS)";
  if (!IsClusterAddress(text)) {
    return InvalidParams("\"" + std::string(text) + "\" is not a cluster address" + example);
  }
  const bool tls = text.rfind(kTlsScheme, 0) == 0;
  const std::string_view rest = text.substr(tls ? kTlsScheme.size() : kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) {
    return InvalidParams("\"" + std::string(text) + "\" names no cluster" + example);
  }
  ClusterAddress out;
  out.tls.enabled = tls;
  if (Status st = ParseEtcdEndpoints(rest.substr(0, slash), &out.etcd_endpoints); !st.ok()) {
    return InvalidParams(st.message() + example);
  }
  out.cluster = std::string(rest.substr(slash + 1));
  if (Status st = CheckName(out.cluster, "the cluster name"); !st.ok()) {
    return InvalidParams(st.message() + example);
  }
  return out;
}

void EtcdAccessFlags::Declare(FlagSet* flags) {
  flags->String("etcd-ca-file", &ca_file,
                "etcd over TLS: the CA certificates (PEM) etcd's certificate is checked against "
                "(default: the system's)");
  flags->String("etcd-cert-file", &cert_file,
                "etcd over TLS: this process's client certificate (PEM), for an etcd that asks for "
                "one (--client-cert-auth); with --etcd-key-file");
  flags->String("etcd-key-file", &key_file,
                "etcd over TLS: the private key (PEM) of --etcd-cert-file");
  flags->String("etcd-user", &user,
                "etcd's user authentication: the etcd user to act as (needs etcd over TLS and "
                "--etcd-password-file)");
  flags->String("etcd-password-file", &password_file,
                "etcd's user authentication: a file (mode 0600) holding --etcd-user's password "
                "on its first line (read again at each authentication)");
}

Status EtcdAccessFlags::Apply(ClusterAddress* address) const {
  address->tls.ca_file = ca_file;
  address->tls.cert_file = cert_file;
  address->tls.key_file = key_file;
  KVAGENT_RETURN_IF_ERROR(CheckEtcdTls(address->tls));
  address->auth.user = user;
  WipeString(address->auth.password);
  address->auth.password_file = password_file;
  if (!password_file.empty()) {
    auto read = ReadEtcdPassword(password_file);
    if (!read.ok()) return read.status();
    address->auth.password = std::move(*read);
  }
  return CheckEtcdAuth(address->auth, address->tls);
}

ClusterKeys::ClusterKeys(std::string_view cluster)
    : prefix_("/kvagent/" + std::string(cluster) + "/") {}

}  // namespace kvagent::coord

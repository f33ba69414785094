// EtcdClient over the JSON gateway: each call is one POST (etcd_http.h); transactions compare
// a key's create revision, the way etcd's own election recipe does.
#include "kvagent/coord/etcd_client.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "etcd_http.h"
#include "kvagent/common/host_port.h"
#include "kvagent/common/private_file.h"

namespace kvagent::coord {
namespace {

Status BadAnswer(std::string_view call) {
  return Internal("etcd answered " + std::string(call) +
                  " with an unexpected document; check that the endpoint is etcd >= 3.4");
}

void SetRevision(const Json& answer, int64_t* revision) {
  if (revision == nullptr) return;
  const auto header = answer.find("header");
  *revision = header == answer.end() ? 0 : JsonInt(*header, "revision").value_or(0);
}

Json CompareCreateRevision(std::string_view key, int64_t revision) {
  return Json{{"key", Base64(key)},
              {"target", "CREATE"},
              {"result", "EQUAL"},
              {"create_revision", std::to_string(revision)}};
}

bool Succeeded(const Json& answer) {
  const auto it = answer.find("succeeded");
  return it != answer.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace

Status ParseEtcdEndpoints(std::string_view text, std::vector<std::string>* out, bool* https) {
  std::vector<std::string> endpoints;
  auto bad = [&](std::string_view what) {
    return InvalidParams("etcd endpoint \"" + std::string(what) +
                         "\" is not HOST:PORT; give etcd's client URLs, e.g. "
                         "127.0.0.1:2379,10.0.0.2:2379" +
                         (https != nullptr ? " (https://HOST:PORT,... for etcd over TLS)" : ""));
  };
  size_t start = 0;
  size_t secure = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view one = text.substr(start, comma - start);
    if (one.rfind("http://", 0) == 0) {
      one.remove_prefix(7);
    } else if (https != nullptr && one.rfind("https://", 0) == 0) {
      one.remove_prefix(8);
      ++secure;
    }
    while (!one.empty() && one.back() == '/') one.remove_suffix(1);
    // HOST:PORT with a port from 1 (also refuses https:// where the caller does not take it).
    if (!ParseHostPort(one, "etcd endpoint", HostPortRules{}).ok()) return bad(one);
    endpoints.emplace_back(one);
    start = comma + 1;
  }
  if (endpoints.empty()) return bad(text);
  if (secure != 0 && secure != endpoints.size()) {
    return InvalidParams("etcd endpoints \"" + std::string(text) +
                         "\" mix https:// with plain ones; a client speaks TLS to all of them "
                         "or to none");
  }
  if (https != nullptr) *https = secure != 0;
  if (out != nullptr) *out = std::move(endpoints);
  return Status::Ok();
}

namespace {

// OK when `path` (given with `flag`) names a regular file this process can read.
Status CheckReadableFile(const std::string& path, std::string_view flag) {
  const std::string what = std::string(flag) + " " + path + ": ";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return InvalidParams(what + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return InvalidParams(what + "not a regular file");
  if (::access(path.c_str(), R_OK) != 0) return InvalidParams(what + std::strerror(errno));
  return Status::Ok();
}

}  // namespace

Status CheckEtcdTls(const EtcdTls& tls) {
  const bool files = !tls.ca_file.empty() || !tls.cert_file.empty() || !tls.key_file.empty();
  if (files && !tls.enabled) {
    return InvalidParams(
        "--etcd-ca-file, --etcd-cert-file and --etcd-key-file are for etcd over TLS: name etcd's "
        "endpoints as https://HOST:PORT (kvmaster --etcd) or the cluster as "
        "etcds://HOST:PORT/CLUSTER");
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return InvalidParams(
        "--etcd-cert-file and --etcd-key-file go together: a client certificate and its private "
        "key");
  }
  if (!tls.ca_file.empty())
    KVAGENT_RETURN_IF_ERROR(CheckReadableFile(tls.ca_file, "--etcd-ca-file"));
  if (!tls.cert_file.empty()) {
    KVAGENT_RETURN_IF_ERROR(CheckReadableFile(tls.cert_file, "--etcd-cert-file"));
  }
  if (!tls.key_file.empty()) {
    KVAGENT_RETURN_IF_ERROR(CheckReadableFile(tls.key_file, "--etcd-key-file"));
  }
  return Status::Ok();
}

Status CheckEtcdAuth(const EtcdAuth& auth, const EtcdTls& tls) {
  if (auth.user.empty()) {
    if (!auth.password.empty() || !auth.password_file.empty()) {
      return InvalidParams("an etcd password needs --etcd-user");
    }
    return Status::Ok();
  }
  if (!tls.enabled) {
    return InvalidParams(
        "--etcd-user needs etcd over TLS (https://HOST:PORT for kvmaster --etcd, etcds:// for a "
        "cluster address): the password would cross the network in the clear");
  }
  if (auth.password.empty() && auth.password_file.empty()) {
    return InvalidParams("--etcd-user " + auth.user +
                         " needs its password: --etcd-password-file FILE (mode 0600)");
  }
  return Status::Ok();
}

Result<std::string> ReadEtcdPassword(const std::string& path) {
  auto read = ReadPrivateFile(path, "--etcd-password-file " + path, 4096);
  if (!read.ok()) return read.status();
  std::string& password = *read;
  const size_t end = password.find_first_of("\r\n");
  if (end != std::string::npos) {
    std::fill(password.begin() + static_cast<std::ptrdiff_t>(end), password.end(), '\0');
    password.resize(end);
  }
  if (password.empty()) return InvalidParams("--etcd-password-file " + path + " holds no password");
  return std::move(*read);
}

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdClientOptions options) {
  if (options.endpoints.empty()) return InvalidParams("no etcd endpoint given");
  for (const std::string& e : options.endpoints) {
    KVAGENT_RETURN_IF_ERROR(ParseEtcdEndpoints(e, nullptr));
  }
  if (options.timeout.count() <= 0) return InvalidParams("the etcd call timeout must be positive");
  KVAGENT_RETURN_IF_ERROR(CheckEtcdTls(options.tls));
  KVAGENT_RETURN_IF_ERROR(CheckEtcdAuth(options.auth, options.tls));
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::make_unique<Http>(std::move(options))));
}

EtcdClient::EtcdClient(std::unique_ptr<Http> http) : http_(std::move(http)) {}
EtcdClient::~EtcdClient() = default;

const std::string& EtcdClient::endpoint() const { return http_->endpoint(); }

Result<std::optional<EtcdKeyValue>> EtcdClient::Get(std::string_view key, int64_t* revision) {
  auto answer = http_->Post("kv/range", Json{{"key", Base64(key)}});
  if (!answer.ok()) return answer.status();
  auto kvs = KeyValuesOf(*answer);
  if (!kvs.ok()) return kvs.status();
  SetRevision(*answer, revision);
  if (kvs->empty()) return std::optional<EtcdKeyValue>();
  return std::optional<EtcdKeyValue>(std::move(kvs->front()));
}

Result<std::vector<EtcdKeyValue>> EtcdClient::GetPrefix(std::string_view prefix,
                                                        int64_t* revision) {
  auto answer = http_->Post(
      "kv/range", Json{{"key", Base64(prefix)}, {"range_end", Base64(PrefixEnd(prefix))}});
  if (!answer.ok()) return answer.status();
  SetRevision(*answer, revision);
  return KeyValuesOf(*answer);
}

Status EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  Json body{{"key", Base64(key)}, {"value", Base64(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  return http_->Post("kv/put", body).status();
}

Result<EtcdClient::CreateResult> EtcdClient::CreateIfAbsent(std::string_view key,
                                                            std::string_view value, int64_t lease) {
  Json put{{"key", Base64(key)}, {"value", Base64(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  const Json body{{"compare", Json::array({CompareCreateRevision(key, 0)})},
                  {"success", Json::array({Json{{"request_put", put}}})},
                  {"failure", Json::array({Json{{"request_range", Json{{"key", Base64(key)}}}}})}};
  auto answer = http_->Post("kv/txn", body);
  if (!answer.ok()) return answer.status();
  CreateResult out;
  if (Succeeded(*answer)) {
    out.created = true;
    int64_t revision = 0;
    SetRevision(*answer, &revision);  // the put created the key at the txn's revision
    if (revision <= 0) return BadAnswer("txn");
    out.create_revision = revision;
    return out;
  }
  auto kvs = KeyValuesOfFirstRange(*answer);
  if (!kvs.ok()) return kvs.status();
  if (!kvs->empty()) out.existing = std::move(kvs->front());
  return out;
}

Result<bool> EtcdClient::PutIfCreatedAt(std::string_view key, std::string_view value, int64_t lease,
                                        int64_t create_revision) {
  Json put{{"key", Base64(key)}, {"value", Base64(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  const Json body{{"compare", Json::array({CompareCreateRevision(key, create_revision)})},
                  {"success", Json::array({Json{{"request_put", put}}})}};
  auto answer = http_->Post("kv/txn", body);
  if (!answer.ok()) return answer.status();
  return Succeeded(*answer);
}

Result<bool> EtcdClient::DeleteIfCreatedAt(std::string_view key, int64_t create_revision) {
  const Json body{
      {"compare", Json::array({CompareCreateRevision(key, create_revision)})},
      {"success", Json::array({Json{{"request_delete_range", Json{{"key", Base64(key)}}}}})}};
  auto answer = http_->Post("kv/txn", body);
  if (!answer.ok()) return answer.status();
  return Succeeded(*answer);
}

Result<EtcdLease> EtcdClient::GrantLease(std::chrono::seconds ttl) {
  auto answer = http_->Post("lease/grant", Json{{"TTL", std::to_string(ttl.count())}});
  if (!answer.ok()) return answer.status();
  const std::optional<int64_t> id = JsonInt(*answer, "ID");
  const std::optional<int64_t> granted = JsonInt(*answer, "TTL");
  if (!id || !granted || *id == 0 || *granted <= 0) {
    if (const auto e = answer->find("error"); e != answer->end() && e->is_string()) {
      return Status(ErrorCode::kMasterUnavailable,
                    "etcd refused a lease: " + e->get<std::string>());
    }
    return BadAnswer("lease/grant");
  }
  return EtcdLease{*id, std::chrono::seconds(*granted)};
}

Result<std::chrono::seconds> EtcdClient::KeepAlive(int64_t lease) {
  auto answer = http_->Post("lease/keepalive", Json{{"ID", std::to_string(lease)}});
  if (!answer.ok()) return answer.status();
  // A stream endpoint: one message {"result": {...}} (or {"error": ...}) per request sent.
  const auto result = answer->find("result");
  if (result == answer->end()) {
    if (answer->contains("error")) return StatusFromError(answer->at("error"), 200);
    return BadAnswer("lease/keepalive");
  }
  const std::optional<int64_t> ttl = JsonInt(*result, "TTL");
  if (!ttl) return BadAnswer("lease/keepalive");
  return std::chrono::seconds(std::max<int64_t>(0, *ttl));
}

Status EtcdClient::RevokeLease(int64_t lease) {
  Status st = http_->Post("lease/revoke", Json{{"ID", std::to_string(lease)}}).status();
  if (st.code() == ErrorCode::kObjectNotFound) return Status::Ok();  // gone already
  return st;
}

}  // namespace kvagent::coord

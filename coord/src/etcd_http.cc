#include "etcd_http.h"

#include "kvagent/common/private_file.h"

#include <sodium.h>

#include <charconv>
#include <mutex>

namespace kvagent::coord {

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string Base64(std::string_view bytes) {
  const size_t size = sodium_base64_ENCODED_LEN(bytes.size(), sodium_base64_VARIANT_ORIGINAL);
  std::string out(size, '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()),
                    bytes.size(), sodium_base64_VARIANT_ORIGINAL);
  out.resize(size - 1);  // the terminating NUL
  return out;
}

Result<std::string> FromBase64(std::string_view text) {
  std::string out(text.size() / 4 * 3 + 3, '\0');
  size_t length = 0;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(out.data()), out.size(), text.data(),
                        text.size(), nullptr, &length, nullptr,
                        sodium_base64_VARIANT_ORIGINAL) != 0) {
    return Internal("etcd sent a key or value that is not base64");
  }
  out.resize(length);
  return out;
}

std::optional<int64_t> JsonInt(const Json& object, const char* field) {
  if (!object.is_object()) return std::nullopt;
  const auto it = object.find(field);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return std::nullopt;
  const std::string& s = it->get_ref<const std::string&>();
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

Result<EtcdKeyValue> KeyValueFrom(const Json& kv) {
  if (!kv.is_object()) return Internal("etcd sent a key-value that is not an object");
  EtcdKeyValue out;
  for (auto [field, target] : {std::pair{"key", &out.key}, std::pair{"value", &out.value}}) {
    const auto it = kv.find(field);
    if (it == kv.end()) continue;
    if (!it->is_string()) return Internal(std::string("etcd sent a non-string ") + field);
    auto bytes = FromBase64(it->get_ref<const std::string&>());
    if (!bytes.ok()) return bytes.status();
    *target = std::move(*bytes);
  }
  const std::pair<const char*, int64_t*> ints[] = {{"create_revision", &out.create_revision},
                                                   {"mod_revision", &out.mod_revision},
                                                   {"version", &out.version},
                                                   {"lease", &out.lease}};
  for (const auto& [field, target] : ints) {
    const std::optional<int64_t> v = JsonInt(kv, field);
    if (!v) return Internal(std::string("etcd sent a non-integer ") + field);
    *target = *v;
  }
  return out;
}

Result<std::vector<EtcdKeyValue>> KeyValuesOf(const Json& answer) {
  std::vector<EtcdKeyValue> out;
  const auto kvs = answer.find("kvs");
  if (kvs == answer.end()) return out;
  if (!kvs->is_array()) return Internal("etcd sent kvs that are not a list");
  for (const Json& kv : *kvs) {
    auto parsed = KeyValueFrom(kv);
    if (!parsed.ok()) return parsed.status();
    out.push_back(std::move(*parsed));
  }
  return out;
}

Result<std::vector<EtcdKeyValue>> KeyValuesOfFirstRange(const Json& txn_answer) {
  const auto responses = txn_answer.find("responses");
  if (responses == txn_answer.end() || !responses->is_array() || responses->empty()) {
    return Internal("etcd answered txn without the responses it ran");
  }
  const Json& first = (*responses)[0];
  if (!first.is_object()) return Internal("etcd sent a txn response that is not an object");
  const auto range = first.find("response_range");
  if (range == first.end()) return std::vector<EtcdKeyValue>();
  if (!range->is_object()) return Internal("etcd sent a response_range that is not an object");
  return KeyValuesOf(*range);
}

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Status StatusFromError(const Json& answer, long http_code) {
  std::string message = "etcd answered HTTP " + std::to_string(http_code);
  int64_t grpc = 2;  // UNKNOWN
  if (answer.is_object()) {
    if (const auto m = answer.find("message"); m != answer.end() && m->is_string()) {
      message = "etcd: " + m->get<std::string>();
    }
    grpc = JsonInt(answer, "code").value_or(2);
  }
  switch (grpc) {
    case 3:   // INVALID_ARGUMENT
    case 11:  // OUT_OF_RANGE (e.g. a compacted revision)
      return InvalidParams(message);
    case 5:  // NOT_FOUND (a lease)
      return Status(ErrorCode::kObjectNotFound, message);
    case 7:  // PERMISSION_DENIED: the etcd user may not touch the key
      return Internal(message +
                      " (with etcd's authentication on, the --etcd-user needs read and write on "
                      "the keys under /kvagent/CLUSTER/: etcdctl role grant-permission ROLE "
                      "readwrite /kvagent/CLUSTER/ --prefix=true)");
    case 4:   // DEADLINE_EXCEEDED ("request timed out")
    case 8:   // RESOURCE_EXHAUSTED
    case 14:  // UNAVAILABLE ("no leader")
      return Status(ErrorCode::kMasterUnavailable, message + "; retry shortly");
    default:
      return Internal(message);
  }
}

// ---- CurlHandle -----------------------------------------------------------------------------

CurlHandle::CurlHandle() {
  InitCurlOnce();
  curl_ = curl_easy_init();
}

CurlHandle::~CurlHandle() {
  if (curl_ != nullptr) curl_easy_cleanup(curl_);
  curl_slist_free_all(headers_);
  WipeString(auth_header_);
}

size_t CurlHandle::Write(char* data, size_t size, size_t n, void* self) {
  auto* h = static_cast<CurlHandle*>(self);
  if (h->body_.size() + size * n > kMaxAnswerBytes) {
    h->overflowed_ = true;
    return 0;  // aborts the transfer
  }
  h->body_.append(data, size * n);
  return size * n;
}

void CurlHandle::Prepare(const std::string& endpoint, std::string_view path,
                         const std::string& payload, const EtcdTls& tls, const std::string& token) {
  body_.clear();
  overflowed_ = false;
  error_[0] = '\0';
  tls_ = tls.enabled;
  const std::string url =
      (tls.enabled ? "https://" : "http://") + endpoint + "/v3/" + std::string(path);
  curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, error_);
  curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl_, CURLOPT_PROXY, "");  // never an http_proxy from the environment
  curl_easy_setopt(curl_, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl_, CURLOPT_TCP_NODELAY, 1L);
  // HTTP/1.1 always: over TLS curl would otherwise offer HTTP/2 (ALPN), and the gateway's watch
  // stream is read as lines of a chunked HTTP/1.1 answer.
  curl_easy_setopt(curl_, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_slist_free_all(headers_);
  WipeString(auth_header_);
  headers_ = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!token.empty()) {
    auth_header_ = "Authorization: " + token;
    headers_ = curl_slist_append(headers_, auth_header_.c_str());
  }
  curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers_);
  curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE, static_cast<long>(payload.size()));
  curl_easy_setopt(curl_, CURLOPT_COPYPOSTFIELDS, payload.c_str());
  curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, &CurlHandle::Write);
  curl_easy_setopt(curl_, CURLOPT_WRITEDATA, this);
  // Only the scheme the caller chose: a redirect is not followed (the default), and no other
  // protocol could be spoken.
  curl_easy_setopt(curl_, CURLOPT_PROTOCOLS_STR, tls.enabled ? "https" : "http");
  if (tls.enabled) {
    curl_easy_setopt(curl_, CURLOPT_SSL_VERIFYPEER, 1L);  // curl's defaults, said out loud
    curl_easy_setopt(curl_, CURLOPT_SSL_VERIFYHOST, 2L);
    curl_easy_setopt(curl_, CURLOPT_SSLVERSION, static_cast<long>(CURL_SSLVERSION_TLSv1_2));
#if LIBCURL_VERSION_NUM >= 0x075700
    // The CA file is read for each new connection, not kept for a day (curl's default since
    // 7.87): a CA renewed in place is used from the next connection on.
    curl_easy_setopt(curl_, CURLOPT_CA_CACHE_TIMEOUT, 0L);
#endif
    if (!tls.ca_file.empty()) curl_easy_setopt(curl_, CURLOPT_CAINFO, tls.ca_file.c_str());
    if (!tls.cert_file.empty()) {
      curl_easy_setopt(curl_, CURLOPT_SSLCERT, tls.cert_file.c_str());
      curl_easy_setopt(curl_, CURLOPT_SSLKEY, tls.key_file.c_str());
    }
  }
}

std::string CurlHandle::Failure(CURLcode rc) const {
  if (overflowed_) return "a message larger than 16 MiB";
  const std::string why = error_[0] != '\0' ? std::string(error_) : curl_easy_strerror(rc);
  switch (rc) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_CLIENTCERT:
      return "TLS: " + why +
             " (check --etcd-ca-file, --etcd-cert-file and --etcd-key-file, and that etcd's "
             "certificate names this host or address)";
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
      // What a TLS server does to a client it refuses (a reset, an alert read as an error), and
      // to a client that does not speak TLS (no answer).
      return tls_ ? "TLS: " + why +
                        " (etcd may have refused this client: check --etcd-cert-file and "
                        "--etcd-key-file against etcd's --trusted-ca-file)"
                  : why + " (if etcd speaks TLS there, name it as https:// or etcds://)";
    default:
      return why;
  }
}

// ---- EtcdClient::Http -----------------------------------------------------------------------

EtcdClient::Http::Http(EtcdClientOptions options) : options_(std::move(options)) {}

EtcdClient::Http::~Http() {
  WipeString(token_);
  WipeString(options_.auth.password);
}

Result<Json> EtcdClient::Http::Post(std::string_view path, const Json& body) {
  if (options_.auth.user.empty()) {
    bool stale = false;
    return Send(path, body, &stale);
  }
  auto token = Token();
  if (!token.ok()) return token.status();
  bool stale = false;
  Result<Json> answer = Send(path, body, &stale);
  if (!stale) return answer;
  authenticated_ = false;  // expired, the password changed, etcd restarted, or auth enabled
  token = Token();
  if (!token.ok()) return token.status();
  return Send(path, body, &stale);
}

Result<std::string> EtcdClient::Http::Token() {
  if (options_.auth.user.empty() || authenticated_) return token_;
  WipeString(token_);
  if (!options_.auth.password_file.empty()) {
    // Read each time: the password may have been changed (in etcd and in the file) since.
    auto password = ReadEtcdPassword(options_.auth.password_file);
    if (!password.ok()) {
      return Status(ErrorCode::kMasterUnavailable,
                    "cannot authenticate to etcd: " + password.status().message());
    }
    WipeString(options_.auth.password);
    options_.auth.password = std::move(*password);
  }
  Json request{{"name", options_.auth.user}, {"password", options_.auth.password}};
  bool stale = false;
  Result<Json> answer = Send("auth/authenticate", request, &stale);
  request["password"].get_ref<std::string&>().assign(options_.auth.password.size(), '\0');
  if (!answer.ok()) {
    if (answer.status().message().find("authentication is not enabled") != std::string::npos) {
      authenticated_ = true;  // etcd takes calls without a token
      return token_;
    }
    if (answer.status().code() == ErrorCode::kMasterUnavailable) return answer.status();
    return InvalidParams("etcd refused user " + options_.auth.user + " (" +
                         answer.status().message() +
                         "); check --etcd-user and --etcd-password-file");
  }
  const auto it = answer->find("token");
  if (it == answer->end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
    return Internal("etcd answered auth/authenticate without a token");
  }
  token_ = it->get<std::string>();
  authenticated_ = true;
  return token_;
}

Result<Json> EtcdClient::Http::Send(std::string_view path, const Json& body, bool* stale) {
  *stale = false;
  using Clock = std::chrono::steady_clock;
  std::string payload = body.dump();
  struct Wipe {  // the password of auth/authenticate
    std::string* s;
    bool secret;
    ~Wipe() {
      if (secret) WipeString(*s);
    }
  } wipe{&payload, path == "auth/authenticate"};
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  std::string failures;
  for (size_t tried = 0; tried < options_.endpoints.size(); ++tried) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    const std::string& endpoint = options_.endpoints[current_];
    handle_.Prepare(endpoint, path, payload, options_.tls, token_);
    curl_easy_setopt(handle_.get(), CURLOPT_TIMEOUT_MS, static_cast<long>(left));
    curl_easy_setopt(handle_.get(), CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(left));
    const CURLcode rc = curl_easy_perform(handle_.get());
    long http = 0;
    curl_easy_getinfo(handle_.get(), CURLINFO_RESPONSE_CODE, &http);
    std::string why;
    if (rc != CURLE_OK) {
      why = handle_.Failure(rc);
    } else {
      Json answer = Json::parse(handle_.body(), nullptr, /*allow_exceptions=*/false);
      if (answer.is_discarded()) {
        const std::string& text = handle_.body();
        std::string hint = "is this etcd's client port?";
        if (text.find("HTTPS") != std::string::npos) {
          hint =
              "it serves TLS there: name it as https://HOST:PORT (kvmaster --etcd) or "
              "etcds://HOST:PORT/CLUSTER";
        } else if (text.find("CommonName of client") != std::string::npos) {
          // etcd 3.4's gateway, with its authentication on, refuses a client certificate that
          // names a user (a CN), which would otherwise stand for the user.
          hint =
              "etcd refuses a client certificate with a Common Name on its JSON gateway while "
              "its user authentication is on: give --etcd-cert-file a certificate whose "
              "subject has no CN";
        }
        return Internal("etcd at " + endpoint + " answered /v3/" + std::string(path) +
                        " with something that is not JSON (HTTP " + std::to_string(http) + "); " +
                        hint);
      }
      if (http == 200) return answer;
      Status st = StatusFromError(answer, http);
      // UNAUTHENTICATED ("invalid auth token"), or a call without a token where etcd wants one.
      *stale = JsonInt(answer, "code").value_or(0) == 16 ||
               st.message().find("user name is empty") != std::string::npos;
      if (http < 500 && st.code() != ErrorCode::kMasterUnavailable) return st;
      why = st.message();
    }
    if (!failures.empty()) failures += "; ";
    failures += endpoint + ": " + why;
    current_ = (current_ + 1) % options_.endpoints.size();
  }
  if (failures.empty()) failures = "no time left";
  return Status(ErrorCode::kMasterUnavailable,
                "etcd is not reachable (" + failures +
                    "); check that etcd runs and that --etcd / etcd:// (etcds:// for TLS) names "
                    "its client URLs");
}

}  // namespace kvagent::coord

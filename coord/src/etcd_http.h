// The library's private plumbing: one HTTP/1.1 client of etcd's JSON gateway (libcurl), the
// gateway's encodings (base64 keys and values, 64-bit integers as strings), and JSON parsing.
// Nothing here is visible outside coord/.
#pragma once

#include <curl/curl.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/common/status.h"
#include "kvagent/coord/etcd_client.h"
#include "kvagent/coord/etcd_watch.h"

namespace kvagent::coord {

using Json = nlohmann::json;

// libcurl's process-wide initialization, done once before the first handle.
void InitCurlOnce();

// Answers larger than this are refused (a peer that is not etcd cannot make us grow).
inline constexpr size_t kMaxAnswerBytes = size_t{16} << 20;

std::string Base64(std::string_view bytes);
// INTERNAL when `text` is not base64.
Result<std::string> FromBase64(std::string_view text);

// The gateway sends 64-bit integers as JSON strings ("42"); absent fields are 0 (proto3).
// nullopt when the field is present but not an integer.
std::optional<int64_t> JsonInt(const Json& object, const char* field);
// A key-value object of an answer (kvs[i], or an event's kv).
Result<EtcdKeyValue> KeyValueFrom(const Json& kv);
// The kvs of a range answer (none when `kvs` is absent).
Result<std::vector<EtcdKeyValue>> KeyValuesOf(const Json& answer);
// The kvs of the range a failed transaction ran instead (its first response).
Result<std::vector<EtcdKeyValue>> KeyValuesOfFirstRange(const Json& txn_answer);
// One line of a watch stream from `endpoint`: its events appended to `out`, *created set when it
// confirms the watch. An error line, a canceled watch or an unexpected document is an error.
Status ParseWatchLine(std::string_view line, const std::string& endpoint, bool* created,
                      std::vector<EtcdEvent>* out);
// The range_end that makes a range cover every key starting with `prefix`.
std::string PrefixEnd(std::string_view prefix);
// An etcd error answer ({"error": ..., "code": N}) as a Status: gRPC codes mapped to ours.
Status StatusFromError(const Json& answer, long http_code);

// A curl easy handle and its answer buffer, reused call after call.
class CurlHandle {
 public:
  CurlHandle();
  ~CurlHandle();
  CurlHandle(const CurlHandle&) = delete;
  CurlHandle& operator=(const CurlHandle&) = delete;

  CURL* get() const { return curl_; }
  std::string& body() { return body_; }
  bool overflowed() const { return overflowed_; }
  // Sets up a POST of `payload` (copied) to /v3/`path` of `endpoint` (http://, or https:// with
  // `tls`) with a JSON content type, etcd's auth `token` when not empty, no proxy, and the answer
  // going to body().
  void Prepare(const std::string& endpoint, std::string_view path, const std::string& payload,
               const EtcdTls& tls, const std::string& token = "");
  // Why the last transfer that returned `rc` failed: curl's own words (with the TLS library's
  // reason for a TLS failure) and, for TLS failures, which flags to check.
  std::string Failure(CURLcode rc) const;

 private:
  static size_t Write(char* data, size_t size, size_t n, void* self);
  CURL* curl_ = nullptr;
  curl_slist* headers_ = nullptr;
  std::string auth_header_;  // "Authorization: TOKEN", wiped when replaced
  char error_[CURL_ERROR_SIZE] = {};
  bool tls_ = false;  // the transfer Prepare set up speaks TLS
  std::string body_;
  bool overflowed_ = false;
};

class EtcdClient::Http {
 public:
  explicit Http(EtcdClientOptions options);
  ~Http();

  // POSTs `body` to http(s)://ENDPOINT/v3/`path` and returns the parsed answer. Tries the endpoint
  // that answered last first, then the others, within options.timeout in all. An endpoint that
  // cannot be reached, or answers 5xx or "unavailable", is skipped; an error etcd answered
  // otherwise is returned as it is (StatusFromError). With options.auth: authenticated (see
  // Token), and once more, with a new token, when etcd no longer takes the one it had.
  Result<Json> Post(std::string_view path, const Json& body);

  // The auth token calls carry: "" without options.auth (or when etcd has no authentication
  // enabled); else the one etcd gave, asked for first when there is none. INVALID_PARAMS when
  // etcd refuses the user or the password.
  Result<std::string> Token();

  const std::string& endpoint() const { return options_.endpoints[current_]; }
  const EtcdClientOptions& options() const { return options_; }

 private:
  // One POST as above with the current token; *stale set when etcd refused the token (expired,
  // or etcd restarted) or wanted one.
  Result<Json> Send(std::string_view path, const Json& body, bool* stale);

  EtcdClientOptions options_;
  size_t current_ = 0;
  CurlHandle handle_;
  std::string token_;
  bool authenticated_ = false;  // token_ is etcd's answer (possibly "": no auth there)
};

}  // namespace kvagent::coord

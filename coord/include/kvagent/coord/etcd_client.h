// EtcdClient: the few etcd v3 calls kvagent needs, over etcd's JSON gateway (HTTP/1.1 + JSON at
// /v3/..., which etcd serves on its client port next to gRPC; etcd 3.4 and later).
//
// Keys and values are bytes (the gateway carries them base64-encoded; that stays inside). Every
// call is a blocking HTTP request bounded by `timeout`; when an endpoint cannot be reached the
// call moves on to the next one (each endpoint at most once per call), so a client of a
// three-node etcd keeps working while one node is down. Errors are values:
//   MASTER_UNAVAILABLE  no endpoint answered in time (etcd down or unreachable; retry);
//   INTERNAL            etcd answered something that is not what its API promises;
//   INVALID_PARAMS      a bad option (no endpoint), or etcd refused the request as malformed.
//
// Over TLS (https) when options.tls.enabled: etcd's certificate is verified against the CA file
// given (else the system's CAs) and must name the host or address of the endpoint; a client
// certificate and key are presented when given (etcd's --client-cert-auth asks for them). With
// options.auth, the client authenticates as that etcd user (etcd's auth/authenticate) before its
// first call and sends the token with every call, authenticating again when etcd no longer
// takes it (a token expired, etcd restarted).
//
// Not thread-safe: one client per thread (it keeps one connection open for reuse).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/common/status.h"

namespace kvagent::coord {

// How to reach etcd over TLS. Paths of PEM files; empty: not given. The files are read for each
// new connection, so certificates renewed in place are used from the next one on.
struct EtcdTls {
  bool enabled = false;   // https:// endpoints (a cluster address etcds://...)
  std::string ca_file;    // the CAs etcd's certificate is checked against (empty: the system's)
  std::string cert_file;  // this client's certificate (with key_file), for --client-cert-auth
  std::string key_file;   // its private key
};

// OK when `tls` can be used: every file given is a readable regular file, a certificate comes
// with its key, and files are given only with TLS enabled; INVALID_PARAMS naming the flag
// (--etcd-ca-file, --etcd-cert-file, --etcd-key-file) otherwise.
Status CheckEtcdTls(const EtcdTls& tls);

// etcd's user authentication (`etcdctl auth enable`): the user this client acts as, and its
// password. No user: none.
struct EtcdAuth {
  std::string user;
  std::string password;
  // When set, the password is read from this file (ReadEtcdPassword) each time the client
  // authenticates (at its first call, and when etcd no longer takes its token), so a password
  // changed in etcd and in the file is used without a restart; `password` is then what was read
  // last (EtcdAccessFlags::Apply reads it at start, to refuse a bad file at once).
  std::string password_file = {};
};

// OK when `auth` can be used with `tls`: no user, or a user with a password (or a password file)
// over TLS (the password crosses the network); INVALID_PARAMS naming --etcd-user otherwise.
Status CheckEtcdAuth(const EtcdAuth& auth, const EtcdTls& tls);

// The password on the first line of `path` (--etcd-password-file): a regular file only its owner
// (or root) may read or write (ReadPrivateFile). INVALID_PARAMS naming the file when it cannot be
// read, is open to others, or holds no password.
Result<std::string> ReadEtcdPassword(const std::string& path);

struct EtcdClientOptions {
  std::vector<std::string> endpoints;       // "HOST:PORT" of etcd's client URLs
  std::chrono::milliseconds timeout{1000};  // per call, over all endpoints tried
  EtcdTls tls = {};                         // https when tls.enabled
  EtcdAuth auth = {};                       // as an etcd user when auth.user is set
};

// One key as etcd stores it.
struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // the revision that created the key (stable while it exists)
  int64_t mod_revision = 0;     // the revision of its last change
  int64_t version = 0;          // changes since it was created (1 after the create)
  int64_t lease = 0;            // the lease it is attached to (0: none)
};

struct EtcdLease {
  int64_t id = 0;
  std::chrono::seconds ttl{0};  // as granted: etcd raises a TTL below its minimum
};

class EtcdClient {
 public:
  // INVALID_PARAMS when `options` names no endpoint or one that is not HOST:PORT.
  static Result<std::unique_ptr<EtcdClient>> Create(EtcdClientOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The key, or nullopt when it does not exist. `*revision` (optional): the store's revision
  // the answer reflects (a watch from revision + 1 misses nothing after it).
  Result<std::optional<EtcdKeyValue>> Get(std::string_view key, int64_t* revision = nullptr);
  // Every key starting with `prefix`, in key order.
  Result<std::vector<EtcdKeyValue>> GetPrefix(std::string_view prefix, int64_t* revision = nullptr);

  // Sets the key (attached to `lease` when non-zero: it goes when the lease does).
  Status Put(std::string_view key, std::string_view value, int64_t lease = 0);

  // Creates the key only when it does not exist (one transaction). `created`: true with the
  // key's create revision; false with the key as it is.
  struct CreateResult {
    bool created = false;
    int64_t create_revision = 0;
    std::optional<EtcdKeyValue> existing;
  };
  Result<CreateResult> CreateIfAbsent(std::string_view key, std::string_view value, int64_t lease);
  // Replaces the key's value only while it is the key created at `create_revision` (one
  // transaction); false when it is gone or was created again since.
  Result<bool> PutIfCreatedAt(std::string_view key, std::string_view value, int64_t lease,
                              int64_t create_revision);
  // Deletes the key only while it is the key created at `create_revision`; false otherwise.
  Result<bool> DeleteIfCreatedAt(std::string_view key, int64_t create_revision);

  Result<EtcdLease> GrantLease(std::chrono::seconds ttl);
  // Renews the lease; returns its TTL from now, or 0 when etcd no longer has it (expired or
  // revoked: every key attached to it is gone).
  Result<std::chrono::seconds> KeepAlive(int64_t lease);
  // Revokes the lease (its keys go at once). OK also when it was already gone.
  Status RevokeLease(int64_t lease);

  // The endpoint that answered last, e.g. for log lines.
  const std::string& endpoint() const;

  class Http;  // private to the library

 private:
  explicit EtcdClient(std::unique_ptr<Http> http);
  std::unique_ptr<Http> http_;
};

// OK when `endpoints` is a non-empty list of HOST:PORT (an http:// prefix is accepted and
// dropped); INVALID_PARAMS with an example otherwise. The parsed list in `*out` when given.
// With `https` given, https:// prefixes are accepted too (all endpoints or none) and *https
// says whether they were there; without it they are refused.
Status ParseEtcdEndpoints(std::string_view text, std::vector<std::string>* out,
                          bool* https = nullptr);

}  // namespace kvagent::coord

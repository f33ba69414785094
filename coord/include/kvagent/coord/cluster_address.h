// A cluster of kvmasters coordinated through etcd, and where its records live in etcd.
//
// Operators name a cluster as `etcd://HOST:PORT[,HOST:PORT...]/CLUSTER` (agents' and kvctl's
// --master) or as `--etcd HOST:PORT[,...] --cluster CLUSTER` (kvmaster); with etcd over TLS as
// `etcds://HOST:PORT[,...]/CLUSTER` or `--etcd https://HOST:PORT[,...]`, and the files of
// EtcdAccessFlags (the CA, a client certificate and key; an etcd user and its password).
// Its keys, under `/kvagent/CLUSTER/`:
//   leader           the elected kvmaster's LeaderRecord, attached to its lease; the key's create
//                    revision is the leader's epoch
//   members/NAME     each kvmaster's MemberRecord, attached to its own lease
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/common/status.h"
#include "kvagent/coord/etcd_client.h"

namespace kvagent {

class FlagSet;

namespace coord {

struct ClusterAddress {
  std::vector<std::string> etcd_endpoints;  // HOST:PORT each
  std::string cluster;
  EtcdTls tls = {};    // enabled by etcds://; the files from EtcdAccessFlags
  EtcdAuth auth = {};  // from EtcdAccessFlags

  // etcd://HOST:PORT[,HOST:PORT]/CLUSTER (etcds:// over TLS)
  std::string ToString() const;
  // The options of a client of this cluster's etcd.
  EtcdClientOptions Etcd(std::chrono::milliseconds timeout) const {
    return EtcdClientOptions{etcd_endpoints, timeout, tls, auth};
  }
};

// True when `text` is meant as a cluster address (starts with etcd:// or etcds://).
bool IsClusterAddress(std::string_view text);

// INVALID_PARAMS with an example unless `text` is etcd://HOST:PORT[,HOST:PORT...]/CLUSTER or
// etcds://... (TLS: tls.enabled, no files yet).
Result<ClusterAddress> ParseClusterAddress(std::string_view text);

// How kvmaster, kvagent and kvctl reach a secured etcd, the same flags on each: etcd over TLS
// (--etcd-ca-file, --etcd-cert-file, --etcd-key-file) and etcd's user authentication
// (--etcd-user, --etcd-password-file).
struct EtcdAccessFlags {
  std::string ca_file, cert_file, key_file;
  std::string user, password_file;
  void Declare(FlagSet* flags);
  bool given() const {
    return !ca_file.empty() || !cert_file.empty() || !key_file.empty() || !user.empty() ||
           !password_file.empty();
  }
  // Sets the TLS files and the user of `address` (TLS enabled or not by its scheme), reads the
  // password file (ReadPrivateFile: mode 0600), and checks them all (CheckEtcdTls,
  // CheckEtcdAuth); INVALID_PARAMS naming the flag.
  Status Apply(ClusterAddress* address) const;
};

// OK when `name` can name a cluster or a member: 1..64 of [A-Za-z0-9._-]. `what` names the flag
// in the message.
Status CheckName(std::string_view name, std::string_view what);

// The etcd keys of one cluster.
class ClusterKeys {
 public:
  explicit ClusterKeys(std::string_view cluster);
  const std::string& prefix() const { return prefix_; }  // "/kvagent/CLUSTER/"
  std::string leader() const { return prefix_ + "leader"; }
  std::string members() const { return prefix_ + "members/"; }
  std::string member(std::string_view name) const { return members() + std::string(name); }

 private:
  std::string prefix_;
};

}  // namespace coord
}  // namespace kvagent

// A cluster of kvmasters coordinated through etcd, and where its records live in etcd.
//
// Operators name a cluster as `etcd://HOST:PORT[,HOST:PORT...]/CLUSTER` (agents' and kvctl's
// --master) or as `--etcd HOST:PORT[,...] --cluster CLUSTER` (kvmaster); with etcd over TLS as
// `etcds://HOST:PORT[,...]/CLUSTER` or `--etcd https://HOST:PORT[,...]`, and the files of
// EtcdTlsFlags (the CA, a client certificate and key). Its keys, under
// `/kvagent/CLUSTER/`:
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
  EtcdTls tls = {};  // enabled by etcds://; the files from EtcdTlsFlags

  // etcd://HOST:PORT[,HOST:PORT]/CLUSTER (etcds:// over TLS)
  std::string ToString() const;
  // The options of a client of this cluster's etcd.
  EtcdClientOptions Etcd(std::chrono::milliseconds timeout) const {
    return EtcdClientOptions{etcd_endpoints, timeout, tls};
  }
};

// True when `text` is meant as a cluster address (starts with etcd:// or etcds://).
bool IsClusterAddress(std::string_view text);

// INVALID_PARAMS with an example unless `text` is etcd://HOST:PORT[,HOST:PORT...]/CLUSTER or
// etcds://... (TLS: tls.enabled, no files yet).
Result<ClusterAddress> ParseClusterAddress(std::string_view text);

// The flags that name the files of etcd over TLS, the same on kvmaster, kvagent and kvctl:
// --etcd-ca-file, --etcd-cert-file, --etcd-key-file.
struct EtcdTlsFlags {
  std::string ca_file, cert_file, key_file;
  void Declare(FlagSet* flags);
  // Sets the files of `tls` (enabled or not by the address) and checks them (CheckEtcdTls).
  Status Apply(EtcdTls* tls) const;
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

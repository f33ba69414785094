// A cluster of kvmasters coordinated through etcd, and where its records live in etcd.
//
// Operators name a cluster as `etcd://HOST:PORT[,HOST:PORT...]/CLUSTER` (agents' and kvctl's
// --master) or as `--etcd HOST:PORT[,...] --cluster CLUSTER` (kvmaster). Its keys, under
// `/kvagent/CLUSTER/`:
//   leader           the elected kvmaster's LeaderRecord, attached to its lease; the key's create
//                    revision is the leader's epoch
//   members/NAME     each kvmaster's MemberRecord, attached to its own lease
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kvagent/common/status.h"

namespace kvagent::coord {

struct ClusterAddress {
  std::vector<std::string> etcd_endpoints;  // HOST:PORT each
  std::string cluster;

  // etcd://HOST:PORT[,HOST:PORT]/CLUSTER
  std::string ToString() const;
};

// True when `text` is meant as a cluster address (starts with etcd://).
bool IsClusterAddress(std::string_view text);

// INVALID_PARAMS with an example unless `text` is etcd://HOST:PORT[,HOST:PORT...]/CLUSTER.
Result<ClusterAddress> ParseClusterAddress(std::string_view text);

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

}  // namespace kvagent::coord

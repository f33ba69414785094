// kvagent's command line: every flag, declared once, and the checks that run before start-up
// (kvagent exits 2 with the first failed check's message, before it touches anything).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvagent/agent/agent.h"
#include "kvagent/common/cluster_auth_flags.h"
#include "kvagent/common/flags.h"
#include "kvagent/common/status.h"
#include "kvagent/coord/cluster_address.h"
#include "kvagent/master/master_flags.h"
#include "kvagent/relay/relay_flags.h"
#include "kvagent/transfer/transfer_flags.h"

namespace kvagent::agent {

struct AgentFlags {
  AgentConfig agent;
  int64_t max_clients = agent.max_clients;
  int64_t max_clients_per_uid = agent.max_clients_per_uid;
  int64_t spin_us = agent.spin.count();
  int64_t handshake_timeout_ms = agent.handshake_timeout.count();
  std::vector<std::string> allow_uids;
  std::vector<std::string> allow_gids;
  std::string master;
  std::string master_transport = "auto";  // or "zmq", or "framed" (kvmaster --framed-listen)
  bool standalone = false;
  std::string agent_name;
  bool checksums = true;
  int64_t copy_threads = 0;  // 0: min(4, the CPUs this process may run on)
  uint64_t reserved_write_bytes = 64ull << 20;
  bool serve_data = true;  // false: standalone without --data-listen (no data server)
  int64_t heartbeat_ms = 1000;
  int64_t master_timeout_ms = 5000;
  int64_t ready_wait_ms = -1;  // -1: --master-timeout-ms
  kvagent::transfer::TransferFlags transfer;
  kvagent::relay::EventRelayFlags relay;
  kvagent::master::MasterOptions embedded;  // the standalone master's options
  std::string metrics_listen;               // empty: no /metrics endpoint
  kvagent::ClusterAuthFlags auth;
  kvagent::coord::EtcdAccessFlags etcd_access;   // --master etcd(s)://...
  std::optional<coord::ClusterAddress> cluster;  // --master etcd(s)://...: as Check made it
  std::optional<kvagent::ClusterSecret> secret;  // loaded by Check
};

// Declares every kvagent flag on `f`, each writing into `v`.
void DeclareAgentFlags(FlagSet& f, AgentFlags& v);

// Checks what was parsed and derives what follows from it: the allowed ids, the cluster secret
// (loaded), a remote agent's data-listen address without a secret (loopback), the agent name
// (<hostname>:<run-dir> unless given). INVALID_PARAMS naming the flag when one is wrong.
Status CheckAgentFlags(AgentFlags& v);

}  // namespace kvagent::agent

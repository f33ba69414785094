// kvmaster as a member of a cluster coordinated through etcd (`kvmaster --etcd ENDPOINTS
// --cluster NAME`): elected leader, followers, failover.
//
// Every member holds an etcd lease (kept alive every quarter TTL) and publishes its role and
// position (whose log it holds, how far) under members/NAME. The leader holds the leader key,
// created on its lease in a transaction that succeeds only while the key does not exist; the
// key's create revision is the term's epoch, which every reply and placement of that master
// carries. The others follow the leader's log (Standby, long-polling Replicate) into their own
// --state-dir. When the leader key goes (its lease expired: the leader died, stopped, or lost
// etcd; or it stepped down), every member publishes its position; after a short settling time
// the member holding the most of the newest log campaigns (the others wait for it, and
// campaign themselves only if it does not take over within two TTLs). The winner replays its log
// (the restart path) and serves with the new epoch; it then publishes its endpoints in the
// leader key, where agents and kvctl discover it.
//
// Step-down: a leader serves only while its lease is certainly alive at etcd — until the moment
// its last confirmed renewal was sent plus the TTL minus the margin (LeaseKeeper); each request
// checks it. Past that it answers MASTER_UNAVAILABLE (not_serving), ticks nothing and publishes
// nothing; when a renewal succeeds again (etcd came back in time) it serves again. When the lease
// or the key is gone it stops its server and follows the new leader.
//
// A member whose state dir holds nothing of the cluster (a new or wiped member) never takes
// over a cluster that has had a leader (the term key says so): it would serve an empty store.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "kvagent/common/flags.h"
#include "kvagent/common/status.h"
#include "kvagent/common/stop_signals.h"
#include "kvagent/coord/cluster_address.h"
#include "kvagent/master/master_server.h"

namespace kvagent::master {

struct HaMemberOptions {
  coord::ClusterAddress cluster;  // etcd endpoints and cluster name
  std::string name;               // this member's name (unique in the cluster)
  std::chrono::seconds lease_ttl{2};
  // Replaces a wildcard host (0.0.0.0, *, ::) in the endpoints published for agents.
  std::string advertise_host;
  MasterServerOptions server;  // what the member serves when it leads (state_dir required)
  std::string ready_file;  // rewritten each time it starts leading (rpc=, events=, replay=, epoch=)
  std::string status_file;  // a follower's progress (Standby's status file)
  // Told when the member's role changes (its thread): `serving` the server while it leads (valid
  // until the next call), else nullptr; `following` while it follows a leader. Optional.
  std::function<void(const MasterServer* serving, bool following)> on_role;
};

// The flags of HA mode, declared once (kvmaster_main.cc).
struct HaFlags {
  std::string etcd;  // --etcd HOST:PORT[,HOST:PORT] (https://HOST:PORT,...: over TLS)
  coord::EtcdAccessFlags etcd_access;
  std::string cluster;  // --cluster NAME
  std::string name;     // --name (default: the host name)
  int64_t leader_lease_ms = 1000;
  std::string advertise_host;
  int64_t sync_followers = 0;

  void Declare(FlagSet* flags);
  bool enabled() const { return !etcd.empty() || !cluster.empty() || etcd_access.given(); }
  // Checks the flags and fills the HA fields of `*out` (its server options are the caller's).
  // INVALID_PARAMS naming the flag at fault.
  Status Apply(HaMemberOptions* out) const;
};

// Runs the member until SIGTERM or SIGINT; returns the exit code (0). A leader that stops hands
// over at once: it stops serving, then revokes its lease so that the others need not wait for
// the TTL.
int RunHaMember(HaMemberOptions options, const StopSignals& signals);

}  // namespace kvagent::master

// kvmaster's command line: every flag, declared once, and the checks that run before start-up
// (kvmaster exits 2 with the first failed check's message, before it touches anything).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ha_member.h"
#include "kvagent/common/cluster_auth_flags.h"
#include "kvagent/common/flags.h"
#include "kvagent/common/status.h"
#include "kvagent/master/master_server.h"
#include "kvagent/master/standby.h"

namespace kvagent::master {

// --framed-listen's default: beside --listen, on a port the OS picks (CheckKvmasterFlags
// resolves it).
inline constexpr std::string_view kFramedListenAuto = "auto";

struct KvmasterFlags {
  KvmasterFlags();

  MasterServerOptions server;  // server.master: the metadata service's options
  std::string log_sync;        // --log-sync, parsed into server.master.log_sync by the check
  int64_t tick_ms = 0;         // defaults from `server`
  uint64_t replay_batches = 0;
  std::string log_dir;  // empty: log to stderr
  int64_t log_max_mb = 100;
  int64_t log_keep_days = 7;
  std::string ready_file;
  std::string metrics_listen;  // empty: no /metrics endpoint
  StandbyOptions standby;      // --follow: a standby of that primary
  HaFlags ha;                  // --etcd: a member of an HA cluster
  HaMemberOptions member;      // filled by the check when ha.enabled()
  ClusterAuthFlags auth;
};

// Declares every kvmaster flag on `f`, each writing into `v`.
void DeclareKvmasterFlags(FlagSet& f, KvmasterFlags& v);

// Checks what was parsed and derives what follows from it: the log sync mode, the cluster
// secret (loaded, in `server` and the standby's keys), the HA member's options. INVALID_PARAMS
// naming the flag when one is wrong.
Status CheckKvmasterFlags(KvmasterFlags& v);

}  // namespace kvagent::master

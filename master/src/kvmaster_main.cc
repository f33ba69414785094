// kvmaster: the cluster metadata service and KV-event source (see master_server.h).
//
// Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot start (endpoint in use, bad state dir),
// 2 for a bad flag.
#include <glog/logging.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>

#include "ha_member.h"
#include "kvagent/common/flags.h"
#include "kvagent/common/heap_pages.h"
#include "kvagent/common/stop_signals.h"
#include "kvagent/master/master_server.h"
#include "kvagent/master/standby.h"

namespace {

// Writes the bound endpoints for whoever started us (tests, scripts), atomically.
bool WriteReadyFile(const std::string& path, const kvagent::master::MasterServer& server) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "rpc=" << server.endpoint() << "\n"
        << "events=" << server.events_endpoint() << "\n"
        << "replay=" << server.replay_endpoint() << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Follows the primary until promoted by hand (SIGUSR1); returns nullptr then, or why the standby
// stopped instead ("SIGTERM", "SIGINT", "error"). Automatic failover is --etcd's (ha_member.h).
const char* FollowUntilPromoted(const kvagent::master::StandbyOptions& options,
                                const kvagent::StopSignals& signals) {
  auto standby = kvagent::master::Standby::Start(options);
  if (!standby.ok()) {
    LOG(ERROR) << "kvmaster standby cannot start: " << standby.status().ToString();
    return "error";
  }
  LOG(INFO) << "kvmaster standby: following " << options.primary << ", its state kept in "
            << options.state_dir << "; promote with SIGUSR1";
  std::string why;
  while (why.empty()) {
    const char* sig = signals.WaitFor(std::chrono::milliseconds(100));
    const bool synced = (*standby)->synced();
    if (sig != nullptr && std::string_view(sig) != "SIGUSR1") return sig;
    if (sig != nullptr && !synced) {
      LOG(WARNING) << "kvmaster standby: SIGUSR1 ignored: no snapshot of the primary yet, so "
                      "there is no state to serve";
    } else if (sig != nullptr) {
      why = "SIGUSR1";
    }
  }
  LOG(INFO) << "kvmaster standby: promoting (" << why << ") at the primary's record "
            << (*standby)->applied_seq();
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  kvagent::PreferHugePageHeap(argv);
  kvagent::master::MasterServerOptions opts;
  kvagent::master::MasterOptions& m = opts.master;
  std::string log_dir;
  std::string ready_file;
  int64_t tick_ms = opts.tick_ms;
  uint64_t replay_batches = opts.replay_batches;
  m.replication_log_bytes = 64ull << 20;
  kvagent::master::StandbyOptions standby_options;
  kvagent::master::HaFlags ha;

  kvagent::FlagSet flags("kvmaster", "cluster metadata service and KV-event source of kvagent");
  flags.String("listen", &opts.listen, "ZMQ ROUTER endpoint for agent requests (master.fbs)");
  flags.String("events", &opts.events, "ZMQ PUB endpoint of the KV events (EVENTS.md)");
  flags.String("events-replay", &opts.events_replay,
               "ZMQ ROUTER endpoint answering event replay requests (empty: none)");
  flags.Uint("events-replay-batches", &replay_batches, "event batches kept for replay");
  flags.String("state-dir", &m.state_dir,
               "directory of the operation log; restores objects and tags at start (empty: "
               "metadata lives in memory only)");
  std::string log_sync = std::string(kvagent::master::LogSyncName(m.log_sync));
  flags.Int("agent-ttl-ms", &m.agent_ttl_ms,
            "an agent silent this long is suspect: no new replicas go to it, reads prefer its "
            "objects' other replicas, its objects stay");
  flags.Int("agent-dead-ms", &m.agent_dead_ms,
            "an agent silent this long is dropped with the objects only it held (0: 12 times "
            "--agent-ttl-ms)");
  flags.Int("lease-ttl-ms", &m.lease_ttl_ms, "read lease granted by BatchGet");
  flags.Int("put-timeout-ms", &m.put_timeout_ms,
            "an unfinished put older than this may be taken over");
  flags.Int("put-release-timeout-ms", &m.put_release_timeout_ms,
            "replicas of a taken-over put are freed this long after it started");
  flags.Int("soft-pin-ttl-ms", &m.soft_pin_ttl_ms, "default soft pin lifetime");
  flags.Double("high-watermark", &m.high_watermark, "pool use that starts eviction (0..1)");
  flags.Double("low-watermark", &m.low_watermark, "pool use eviction brings it down to (0..1)");
  flags.Size("max-part-bytes", &m.max_part_bytes,
             "values larger than this are stored as several parts");
  flags.Int("tick-ms", &tick_ms, "period of expiry, timeout and eviction checks");
  flags.String("log-dir", &log_dir, "write glog files here (default: stderr)");
  flags.String("ready-file", &ready_file,
               "once serving, write the bound endpoints here (rpc=, events=, replay=)");
  flags.String("log-sync", &log_sync,
               "when operation-log records reach the disk before a change is acknowledged: "
               "write (write(2): survives a kvmaster crash) or fsync (also fdatasync(2): "
               "survives a power loss)");
  flags.Size("compact-log-bytes", &m.compact_log_bytes,
             "rewrite the operation log as a snapshot once it exceeds this size and twice its "
             "last snapshot (0: only at start)");
  flags.Bool("truncate-damaged-log", &m.truncate_damaged_log,
             "start even when the operation log is damaged in the middle, keeping the records "
             "before the damage and dropping the rest (default: refuse to start)");
  flags.Size("replication-log-bytes", &m.replication_log_bytes,
             "operation-log records kept for standbys to fetch (0: serve no standby)");
  flags.String("follow", &standby_options.primary,
               "run as a standby of the kvmaster at this endpoint: keep a copy of its state in "
               "--state-dir and serve nothing until promoted by hand (SIGUSR1); for automatic "
               "failover use --etcd");
  flags.String("status-file", &standby_options.status_file,
               "standby: rewrite this file after each fetch (primary=, incarnation=, "
               "applied_seq=)");
  ha.Declare(&flags);
  if (kvagent::Status st = flags.Parse(argc, argv); !st.ok()) {
    std::cerr << "kvmaster: " << st.message() << "\n";
    return 2;
  }
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (auto sync = kvagent::master::ParseLogSync(log_sync); sync.ok()) {
    m.log_sync = *sync;
  } else {
    std::cerr << "kvmaster: " << sync.status().message() << "\n";
    return 2;
  }
  if (kvagent::Status st = kvagent::master::ValidateMasterOptions(m); !st.ok()) {
    std::cerr << "kvmaster: " << st.message() << " (see kvmaster --help)\n";
    return 2;
  }
  opts.tick_ms = static_cast<int>(tick_ms);
  opts.replay_batches = replay_batches;
  standby_options.state_dir = m.state_dir;
  if (!standby_options.primary.empty() && m.state_dir.empty()) {
    std::cerr << "kvmaster: --follow needs --state-dir (the standby keeps the primary's state "
                 "there)\n";
    return 2;
  }
  if (ha.sync_followers < 0 || ha.sync_followers > 16) {
    std::cerr << "kvmaster: --sync-followers must be 0..16\n";
    return 2;
  }
  opts.sync_followers = static_cast<int>(ha.sync_followers);  // also for --follow standbys
  kvagent::master::HaMemberOptions member;
  if (ha.enabled()) {
    member.server = opts;
    member.ready_file = ready_file;
    member.status_file = standby_options.status_file;
    kvagent::Status st = standby_options.primary.empty()
                             ? ha.Apply(&member)
                             : kvagent::InvalidParams("--follow and --etcd exclude each other");
    if (!st.ok()) {
      std::cerr << "kvmaster: " << st.message() << "\n";
      return 2;
    }
  }

  if (log_dir.empty()) {
    FLAGS_logtostderr = true;
  } else {
    FLAGS_log_dir = log_dir;
  }
  google::InitGoogleLogging(argv[0]);

  // Before any thread: they all inherit the mask. SIGUSR1 promotes a standby.
  const kvagent::StopSignals stop_signals(/*also_sigusr1=*/true);
  if (ha.enabled()) return kvagent::master::RunHaMember(std::move(member), stop_signals);
  if (!standby_options.primary.empty()) {
    if (const char* stop = FollowUntilPromoted(standby_options, stop_signals)) {
      LOG(INFO) << "kvmaster standby: " << stop << ", stopped";
      return std::string_view(stop) == "error" ? 1 : 0;
    }
  }

  kvagent::master::SteadyClock clock;
  auto server = kvagent::master::MasterServer::Start(opts, &clock);
  if (!server.ok()) {
    LOG(ERROR) << "kvmaster cannot start: " << server.status().ToString();
    return 1;
  }
  LOG(INFO) << "kvmaster serving: requests on " << server.value()->endpoint() << ", events on "
            << server.value()->events_endpoint() << ", replay on "
            << server.value()->replay_endpoint()
            << (m.state_dir.empty() ? ", no persistence" : ", state in " + m.state_dir)
            << ", heap on " << kvagent::HeapPagesDescription();
  if (!ready_file.empty() && !WriteReadyFile(ready_file, *server.value())) {
    LOG(ERROR) << "cannot write --ready-file " << ready_file;
    return 1;
  }
  const char* stop = stop_signals.Wait();
  while (std::string_view(stop) == "SIGUSR1") {
    LOG(INFO) << "kvmaster: SIGUSR1 ignored: already serving";
    stop = stop_signals.Wait();
  }
  LOG(INFO) << "kvmaster: " << stop << ", shutting down";
  server.value().reset();
  LOG(INFO) << "kvmaster: stopped";
  return 0;
}

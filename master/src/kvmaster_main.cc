// kvmaster: the cluster metadata service and KV-event source (see master_server.h).
//
// Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot start (endpoint in use, bad state dir),
// 2 for a bad flag.
#include <glog/logging.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>

#include "kvagent/common/cluster_auth_flags.h"
#include "kvagent/common/flags.h"
#include "kvagent/common/heap_pages.h"
#include "kvagent/common/metrics.h"
#include "kvagent/common/metrics_http.h"
#include "kvagent/common/stop_signals.h"
#include "kvagent/common/version.h"
#include "kvagent/common/watchdog.h"
#include "kvagent/master/master_flags.h"
#include "kvagent/master/master_server.h"
#include "kvagent/master/standby.h"

namespace {

// What /metrics shows: the master's counters while it serves; while it starts or follows a
// primary as a standby, only whether it is up.
struct MetricsState {
  std::atomic<const kvagent::master::MasterServer*> server{nullptr};
  std::atomic<bool> standby{false};

  std::string Render() const {
    kvagent::metrics::Exposition out;
    out.Gauge("kvmaster_build_info", "the kvmaster release serving these metrics", 1,
              {{"version", kvagent::kVersion}});
    const kvagent::master::MasterServer* s = server.load(std::memory_order_acquire);
    out.Gauge("kvmaster_up", "1 while this kvmaster serves agents", s != nullptr ? 1 : 0);
    out.Gauge("kvmaster_standby", "1 while this kvmaster follows a primary (--follow)",
              standby.load(std::memory_order_relaxed) ? 1 : 0);
    if (s != nullptr) kvagent::master::AppendMasterMetrics(s->StatsSnapshot(), &out);
    return out.Text();
  }
};

// A --log-dir must be a directory this process can create files in.
kvagent::Status CheckLogDir(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return kvagent::InvalidParams("--log-dir " + dir + ": " + std::strerror(errno) +
                                  "; create it or pick another directory");
  }
  if (!S_ISDIR(st.st_mode)) {
    return kvagent::InvalidParams("--log-dir " + dir + " is not a directory");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return kvagent::InvalidParams("--log-dir " + dir + ": " + std::strerror(errno) +
                                  " (kvmaster cannot create log files there)");
  }
  return kvagent::Status::Ok();
}

// Writes the bound endpoints for whoever started us (tests, scripts), atomically.
bool WriteReadyFile(const std::string& path, const kvagent::master::MasterServer& server,
                    const std::string& metrics_url) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "rpc=" << server.endpoint() << "\n"
        << "events=" << server.events_endpoint() << "\n"
        << "replay=" << server.replay_endpoint() << "\n";
    if (!metrics_url.empty()) out << "metrics=" << metrics_url << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Follows the primary until promoted; returns nullptr then, or why the standby stopped instead
// ("SIGTERM", "SIGINT", "error").
const char* FollowUntilPromoted(const kvagent::master::StandbyOptions& options,
                                int64_t promote_after_ms, const kvagent::StopSignals& signals) {
  auto standby = kvagent::master::Standby::Start(options);
  if (!standby.ok()) {
    LOG(ERROR) << "kvmaster standby cannot start: " << standby.status().ToString();
    return "error";
  }
  LOG(INFO) << "kvmaster standby: following " << options.primary << ", its state kept in "
            << options.state_dir << "; promote with SIGUSR1"
            << (promote_after_ms > 0 ? " or after " + std::to_string(promote_after_ms) +
                                           " ms without an answer from the primary"
                                     : std::string());
  // The watchdog is pinged from this loop, which checks the standby every 100 ms.
  kvagent::Watchdog watchdog(kvagent::Watchdog::IntervalFromEnvironment(), [&] {
    return "kvmaster standby of " + options.primary + ": " +
           ((*standby)->synced()
                ? "in sync, applied record " + std::to_string((*standby)->applied_seq())
                : std::string("waiting for the primary's snapshot"));
  });
  kvagent::NotifyServiceManager("READY=1\nSTATUS=kvmaster standby of " + options.primary +
                                ": starting");
  std::string why;
  while (why.empty()) {
    watchdog.Poll(std::chrono::steady_clock::now());
    const char* sig = signals.WaitFor(std::chrono::milliseconds(100));
    const bool synced = (*standby)->synced();
    if (sig != nullptr && std::string_view(sig) != "SIGUSR1") return sig;
    if (sig != nullptr && !synced) {
      LOG(WARNING) << "kvmaster standby: SIGUSR1 ignored: no snapshot of the primary yet, so "
                      "there is no state to serve";
    } else if (sig != nullptr) {
      why = "SIGUSR1";
    } else if (promote_after_ms > 0 && synced &&
               (*standby)->silent_for().count() >= promote_after_ms) {
      why = "the primary has not answered for " + std::to_string((*standby)->silent_for().count()) +
            " ms";
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
  int64_t promote_after_ms = 0;
  std::string metrics_listen;
  int64_t log_max_mb = 100;
  int64_t log_keep_days = 7;
  kvagent::ClusterAuthFlags auth;

  kvagent::FlagSet flags("kvmaster", "cluster metadata service and KV-event source of kvagent");
  flags.String("listen", &opts.listen, "ZMQ ROUTER endpoint for agent requests (master.fbs)");
  flags.String("events", &opts.events, "ZMQ PUB endpoint of the KV events (docs/events.md)");
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
  kvagent::master::DeclareMasterFlags(&flags, &m, /*embedded=*/false);
  flags.Int("tick-ms", &tick_ms, "period of expiry, timeout and eviction checks");
  flags.String("log-dir", &log_dir,
               "write log files here, rotated by --log-max-mb and removed after --log-keep-days "
               "(default: stderr, which systemd's journal keeps)");
  flags.Int("log-max-mb", &log_max_mb, "with --log-dir: start a new log file past this size (MB)");
  flags.Int("log-keep-days", &log_keep_days,
            "with --log-dir: remove log files older than this many days (0: keep them all)");
  flags.String("ready-file", &ready_file,
               "once serving, write the bound endpoints here (rpc=, events=, replay=, metrics=)");
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
  flags.String("metrics-listen", &metrics_listen,
               "serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9479; "
               "default: off)");
  flags.Size("replication-log-bytes", &m.replication_log_bytes,
             "operation-log records kept for standbys to fetch (0: serve no standby)");
  flags.String("follow", &standby_options.primary,
               "run as a standby of the kvmaster at this endpoint: keep a copy of its state in "
               "--state-dir and serve nothing until promoted (SIGUSR1, or --promote-after-ms)");
  flags.Int("promote-after-ms", &promote_after_ms,
            "standby: promote itself once the primary has not answered for this long (0: only "
            "on SIGUSR1)");
  flags.String("status-file", &standby_options.status_file,
               "standby: rewrite this file after each fetch (primary=, incarnation=, "
               "applied_seq=)");
  auth.Declare(&flags);
  if (kvagent::Status st = flags.Parse(argc, argv); !st.ok()) {
    std::cerr << "kvmaster: " << st.message() << "\n";
    return 2;
  }
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (flags.version_requested()) {
    std::cout << "kvmaster " << kvagent::kVersion << "\n";
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
  if (!metrics_listen.empty()) {
    if (kvagent::Status st =
            kvagent::metrics::CheckListenAddress(metrics_listen, "--metrics-listen");
        !st.ok()) {
      std::cerr << "kvmaster: " << st.message() << "\n";
      return 2;
    }
  }
  opts.tick_ms = static_cast<int>(tick_ms);
  opts.replay_batches = replay_batches;
  standby_options.state_dir = m.state_dir;
  if (!standby_options.primary.empty() && m.state_dir.empty()) {
    std::cerr << "kvmaster: --follow needs --state-dir (the standby keeps the primary's state "
                 "there)\n";
    return 2;
  }
  if (promote_after_ms < 0 || (promote_after_ms > 0 && standby_options.primary.empty())) {
    std::cerr << "kvmaster: --promote-after-ms must be >= 0 and goes with --follow\n";
    return 2;
  }
  auto secret = auth.Load();
  if (!secret.ok()) {
    std::cerr << "kvmaster: " << secret.status().message() << "\n";
    return 2;
  }
  for (auto [endpoint, flag] :
       {std::pair{&opts.listen, "--listen"}, std::pair{&opts.events, "--events"},
        std::pair{&opts.events_replay, "--events-replay"},
        std::pair{&standby_options.primary, "--follow"}}) {
    if (kvagent::Status st = auth.CheckEndpoint(*endpoint, flag, secret->has_value()); !st.ok()) {
      std::cerr << "kvmaster: " << st.message() << "\n";
      return 2;
    }
  }
  opts.secret = *secret;
  if (opts.secret) {
    standby_options.curve = opts.secret->CurveKeys(kvagent::KeyPlane::kMasterRpc);
  }

  if (log_max_mb < 1 || log_max_mb > 4095 || log_keep_days < 0) {
    std::cerr << "kvmaster: --log-max-mb must be 1..4095 and --log-keep-days >= 0\n";
    return 2;
  }
  if (!log_dir.empty()) {
    // glog would fall back to other directories (or drop the logs) without a word: a log dir
    // that cannot take files is a configuration error, said at once.
    if (kvagent::Status st = CheckLogDir(log_dir); !st.ok()) {
      std::cerr << "kvmaster: " << st.message() << "\n";
      return 2;
    }
  }
  if (log_dir.empty()) {
    FLAGS_logtostderr = true;
  } else {
    FLAGS_log_dir = log_dir;
    FLAGS_max_log_size = static_cast<uint32_t>(log_max_mb);  // glog starts a new file past it
    FLAGS_stop_logging_if_full_disk = true;
  }
  google::InitGoogleLogging(argv[0]);
  if (!log_dir.empty() && log_keep_days > 0) {
    google::EnableLogCleaner(static_cast<unsigned>(log_keep_days));
  }

  // Before any thread: they all inherit the mask. SIGUSR1 promotes a standby.
  const kvagent::StopSignals stop_signals(/*also_sigusr1=*/true);
  MetricsState metrics_state;
  std::unique_ptr<kvagent::metrics::MetricsHttpServer> metrics_server;
  if (!metrics_listen.empty()) {
    auto started = kvagent::metrics::MetricsHttpServer::Start(
        metrics_listen, [&metrics_state] { return metrics_state.Render(); });
    if (!started.ok()) {
      LOG(ERROR) << "kvmaster cannot start: " << started.status().ToString();
      return 1;
    }
    metrics_server = std::move(*started);
    LOG(INFO) << "kvmaster: metrics on " << metrics_server->url();
  }
  if (!standby_options.primary.empty()) {
    metrics_state.standby.store(true, std::memory_order_relaxed);
    if (const char* stop = FollowUntilPromoted(standby_options, promote_after_ms, stop_signals)) {
      LOG(INFO) << "kvmaster standby: " << stop << ", stopped";
      return std::string_view(stop) == "error" ? 1 : 0;
    }
    metrics_state.standby.store(false, std::memory_order_relaxed);
  }

  kvagent::NotifyServiceManager(
      std::string("STATUS=kvmaster: ") +
      (m.state_dir.empty() ? "starting" : "replaying the operation log in " + m.state_dir));
  opts.watchdog_interval = kvagent::Watchdog::IntervalFromEnvironment();
  kvagent::master::SteadyClock clock;
  auto server = kvagent::master::MasterServer::Start(opts, &clock);
  if (!server.ok()) {
    LOG(ERROR) << "kvmaster cannot start: " << server.status().ToString();
    return 1;
  }
  LOG(INFO) << "kvmaster serving: requests on " << server.value()->endpoint() << ", events on "
            << server.value()->events_endpoint() << ", replay on "
            << server.value()->replay_endpoint()
            << (opts.secret ? ", members only (cluster secret " + opts.secret->Fingerprint() + ")"
                            : std::string(", no authentication (no --cluster-secret-file)"))
            << (m.state_dir.empty() ? ", no persistence" : ", state in " + m.state_dir)
            << ", heap on " << kvagent::HeapPagesDescription();
  metrics_state.server.store(server.value().get(), std::memory_order_release);
  const std::string metrics_url = metrics_server ? metrics_server->url() : "";
  if (!ready_file.empty() && !WriteReadyFile(ready_file, *server.value(), metrics_url)) {
    LOG(ERROR) << "cannot write --ready-file " << ready_file;
    metrics_server.reset();
    return 1;
  }
  kvagent::NotifyServiceManager("READY=1\nSTATUS=kvmaster serving: requests on " +
                                server.value()->endpoint());
  const char* stop = stop_signals.Wait();
  while (std::string_view(stop) == "SIGUSR1") {
    LOG(INFO) << "kvmaster: SIGUSR1 ignored: already serving";
    stop = stop_signals.Wait();
  }
  LOG(INFO) << "kvmaster: " << stop << ", shutting down";
  kvagent::NotifyServiceManager("STOPPING=1");
  metrics_server.reset();  // before the server it reads
  server.value().reset();
  LOG(INFO) << "kvmaster: stopped";
  return 0;
}

// kvmaster: the cluster metadata service and KV-event source (see master_server.h).
//
// main() parses and checks the flags (kvmaster_flags.h), sets up logging and the metrics port,
// then runs one role until SIGTERM or SIGINT: a member of an HA cluster (--etcd, ha_member.h),
// a standby by hand (--follow) until promoted, or the serving master.
//
// Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot start (endpoint in use, bad state dir,
// another kvmaster on the same state dir), 2 for a bad flag.
#include <glog/logging.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>

#include "ha_member.h"
#include "kvagent/common/heap_pages.h"
#include "kvagent/common/metrics.h"
#include "kvagent/common/metrics_http.h"
#include "kvagent/common/process_fds.h"
#include "kvagent/common/stop_signals.h"
#include "kvagent/common/version.h"
#include "kvagent/common/watchdog.h"
#include "kvagent/master/master_server.h"
#include "kvagent/master/standby.h"
#include "kvmaster_flags.h"
#include "state_dir_lock.h"

namespace {

using kvagent::master::KvmasterFlags;

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
    kvagent::AppendFdMetrics(&out);
    return out.Text();
  }
};

// Writes the bound endpoints for whoever started us (tests, scripts), atomically.
bool WriteReadyFile(const std::string& path, const kvagent::master::MasterServer& server,
                    const std::string& metrics_url) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "rpc=" << server.endpoint() << "\n"
        << "events=" << server.events_endpoint() << "\n"
        << "replay=" << server.replay_endpoint() << "\n";
    if (!server.framed_endpoint().empty()) out << "framed=" << server.framed_endpoint() << "\n";
    if (!metrics_url.empty()) out << "metrics=" << metrics_url << "\n";
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
    }
  }
  LOG(INFO) << "kvmaster standby: promoting (" << why << ") at the primary's record "
            << (*standby)->applied_seq();
  return nullptr;
}

// glog to stderr (systemd's journal keeps it) or to rotated files in --log-dir.
void SetUpLogging(const KvmasterFlags& v, const char* argv0) {
  if (v.log_dir.empty()) {
    FLAGS_logtostderr = true;
  } else {
    FLAGS_log_dir = v.log_dir;
    FLAGS_max_log_size = static_cast<uint32_t>(v.log_max_mb);  // glog starts a new file past it
    FLAGS_stop_logging_if_full_disk = true;
    // Every line written at once: glog otherwise holds INFO lines after the first for up to 30 s,
    // which a SIGKILL (the OOM killer) loses and `tail -f` shows late.
    FLAGS_logbuflevel = -1;
  }
  google::InitGoogleLogging(argv0);
  if (!v.log_dir.empty() && v.log_keep_days > 0) {
    google::EnableLogCleaner(static_cast<unsigned>(v.log_keep_days));
  }
}

// Serves agents until SIGTERM or SIGINT; the exit code.
int Serve(KvmasterFlags& v, const kvagent::StopSignals& stop_signals, MetricsState& metrics_state,
          std::unique_ptr<kvagent::metrics::MetricsHttpServer>& metrics_server) {
  const kvagent::master::MasterOptions& m = v.server.master;
  kvagent::NotifyServiceManager(
      std::string("STATUS=kvmaster: ") +
      (m.state_dir.empty() ? "starting" : "replaying the operation log in " + m.state_dir));
  v.server.watchdog_interval = kvagent::Watchdog::IntervalFromEnvironment();
  kvagent::master::SteadyClock clock;
  auto server = kvagent::master::MasterServer::Start(v.server, &clock);
  if (!server.ok()) {
    LOG(ERROR) << "kvmaster cannot start: " << server.status().ToString();
    return 1;
  }
  LOG(INFO) << "kvmaster serving: requests on " << server.value()->endpoint() << ", events on "
            << server.value()->events_endpoint() << ", replay on "
            << server.value()->replay_endpoint()
            << (server.value()->framed_endpoint().empty()
                    ? std::string()
                    : ", framed requests on " + server.value()->framed_endpoint())
            << (v.server.secret
                    ? ", members only (cluster secret " + v.server.secret->Fingerprint() + ")"
                    : std::string(", no authentication (no --cluster-secret-file)"))
            << (m.state_dir.empty() ? ", no persistence" : ", state in " + m.state_dir)
            << ", heap on " << kvagent::HeapPagesDescription();
  metrics_state.server.store(server.value().get(), std::memory_order_release);
  const std::string metrics_url = metrics_server ? metrics_server->url() : "";
  if (!v.ready_file.empty() && !WriteReadyFile(v.ready_file, *server.value(), metrics_url)) {
    LOG(ERROR) << "cannot write --ready-file " << v.ready_file;
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

}  // namespace

int main(int argc, char** argv) {
  kvagent::PreferHugePageHeap(argv);
  kvagent::UseOneMallocArena();
  KvmasterFlags v;
  kvagent::FlagSet flags("kvmaster", "cluster metadata service and KV-event source of kvagent");
  kvagent::master::DeclareKvmasterFlags(flags, v);
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
  if (kvagent::Status st = kvagent::master::CheckKvmasterFlags(v); !st.ok()) {
    std::cerr << "kvmaster: " << st.message() << "\n";
    return 2;
  }
  SetUpLogging(v, argv[0]);
  // One descriptor per agent, event subscriber and replay client: as many as the hard limit lets.
  LOG(INFO) << "kvmaster: " << kvagent::DescribeFdLimit(kvagent::RaiseFdLimit());

  // Before anything reads the state dir; held until the process ends.
  kvagent::UniqueFd state_dir_lock;
  if (const std::string& dir = v.server.master.state_dir; !dir.empty()) {
    auto locked = kvagent::master::LockStateDir(dir);
    if (!locked.ok()) {
      LOG(ERROR) << "kvmaster cannot start: " << locked.status().message();
      return 1;
    }
    state_dir_lock = std::move(*locked);
  }

  // Before any thread: they all inherit the mask. SIGUSR1 promotes a standby.
  const kvagent::StopSignals stop_signals(/*also_sigusr1=*/true);
  const kvagent::FdUseWatch fd_watch("kvmaster");
  MetricsState metrics_state;
  std::unique_ptr<kvagent::metrics::MetricsHttpServer> metrics_server;
  if (!v.metrics_listen.empty()) {
    auto started = kvagent::metrics::MetricsHttpServer::Start(
        v.metrics_listen, [&metrics_state] { return metrics_state.Render(); });
    if (!started.ok()) {
      LOG(ERROR) << "kvmaster cannot start: " << started.status().ToString();
      return 1;
    }
    metrics_server = std::move(*started);
    LOG(INFO) << "kvmaster: metrics on " << metrics_server->url();
  }
  if (v.ha.enabled()) {
    v.member.on_role = [&metrics_state](const kvagent::master::MasterServer* serving,
                                        bool following) {
      metrics_state.standby.store(following, std::memory_order_relaxed);
      metrics_state.server.store(serving, std::memory_order_release);
    };
    const int code = kvagent::master::RunHaMember(std::move(v.member), stop_signals);
    metrics_server.reset();
    return code;
  }
  if (!v.standby.primary.empty()) {
    metrics_state.standby.store(true, std::memory_order_relaxed);
    if (const char* stop = FollowUntilPromoted(v.standby, stop_signals)) {
      LOG(INFO) << "kvmaster standby: " << stop << ", stopped";
      return std::string_view(stop) == "error" ? 1 : 0;
    }
    metrics_state.standby.store(false, std::memory_order_relaxed);
  }
  return Serve(v, stop_signals, metrics_state, metrics_server);
}

#include "kvmaster_flags.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "kvagent/common/errno_text.h"
#include "kvagent/common/host_port.h"
#include "kvagent/common/metrics_http.h"
#include "kvagent/common/watchdog.h"
#include "kvagent/master/master_flags.h"

namespace kvagent::master {
namespace {

// A --log-dir must be a directory this process can create files in.
Status CheckLogDir(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return InvalidParams("--log-dir " + dir + ": " + ErrnoText(errno) +
                         "; create it or pick another directory");
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidParams("--log-dir " + dir + " is not a directory");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return InvalidParams("--log-dir " + dir + ": " + ErrnoText(errno) +
                         " (kvmaster cannot create log files there)");
  }
  return Status::Ok();
}

// --framed-listen auto (the default): the framed transport on --listen's host, on a port the OS
// picks (agents learn it when they register, and the leader key carries it); none when --listen
// is not tcp://HOST:PORT.
void ResolveFramedListen(KvmasterFlags& v) {
  if (v.server.framed_listen != kFramedListenAuto) return;
  auto listen = ParseHostPort(v.server.listen, "--listen", TcpEndpointRules(/*listener=*/true));
  v.server.framed_listen =
      listen.ok() ? "tcp://" + JoinHostPort(listen->host.empty() ? "*" : listen->host, 0) : "";
}

// The cluster secret, and every endpoint allowed only where it (or --insecure-no-auth) permits.
Status CheckAuth(KvmasterFlags& v) {
  auto secret = v.auth.Load();
  if (!secret.ok()) return secret.status();
  for (auto [endpoint, flag] : {std::pair{&v.server.listen, "--listen"},
                                std::pair{&v.server.framed_listen, "--framed-listen"},
                                std::pair{&v.server.events, "--events"},
                                std::pair{&v.server.events_replay, "--events-replay"},
                                std::pair{&v.standby.primary, "--follow"}}) {
    KVAGENT_RETURN_IF_ERROR(v.auth.CheckEndpoint(*endpoint, flag, secret->has_value()));
  }
  v.server.secret = *secret;
  if (v.server.secret) v.standby.curve = v.server.secret->CurveKeys(KeyPlane::kMasterRpc);
  return Status::Ok();
}

// --follow (a standby by hand) or --etcd (an HA member): one of them at most.
Status CheckRole(KvmasterFlags& v) {
  v.standby.state_dir = v.server.master.state_dir;
  if (!v.standby.primary.empty() && v.server.master.state_dir.empty()) {
    return InvalidParams(
        "--follow needs --state-dir (the standby keeps the primary's state there)");
  }
  if (v.ha.sync_followers < 0 || v.ha.sync_followers > 16) {
    return InvalidParams("--sync-followers must be 0..16");
  }
  ResolveFramedListen(v);
  KVAGENT_RETURN_IF_ERROR(CheckAuth(v));
  v.server.sync_followers = static_cast<int>(v.ha.sync_followers);  // also for --follow standbys
  v.server.watchdog_interval = Watchdog::IntervalFromEnvironment();
  if (!v.ha.enabled()) return Status::Ok();
  v.member.server = v.server;  // with the secret: its followers and agents must hold it too
  v.member.ready_file = v.ready_file;
  v.member.status_file = v.standby.status_file;
  if (!v.standby.primary.empty()) return InvalidParams("--follow and --etcd exclude each other");
  return v.ha.Apply(&v.member);
}

Status CheckLogging(const KvmasterFlags& v) {
  if (v.log_max_mb < 1 || v.log_max_mb > 4095 || v.log_keep_days < 0) {
    return InvalidParams("--log-max-mb must be 1..4095 and --log-keep-days >= 0");
  }
  // glog would fall back to other directories (or drop the logs) without a word: a log dir
  // that cannot take files is a configuration error, said at once.
  if (!v.log_dir.empty()) return CheckLogDir(v.log_dir);
  return Status::Ok();
}

}  // namespace

KvmasterFlags::KvmasterFlags() : tick_ms(server.tick_ms), replay_batches(server.replay_batches) {
  server.framed_listen = std::string(kFramedListenAuto);
  server.master.replication_log_bytes = 64ull << 20;
  log_sync = std::string(LogSyncName(server.master.log_sync));
}

void DeclareKvmasterFlags(FlagSet& f, KvmasterFlags& v) {
  f.String("listen", &v.server.listen, "ZMQ ROUTER endpoint for agent requests (master.fbs)");
  f.String("framed-listen", &v.server.framed_listen,
           "tcp://HOST:PORT where the same requests are served as length-prefixed frames on plain "
           "TCP, on the serving thread (docs/protocol.md \"Framed RPC\"); encrypted and "
           "authenticated with --cluster-secret-file. auto: on --listen's host, a port the OS "
           "picks, told to agents when they register; empty: none");
  f.String("events", &v.server.events, "ZMQ PUB endpoint of the KV events (docs/events.md)");
  f.String("events-replay", &v.server.events_replay,
           "ZMQ ROUTER endpoint answering event replay requests (empty: none)");
  f.Uint("events-replay-batches", &v.replay_batches, "event batches kept for replay");
  f.String("state-dir", &v.server.master.state_dir,
           "directory of the operation log; restores objects and tags at start (empty: "
           "metadata lives in memory only)");
  f.Int("agent-ttl-ms", &v.server.master.agent_ttl_ms,
        "an agent silent this long is suspect: no new replicas go to it, reads prefer its "
        "objects' other replicas, its objects stay");
  f.Int("agent-dead-ms", &v.server.master.agent_dead_ms,
        "an agent silent this long is dropped with the objects only it held (0: 12 times "
        "--agent-ttl-ms)");
  DeclareMasterFlags(&f, &v.server.master, /*embedded=*/false);
  f.Int("tick-ms", &v.tick_ms, "period of expiry, timeout and eviction checks");
  f.String("log-dir", &v.log_dir,
           "write log files here, rotated by --log-max-mb and removed after --log-keep-days "
           "(default: stderr, which systemd's journal keeps)");
  f.Int("log-max-mb", &v.log_max_mb, "with --log-dir: start a new log file past this size (MB)");
  f.Int("log-keep-days", &v.log_keep_days,
        "with --log-dir: remove log files older than this many days (0: keep them all)");
  f.String("ready-file", &v.ready_file,
           "once serving, write the bound endpoints here (rpc=, events=, replay=, metrics=)");
  f.String("log-sync", &v.log_sync,
           "when operation-log records reach the disk before a change is acknowledged: "
           "write (write(2): survives a kvmaster crash) or fsync (also fdatasync(2): "
           "survives a power loss)");
  f.Size("compact-log-bytes", &v.server.master.compact_log_bytes,
         "rewrite the operation log as a snapshot once it exceeds this size and twice its "
         "last snapshot (0: only at start)");
  f.Bool("truncate-damaged-log", &v.server.master.truncate_damaged_log,
         "start even when the operation log is damaged in the middle, keeping the records "
         "before the damage and dropping the rest (default: refuse to start)");
  f.String("metrics-listen", &v.metrics_listen,
           "serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9479; "
           "default: off)");
  f.Size("replication-log-bytes", &v.server.master.replication_log_bytes,
         "operation-log records kept for standbys to fetch (0: serve no standby)");
  f.String("follow", &v.standby.primary,
           "run as a standby of the kvmaster at this endpoint: keep a copy of its state in "
           "--state-dir and serve nothing until promoted by hand (SIGUSR1); for automatic "
           "failover use --etcd");
  f.String("status-file", &v.standby.status_file,
           "standby: rewrite this file after each fetch (primary=, epoch=, "
           "applied_seq=, refused_pages=)");
  v.ha.Declare(&f);
  v.auth.Declare(&f);
}

Status CheckKvmasterFlags(KvmasterFlags& v) {
  auto sync = ParseLogSync(v.log_sync);
  if (!sync.ok()) return sync.status();
  v.server.master.log_sync = *sync;
  if (Status st = ValidateMasterOptions(v.server.master); !st.ok()) {
    return Status(st.code(), st.message() + " (see kvmaster --help)");
  }
  if (!v.metrics_listen.empty()) {
    KVAGENT_RETURN_IF_ERROR(metrics::CheckListenAddress(v.metrics_listen, "--metrics-listen"));
  }
  v.server.tick_ms = static_cast<int>(v.tick_ms);
  v.server.replay_batches = v.replay_batches;
  KVAGENT_RETURN_IF_ERROR(CheckRole(v));
  return CheckLogging(v);
}

}  // namespace kvagent::master

#include "agent_flags.h"

#include <unistd.h>

#include <cstdlib>

#include "copy_helpers.h"
#include "kvagent/common/metrics_http.h"
#include "kvagent/coord/cluster_address.h"
#include "kvagent/master_link/remote_master.h"

namespace kvagent::agent {
namespace {

Result<std::vector<uint32_t>> ParseIds(const std::vector<std::string>& texts, const char* flag) {
  std::vector<uint32_t> ids;
  for (const std::string& t : texts) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || v > 0xFFFFFFFFUL) {
      return InvalidParams(std::string(flag) + ": '" + t + "' is not a numeric id");
    }
    ids.push_back(static_cast<uint32_t>(v));
  }
  return ids;
}

// The clients' side: who may attach, how long a handshake may take, the ring service's spin.
Status CheckClientFlags(AgentFlags& v) {
  auto uids = ParseIds(v.allow_uids, "--allow-uid");
  if (!uids.ok()) return uids.status();
  auto gids = ParseIds(v.allow_gids, "--allow-gid");
  if (!gids.ok()) return gids.status();
  if (v.spin_us < 0) return InvalidParams("--spin-us must be >= 0");
  if (v.copy_threads < 0 || v.copy_threads > CopyHelpers::kMaxThreads) {
    return InvalidParams("--copy-threads must be between 0 (automatic) and 64");
  }
  v.agent.allow_uids = *uids;
  v.agent.allow_gids = *gids;
  v.agent.max_clients = static_cast<int>(v.max_clients);
  v.agent.max_clients_per_uid = static_cast<int>(v.max_clients_per_uid);
  v.agent.spin = std::chrono::microseconds(v.spin_us);
  v.agent.handshake_timeout = std::chrono::milliseconds(v.handshake_timeout_ms);
  return Status::Ok();
}

// Standalone (no --master): the embedded master's options and the data server.
Status CheckStandaloneFlags(AgentFlags& v) {
  if (Status st = master::ValidateMasterOptions(v.embedded); !st.ok()) return st;
  // A standalone agent has no peers: unless --data-listen says otherwise it runs no data
  // server at all (a port on loopback would still let any local user read and write the pool).
  if (v.transfer.data_listen == transfer::TransferFlags().data_listen) {
    v.serve_data = false;
  } else if (!IsLocalEndpoint("tcp://" + v.transfer.data_listen) && !v.auth.insecure_no_auth) {
    // Its pool would face the network with nobody who needs it there.
    return InvalidParams(
        "--data-listen " + v.transfer.data_listen +
        " faces the network, but a standalone agent has no peers: leave --data-listen out "
        "(it then runs no data server), or give --master to join a cluster");
  }
  return Status::Ok();
}

// With --master: kvmaster's address, the relay's endpoints, and where the data server listens;
// each endpoint allowed only where the cluster secret (or --insecure-no-auth) permits it.
Status CheckRemoteFlags(AgentFlags& v, bool have_secret) {
  KVAGENT_RETURN_IF_ERROR(master_link::CheckMasterEndpoint(v.master));
  if (v.master_transport != "auto" && v.master_transport != "zmq" &&
      v.master_transport != "framed") {
    return InvalidParams("--master-transport must be auto, zmq or framed, not \"" +
                         v.master_transport + "\"");
  }
  if (v.master_transport == "framed" && v.master.rfind("tcp://", 0) != 0 &&
      !coord::IsClusterAddress(v.master)) {
    return InvalidParams(
        "--master-transport framed needs --master tcp://HOST:PORT (kvmaster's --framed-listen) "
        "or a cluster address (etcd://HOST:PORT/CLUSTER: the leader's framed endpoint)");
  }
  // The relay's endpoints follow from --master unless given.
  auto relay = v.relay.Options(v.agent.run_dir, v.master);
  if (!relay.ok()) return relay.status();
  if (coord::IsClusterAddress(v.master)) {
    // Without a secret the agent goes wherever etcd says the leader is: only an etcd on this
    // host may say it (kvmaster itself then listens on loopback unless --insecure-no-auth).
    auto cluster = coord::ParseClusterAddress(v.master);
    if (!cluster.ok()) return cluster.status();
    KVAGENT_RETURN_IF_ERROR(v.etcd_access.Apply(&*cluster));
    v.cluster = *cluster;
    for (const std::string& etcd : cluster->etcd_endpoints) {
      KVAGENT_RETURN_IF_ERROR(
          v.auth.CheckEndpoint("tcp://" + etcd, "--master " + v.master + ": etcd", have_secret));
    }
  } else {
    KVAGENT_RETURN_IF_ERROR(v.auth.CheckEndpoint(v.master, "--master", have_secret));
  }
  KVAGENT_RETURN_IF_ERROR(
      v.auth.CheckEndpoint(relay->master_events, "--master-events", have_secret));
  KVAGENT_RETURN_IF_ERROR(
      v.auth.CheckEndpoint(relay->master_events_replay, "--master-events-replay", have_secret));
  // The data server: with a secret, peers prove membership (TransferEngineOptions::
  // data_plane_key); without one its pool stays on loopback, like every other plane (the
  // master is on loopback too then, so every peer is on this host).
  if (v.transfer.data_listen == transfer::TransferFlags().data_listen && !have_secret &&
      !v.auth.insecure_no_auth) {
    v.transfer.data_listen = "127.0.0.1:0";
  }
  KVAGENT_RETURN_IF_ERROR(
      v.auth.CheckEndpoint("tcp://" + v.transfer.data_listen, "--data-listen", have_secret));
  return Status::Ok();
}

}  // namespace

void DeclareAgentFlags(FlagSet& f, AgentFlags& v) {
  f.String("run-dir", &v.agent.run_dir,
           "directory for agent.sock and events.sock (created 0755 if missing)");
  f.String("master", &v.master,
           "kvmaster's address, tcp://HOST:PORT; without it the agent runs standalone");
  f.String(
      "master-transport", &v.master_transport,
      "how the agent speaks to kvmaster: auto (framed where kvmaster serves it, which it tells "
      "the agent when it registers over ZMQ; else ZMQ), zmq (its --listen; CurveZMQ with a "
      "cluster secret) or framed (its --framed-listen: length-prefixed frames on TCP, no I/O "
      "thread on either side; encrypted and authenticated with a cluster secret)");
  f.Bool("standalone", &v.standalone,
         "run the master inside the agent (default: yes when --master is not given)");
  f.String("agent-name", &v.agent_name,
           "this agent's stable name at the master (default: <hostname>:<run-dir>)");
  f.Bool("checksums", &v.checksums,
         "take a CRC32C of every value as it is stored and verify it on every read (turn off "
         "only to measure what it costs: a get can then not tell corrupt bytes)");
  f.Int("copy-threads", &v.copy_threads,
        "threads that copy one large value (256 KiB and more) between a client and the pool "
        "together: the service thread and copy-threads - 1 helpers (0: 4, or fewer when this "
        "process may run on fewer CPUs; 1: the service thread alone)");
  f.Size("reserved-write-bytes", &v.reserved_write_bytes,
         "with --master: space the agent keeps reserved at kvmaster for puts of the value sizes "
         "it has seen, so a put takes one master round trip instead of two (0: off)");
  f.Int("heartbeat-ms", &v.heartbeat_ms, "heartbeat period towards kvmaster");
  f.Int("master-timeout-ms", &v.master_timeout_ms,
        "a kvmaster request unanswered this long fails with MASTER_UNAVAILABLE and the link "
        "reconnects");
  f.Int("master-ready-wait-ms", &v.ready_wait_ms,
        "how long start-up waits for kvmaster before serving degraded; -1: as long as "
        "--master-timeout-ms");
  f.Size("max-arena-bytes", &v.agent.max_arena_bytes, "cap on a client's data arena");
  f.Size("ring-bytes", &v.agent.ring_bytes, "default size of each client ring (power of two)");
  f.Size("max-ring-bytes", &v.agent.max_ring_bytes, "cap on a client's requested ring size");
  f.Int("max-clients", &v.max_clients, "clients served at once (1..127)");
  f.Int("max-clients-per-uid", &v.max_clients_per_uid,
        "clients of one uid served at once (0: no cap per uid)");
  f.StringList("allow-uid", &v.allow_uids,
               "uid allowed to attach, in addition to the agent's uid and root (repeatable)");
  f.Bool("process-memory-any-uid", &v.agent.process_memory_any_uid,
         "grant process memory to clients of every allowed uid even when this agent may read any "
         "process (CAP_SYS_PTRACE, e.g. root): only where every allowed user is trusted");
  f.StringList("allow-gid", &v.allow_gids,
               "gid allowed to attach, in addition to the agent's uid and root (repeatable)");
  f.Int("handshake-timeout-ms", &v.handshake_timeout_ms,
        "close a client connection that has not completed its handshake this long");
  f.Int("spin-us", &v.spin_us, "microseconds the ring service spins after the last request");
  f.String("metrics-listen", &v.metrics_listen,
           "serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9478; default: "
           "off)");
  v.transfer.Declare(&f);
  v.relay.Declare(&f);
  // The embedded master's options: the same flags as kvmaster's, declared once.
  master::DeclareMasterFlags(&f, &v.embedded, /*embedded=*/true);
  v.auth.Declare(&f);
  v.etcd_access.Declare(&f);
}

Status CheckAgentFlags(AgentFlags& v) {
  KVAGENT_RETURN_IF_ERROR(CheckClientFlags(v));
  if (!v.metrics_listen.empty()) {
    KVAGENT_RETURN_IF_ERROR(metrics::CheckListenAddress(v.metrics_listen, "--metrics-listen"));
  }
  if (auto group = relay::ResolveEventsGroup(v.relay.events_group); !group.ok()) {
    return group.status();
  }
  if (v.standalone && !v.master.empty()) {
    return InvalidParams("--standalone and --master exclude each other; pick one");
  }
  if (v.heartbeat_ms <= 0 || v.master_timeout_ms <= 0) {
    return InvalidParams("--heartbeat-ms and --master-timeout-ms must be positive");
  }
  if (v.master.empty()) KVAGENT_RETURN_IF_ERROR(CheckStandaloneFlags(v));
  auto secret = v.auth.Load();
  if (!secret.ok()) return secret.status();
  v.secret = std::move(*secret);
  const bool have_secret = v.secret.has_value();
  KVAGENT_RETURN_IF_ERROR(v.auth.CheckEndpoint(v.relay.events_tcp, "--events-tcp", have_secret));
  if (!v.master.empty()) KVAGENT_RETURN_IF_ERROR(CheckRemoteFlags(v, have_secret));
  if (!coord::IsClusterAddress(v.master) && v.etcd_access.given()) {
    coord::ClusterAddress none;  // plain, so Apply says what is wrong
    KVAGENT_RETURN_IF_ERROR(v.etcd_access.Apply(&none));
    return InvalidParams("--etcd-* options are for --master etcd(s)://HOST:PORT/CLUSTER");
  }
  if (v.ready_wait_ms < 0) v.ready_wait_ms = v.master_timeout_ms;
  if (v.agent_name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    v.agent_name = std::string(host) + ":" + v.agent.run_dir;
  }
  if (auto pool = v.transfer.PoolOptions(); !pool.ok()) return pool.status();
  if (auto engine = v.transfer.EngineOptions(); !engine.ok()) return engine.status();
  return Status::Ok();
}

}  // namespace kvagent::agent

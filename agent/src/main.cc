// kvagent: the node agent. Serves SDK clients over shared memory, batches their requests to a
// master — the embedded one (standalone, the default) or kvmaster (--master tcp://HOST:PORT) —
// and moves the bytes between client arenas and the node pools.
//
// Start-up order: flags; the run dir (refused when another agent serves it); the metrics port;
// the node pool mapped; the data plane (its port bound); the master (embedded: registered and
// mounted at once; remote: registered in the background — ready when the link is, or explicitly
// degraded); the event stream (embedded master's publisher, or the relay: its sockets bound);
// only then the pool pre-faulted (EXTEND_TIMEOUT_USEC to systemd meanwhile), so a taken port
// fails start-up at once; then agent.sock. "kvagent ready: ..." and sd_notify(READY=1) come
// last. SIGTERM or SIGINT: STOPPING=1, clean exit 0. Exit 1 when it cannot start, 2 for a bad
// flag.
#include <signal.h>
#include <unistd.h>

#include <glog/logging.h>

#include <cstdio>
#include <future>
#include <iostream>
#include <mutex>
#include <random>

#include "agent_metrics.h"
#include "embedded_master.h"
#include "kvagent/agent/agent.h"
#include "kvagent/common/cluster_auth_flags.h"
#include "kvagent/common/flags.h"
#include "kvagent/common/heap_pages.h"
#include "kvagent/common/metrics_http.h"
#include "kvagent/common/stop_signals.h"
#include "kvagent/common/version.h"
#include "kvagent/common/watchdog.h"
#include "kvagent/coord/cluster_address.h"
#include "kvagent/ipc/unix_socket.h"
#include "kvagent/master/master_flags.h"
#include "kvagent/master_link/remote_master.h"
#include "kvagent/relay/event_relay.h"
#include "kvagent/relay/relay_flags.h"
#include "kvagent/transfer/transfer_flags.h"
#include "request_pipeline.h"

namespace {

using kvagent::Result;
using kvagent::Status;

struct Flags {
  kvagent::agent::AgentConfig agent;
  int64_t max_clients = agent.max_clients;
  int64_t spin_us = agent.spin.count();
  int64_t handshake_timeout_ms = agent.handshake_timeout.count();
  std::vector<std::string> allow_uids;
  std::vector<std::string> allow_gids;
  std::string master;
  bool standalone = false;
  std::string agent_name;
  bool checksums = true;
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
  std::optional<kvagent::ClusterSecret> secret;  // loaded by Check
};

void Declare(kvagent::FlagSet& f, Flags& v) {
  f.String("run-dir", &v.agent.run_dir,
           "directory for agent.sock and events.sock (created 0755 if missing)");
  f.String("master", &v.master,
           "kvmaster's address, tcp://HOST:PORT; without it the agent runs standalone");
  f.Bool("standalone", &v.standalone,
         "run the master inside the agent (default: yes when --master is not given)");
  f.String("agent-name", &v.agent_name,
           "this agent's stable name at the master (default: <hostname>:<run-dir>)");
  f.Bool("checksums", &v.checksums,
         "take a CRC32C of every value as it is stored and verify it on every read (turn off "
         "only to measure what it costs: a get can then not tell corrupt bytes)");
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
  f.StringList("allow-uid", &v.allow_uids,
               "uid allowed to attach, in addition to the agent's uid and root (repeatable)");
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
  kvagent::master::DeclareMasterFlags(&f, &v.embedded, /*embedded=*/true);
  v.auth.Declare(&f);
}

Result<std::vector<uint32_t>> ParseIds(const std::vector<std::string>& texts, const char* flag) {
  std::vector<uint32_t> ids;
  for (const std::string& t : texts) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || v > 0xFFFFFFFFUL) {
      return kvagent::InvalidParams(std::string(flag) + ": '" + t + "' is not a numeric id");
    }
    ids.push_back(static_cast<uint32_t>(v));
  }
  return ids;
}

Status Check(Flags& v) {
  auto uids = ParseIds(v.allow_uids, "--allow-uid");
  if (!uids.ok()) return uids.status();
  auto gids = ParseIds(v.allow_gids, "--allow-gid");
  if (!gids.ok()) return gids.status();
  if (v.spin_us < 0) return kvagent::InvalidParams("--spin-us must be >= 0");
  if (!v.metrics_listen.empty()) {
    KVAGENT_RETURN_IF_ERROR(
        kvagent::metrics::CheckListenAddress(v.metrics_listen, "--metrics-listen"));
  }
  if (auto group = kvagent::relay::ResolveEventsGroup(v.relay.events_group); !group.ok()) {
    return group.status();
  }
  if (v.standalone && !v.master.empty()) {
    return kvagent::InvalidParams("--standalone and --master exclude each other; pick one");
  }
  if (v.heartbeat_ms <= 0 || v.master_timeout_ms <= 0) {
    return kvagent::InvalidParams("--heartbeat-ms and --master-timeout-ms must be positive");
  }
  if (v.master.empty()) {
    if (Status st = kvagent::master::ValidateMasterOptions(v.embedded); !st.ok()) return st;
    // A standalone agent has no peers: unless --data-listen says otherwise it runs no data
    // server at all (a port on loopback would still let any local user read and write the pool).
    if (v.transfer.data_listen == kvagent::transfer::TransferFlags().data_listen) {
      v.serve_data = false;
    } else if (!kvagent::IsLocalEndpoint("tcp://" + v.transfer.data_listen) &&
               !v.auth.insecure_no_auth) {
      // Its pool would face the network with nobody who needs it there.
      return kvagent::InvalidParams(
          "--data-listen " + v.transfer.data_listen +
          " faces the network, but a standalone agent has no peers: leave --data-listen out "
          "(it then runs no data server), or give --master to join a cluster");
    }
  }
  auto secret = v.auth.Load();
  if (!secret.ok()) return secret.status();
  v.secret = std::move(*secret);
  const bool have_secret = v.secret.has_value();
  KVAGENT_RETURN_IF_ERROR(v.auth.CheckEndpoint(v.relay.events_tcp, "--events-tcp", have_secret));
  if (!v.master.empty()) {
    KVAGENT_RETURN_IF_ERROR(kvagent::master_link::CheckMasterEndpoint(v.master));
    // The relay's endpoints follow from --master unless given.
    auto relay = v.relay.Options(v.agent.run_dir, v.master);
    if (!relay.ok()) return relay.status();
    if (kvagent::coord::IsClusterAddress(v.master)) {
      // Without a secret the agent goes wherever etcd says the leader is: only an etcd on this
      // host may say it (kvmaster itself then listens on loopback unless --insecure-no-auth).
      auto cluster = kvagent::coord::ParseClusterAddress(v.master);
      if (!cluster.ok()) return cluster.status();
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
    if (v.transfer.data_listen == kvagent::transfer::TransferFlags().data_listen && !have_secret &&
        !v.auth.insecure_no_auth) {
      v.transfer.data_listen = "127.0.0.1:0";
    }
    KVAGENT_RETURN_IF_ERROR(
        v.auth.CheckEndpoint("tcp://" + v.transfer.data_listen, "--data-listen", have_secret));
  }
  v.agent.allow_uids = *uids;
  v.agent.allow_gids = *gids;
  v.agent.max_clients = static_cast<int>(v.max_clients);
  v.agent.spin = std::chrono::microseconds(v.spin_us);
  v.agent.handshake_timeout = std::chrono::milliseconds(v.handshake_timeout_ms);
  if (v.ready_wait_ms < 0) v.ready_wait_ms = v.master_timeout_ms;
  if (v.agent_name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    v.agent_name = std::string(host) + ":" + v.agent.run_dir;
  }
  return Status::Ok();
}

uint64_t NewIncarnation() {
  std::random_device rd;
  return ((uint64_t{rd()} << 32) | rd()) | 1;  // never 0
}

// The event relay's content source: the master's ListKeys through the link, each object as the
// BlockStored the master published for it (its writer's block metadata, or hashes from the key).
kvagent::relay::ContentSource ContentThrough(kvagent::master_link::RemoteMaster* link) {
  return [link](uint64_t cursor) -> Result<kvagent::relay::ContentPage> {
    auto page = link->ListKeys(cursor, 1000);
    if (!page.ok()) return page.status();
    kvagent::relay::ContentPage out;
    out.next_cursor = page->next_cursor;
    out.restarted = page->restarted;
    out.objects.reserve(page->keys.size());
    for (auto& k : page->keys) {
      out.objects.push_back(
          kvagent::events::StoredEventFor(k.key, k.session_id, std::move(k.block)));
    }
    return out;
  };
}

// With --master etcd://...: the leader's event endpoints reach the relay as the link finds each
// leader, also the ones found before the relay started (Attach).
struct RelayToLeader {
  std::mutex mu;
  kvagent::relay::EventRelay* relay = nullptr;  // guarded by mu
  std::string events, replay;                   // the leader's, guarded by mu
  void Leader(const std::string& e, const std::string& r) {
    std::lock_guard<std::mutex> lock(mu);
    events = e;
    replay = r;
    if (relay != nullptr) relay->SwitchMaster(e, r);
  }
  void Attach(kvagent::relay::EventRelay* r) {
    std::lock_guard<std::mutex> lock(mu);
    relay = r;
    if (r != nullptr && !events.empty()) r->SwitchMaster(events, replay);
  }
};

// "agent.relay.*": what `kvctl stat` shows of the event relay (remote mode).
void AppendRelayCounters(const kvagent::relay::EventRelay& relay,
                         std::vector<kvagent::agent::Counter>* out) {
  const kvagent::relay::EventRelayStats s = relay.stats();
  out->push_back({"agent.relay.phase", 0, std::string(kvagent::relay::RelayPhaseName(s.phase))});
  const std::pair<const char*, uint64_t> counters[] = {
      {"next_seq", s.next_seq},
      {"relayed_batches", s.relayed_batches},
      {"repaired_gaps", s.repaired_gaps},
      {"unrepaired_gaps", s.unrepaired_gaps},
      {"missing_batches", s.missing_batches},
      {"resets", s.resets},
      {"reannounces", s.reannounces},
      {"objects_reannounced", s.objects_reannounced},
      {"clearing_reannounces", s.clearing_reannounces},
      {"objects_removed", s.objects_removed},
      {"indexed_objects", s.indexed_objects},
      {"dropped_events", s.dropped_events},
      {"malformed_messages", s.malformed_messages},
      {"master_switches", s.master_switches},
  };
  for (const auto& [name, value] : counters) {
    out->push_back({std::string("agent.relay.") + name, value, ""});
  }
}

}  // namespace

int main(int argc, char** argv) {
  kvagent::PreferHugePageHeap(argv);
  Flags v;
  kvagent::FlagSet flags("kvagent",
                         "the kvagent node agent: serves SDK clients on <run-dir>/agent.sock");
  Declare(flags, v);
  Status parsed = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (flags.version_requested()) {
    std::cout << "kvagent " << kvagent::kVersion << "\n";
    return 0;
  }
  if (parsed.ok()) parsed = Check(v);
  auto pool_options = v.transfer.PoolOptions();
  auto engine_options = v.transfer.EngineOptions();
  if (parsed.ok() && !pool_options.ok()) parsed = pool_options.status();
  if (parsed.ok() && !engine_options.ok()) parsed = engine_options.status();
  if (!parsed.ok()) {
    std::cerr << "kvagent: " << parsed.message() << "\n";
    return 2;
  }

  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  const kvagent::StopSignals stop_signals;  // before any thread: they all inherit the mask
  auto fail = [](const std::string& what, const Status& st) {
    LOG(ERROR) << "kvagent cannot start: " << what << ": " << st.ToString();
    return 1;
  };

  // Another agent on this run dir would lose its event sockets to us (an ipc bind replaces the
  // file) before we found agent.sock taken: refuse first, before pre-faulting the pool.
  if (kvagent::ipc::ConnectUnix(v.agent.SocketPath()).ok()) {
    return fail("run dir", kvagent::InvalidParams("another kvagent serves " + v.agent.SocketPath() +
                                                  "; stop it or pick another --run-dir"));
  }
  // /metrics answers from the start (kvagent_up 0) and in full once the agent serves.
  std::atomic<const kvagent::agent::MetricsSources*> metrics_sources{nullptr};
  kvagent::agent::MetricsSources sources;
  std::unique_ptr<kvagent::metrics::MetricsHttpServer> metrics_server;
  if (!v.metrics_listen.empty()) {
    auto started = kvagent::metrics::MetricsHttpServer::Start(v.metrics_listen, [&metrics_sources] {
      return kvagent::agent::RenderAgentMetrics(metrics_sources.load(std::memory_order_acquire));
    });
    if (!started.ok()) return fail("metrics", started.status());
    metrics_server = std::move(*started);
  }
  const std::string metrics_url = metrics_server ? metrics_server->url() : "";

  if (Status st = kvagent::agent::MakeRunDir(v.agent.run_dir); !st.ok()) {
    return fail("run dir", st);
  }
  // Every port is bound (data plane, event sockets, --events-tcp, metrics) before the pool is
  // pre-faulted, so that a taken port is reported at once, not after minutes of pre-faulting a
  // large pool. The mapping itself touches no page yet.
  auto pool = kvagent::transfer::NodePool::Map(*pool_options);
  if (!pool.ok()) return fail("node pool", pool.status());
  const uint64_t incarnation = NewIncarnation();
  // The pool's fence: which data-plane ops may still touch it (pool incarnation, master epoch,
  // abandoned writes). It outlives the engine and the pipeline that consult it.
  auto fence = std::make_unique<kvagent::transfer::PoolFence>(incarnation);
  engine_options->fence = fence.get();
  engine_options->serve = v.serve_data;
  if (v.secret) {
    engine_options->data_plane_key = v.secret->MacKey(kvagent::KeyPlane::kDataPlaneMac);
  }
  auto engine = kvagent::transfer::TransferEngine::Create(**pool, *engine_options);
  if (!engine.ok()) return fail("data plane", engine.status());

  std::unique_ptr<kvagent::agent::MasterPort> port;
  kvagent::master_link::RemoteMaster* link = nullptr;
  std::unique_ptr<kvagent::relay::EventRelay> relay;
  // The relay, for the link's re-registration hook; cleared before the relay goes.
  auto relay_slot = std::make_shared<std::atomic<kvagent::relay::EventRelay*>>(nullptr);
  auto relay_to_leader = std::make_shared<RelayToLeader>();
  std::string mode;
  std::string events;
  kvagent::agent::EmbeddedMaster* embedded_master = nullptr;
  if (v.master.empty()) {
    kvagent::agent::EmbeddedMasterOptions o;
    o.master = v.embedded;
    o.agent_name = v.agent_name;
    o.incarnation = incarnation;
    o.pool_bytes = (*pool)->size();
    o.data_endpoint = (*engine)->endpoint();
    o.events.endpoint = "ipc://" + v.agent.run_dir + "/events.sock";
    o.events.replay_endpoint = "ipc://" + v.agent.run_dir + "/events-replay.sock";
    o.fence = fence.get();
    if (!v.relay.events_tcp.empty()) o.events.extra_endpoints.push_back(v.relay.events_tcp);
    auto group = kvagent::relay::ResolveEventsGroup(v.relay.events_group);
    if (!group.ok()) return fail("event sockets", group.status());
    o.events.ipc_group = *group;
    if (v.secret) o.events.curve = v.secret->CurveKeys(kvagent::KeyPlane::kEvents);
    auto embedded = kvagent::agent::EmbeddedMaster::Start(std::move(o));
    if (!embedded.ok()) return fail("embedded master", embedded.status());
    events = (*embedded)->events_endpoint();
    for (const std::string& e : (*embedded)->extra_endpoints()) events += " and " + e;
    mode = "standalone";
    embedded_master = embedded->get();
    port = std::move(*embedded);
  } else {
    kvagent::master_link::RemoteMasterOptions o;
    o.endpoint = v.master;
    o.agent_name = v.agent_name;
    o.incarnation = incarnation;
    o.pool_bytes = (*pool)->size();
    o.data_endpoint = (*engine)->endpoint();
    o.heartbeat = std::chrono::milliseconds(v.heartbeat_ms);
    o.timeout = std::chrono::milliseconds(v.master_timeout_ms);
    // Fences reach the pool from the link thread; each is in force (local copies waited for,
    // payloads arriving for a fenced write cut off) before the link acknowledges it.
    auto refence = [engine = engine->get()] {
      std::promise<void> done;
      engine->Refence([&done] { done.set_value(); });
      done.get_future().wait();
    };
    o.set_master_epoch = [fence = fence.get(), refence](uint64_t epoch) {
      fence->SetEpoch(epoch);
      refence();
    };
    o.apply_fences = [fence = fence.get(), refence](const kvagent::master_link::Fences& f) {
      if (fence->Apply(f.master_epoch, f.write_watermark, f.fenced_writes)) refence();
    };
    // The link only calls it after a re-registration (a master that restarted or forgot us).
    o.on_master_restarted = [relay_slot] {
      if (auto* r = relay_slot->load()) r->RequestResync();
    };
    o.on_leader_changed = [relay_to_leader](const std::string& e, const std::string& r) {
      relay_to_leader->Leader(e, r);
    };
    if (v.secret) o.curve = v.secret->CurveKeys(kvagent::KeyPlane::kMasterRpc);
    auto remote = kvagent::master_link::RemoteMaster::Start(std::move(o));
    if (!remote.ok()) return fail("master link", remote.status());
    link = remote->get();
    auto relay_options = v.relay.Options(v.agent.run_dir, v.master);
    if (!relay_options.ok()) return fail("event relay", relay_options.status());
    relay_options->list_content = ContentThrough(link);
    if (relay_options->master_events.empty() && !relay_options->await_master) {  // kvmaster says
      relay_options->master_endpoints =
          [link, master = v.master]() -> std::optional<std::pair<std::string, std::string>> {
        auto e = link->EventEndpoints();
        if (!e) return std::nullopt;
        return std::pair{kvagent::relay::ResolveAdvertised(e->first, master),
                         e->second.empty() ? std::string()
                                           : kvagent::relay::ResolveAdvertised(e->second, master)};
      };
    }
    if (v.secret) relay_options->curve = v.secret->CurveKeys(kvagent::KeyPlane::kEvents);
    auto started = kvagent::relay::EventRelay::Start(std::move(*relay_options));
    if (!started.ok()) return fail("event relay", started.status());
    relay = std::move(*started);
    relay_slot->store(relay.get());
    relay_to_leader->Attach(relay.get());
    events = relay->endpoint();
    for (const std::string& e : relay->extra_endpoints()) events += " and " + e;
    mode = "kvmaster " + v.master;
    if (!link->WaitReady(std::chrono::milliseconds(v.ready_wait_ms))) {
      LOG(WARNING) << "kvagent: kvmaster " << v.master << " is not reachable yet ("
                   << link->Describe()
                   << "); serving degraded: requests fail with MASTER_UNAVAILABLE until the "
                      "link is up (it keeps retrying)";
      mode += " (degraded: not reachable yet)";
    }
    port = std::move(*remote);
  }

  // Now the long part: fault every page of the pool in, telling systemd that start-up goes on
  // (EXTEND_TIMEOUT_USEC: a 64 GiB pool must not trip the unit's start timeout) and how far.
  const Status prefaulted = (*pool)->Prefault([](uint64_t done, uint64_t total) {
    kvagent::NotifyServiceManager(
        "EXTEND_TIMEOUT_USEC=60000000\nSTATUS=kvagent: pre-faulting "
        "the node pool: " +
        kvagent::FormatBytes(done) + " of " + kvagent::FormatBytes(total));
  });
  if (!prefaulted.ok()) return fail("node pool", prefaulted);

  if (!v.checksums) {
    LOG(WARNING) << "kvagent: --checksums=false: values are stored and read without checksums; "
                    "a get cannot tell corrupt bytes (for measuring their cost only)";
  }
  auto pipeline = std::make_unique<kvagent::agent::RequestPipeline>(
      std::move(port), pool->get(), engine->get(), fence.get(), v.checksums);
  if (!v.master.empty() && v.reserved_write_bytes > 0) {
    kvagent::agent::WriteReservations::Options reserved;
    reserved.budget_bytes = v.reserved_write_bytes;
    pipeline->EnableReservedWrites(reserved);
  }
  pipeline->set_extra_counters(
      [relay_slot, metrics_url](std::vector<kvagent::agent::Counter>* out) {
        if (const kvagent::relay::EventRelay* r = relay_slot->load()) AppendRelayCounters(*r, out);
        if (!metrics_url.empty()) out->push_back({"agent.metrics_endpoint", 0, metrics_url});
      });
  const kvagent::agent::RequestPipeline* pipeline_view = pipeline.get();
  // systemd's watchdog (WatchdogSec=): pinged from the ring-service thread, with a status line.
  v.agent.watchdog_interval = kvagent::Watchdog::IntervalFromEnvironment();
  v.agent.watchdog_status = [pipeline_view] { return "kvagent " + pipeline_view->StatusLine(); };
  auto agent = kvagent::agent::Agent::Start(v.agent, std::move(pipeline));
  if (!agent.ok()) return fail("agent", agent.status());
  sources = {pipeline_view, agent->get(), engine->get(), embedded_master};
  metrics_sources.store(&sources, std::memory_order_release);

  const std::string status =
      "kvagent ready: " + mode + ", pool " + kvagent::FormatBytes((*pool)->size()) + " (" +
      std::string(kvagent::transfer::PoolPagesName((*pool)->pages())) + "), data " +
      (*engine)->endpoint() + ", events " + events + ", clients on " + v.agent.SocketPath() +
      ", heap on " + kvagent::HeapPagesDescription() +
      (metrics_url.empty() ? "" : ", metrics " + metrics_url) +
      (v.secret ? ", cluster secret " + v.secret->Fingerprint() : std::string());
  LOG(INFO) << status;
  kvagent::NotifyServiceManager("READY=1\nSTATUS=" + status);

  const char* signal_name = stop_signals.Wait();
  kvagent::NotifyServiceManager("STOPPING=1");
  LOG(INFO) << "received " << signal_name << "; shutting down";
  metrics_server.reset();  // before what it reads
  (*agent)->Stop();        // the service thread stops the master link too
  relay_slot->store(nullptr);
  relay_to_leader->Attach(nullptr);
  relay.reset();   // before the link its content source reads through
  agent->reset();  // the pipeline and its master port
  engine->reset();
  fence.reset();
  pool->reset();
  return 0;
}

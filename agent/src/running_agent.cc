#include "running_agent.h"

#include <glog/logging.h>
#include <sched.h>

#include <algorithm>
#include <future>
#include <mutex>
#include <random>

#include "agent_key_file.h"
#include "kvagent/common/checksum.h"
#include "kvagent/common/format.h"
#include "kvagent/common/frame_cipher.h"
#include "kvagent/common/heap_pages.h"
#include "kvagent/common/process_fds.h"
#include "kvagent/common/watchdog.h"
#include "kvagent/ipc/unix_socket.h"
#include "request_pipeline.h"

namespace kvagent::agent {
namespace {

uint64_t NewIncarnation() {
  std::random_device rd;
  return ((uint64_t{rd()} << 32) | rd()) | 1;  // never 0
}

// --copy-threads 0: four threads copy a large value, or as many CPUs as this process may use.
unsigned CopyThreads(int64_t flag) {
  if (flag > 0) return static_cast<unsigned>(flag);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int usable = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  return static_cast<unsigned>(std::clamp(usable, 1, 4));
}

// The event relay's content source: the master's ListKeys through the link, each object as the
// BlockStored the master published for it (its writer's block metadata, or hashes from the key).
relay::ContentSource ContentThrough(master_link::RemoteMaster* link) {
  return [link](uint64_t cursor) -> Result<relay::ContentPage> {
    auto page = link->ListKeys(cursor, 1000);
    if (!page.ok()) return page.status();
    relay::ContentPage out;
    out.next_cursor = page->next_cursor;
    out.restarted = page->restarted;
    out.objects.reserve(page->keys.size());
    for (auto& k : page->keys) {
      out.objects.push_back(events::StoredEventFor(k.key, k.session_id, std::move(k.block)));
    }
    return out;
  };
}

// "agent.relay.*": what `kvctl stat` shows of the event relay (remote mode).
void AppendRelayCounters(const relay::EventRelay& relay, std::vector<agent::Counter>* out) {
  const relay::EventRelayStats s = relay.stats();
  out->push_back({"agent.relay.phase", 0, std::string(relay::RelayPhaseName(s.phase))});
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
      {"unreadable_batches", s.unreadable_batches},
      {"master_switches", s.master_switches},
  };
  for (const auto& [name, value] : counters) {
    out->push_back({std::string("agent.relay.") + name, value, ""});
  }
}

}  // namespace

// With --master etcd://...: the leader's event endpoints reach the relay as the link finds each
// leader, also the ones found before the relay started (Attach).
struct RelayToLeader {
  std::mutex mu;
  relay::EventRelay* relay = nullptr;  // guarded by mu
  std::string events, replay;          // the leader's, guarded by mu
  void Leader(const std::string& e, const std::string& r) {
    std::lock_guard<std::mutex> lock(mu);
    events = e;
    replay = r;
    if (relay != nullptr) relay->SwitchMaster(e, r);
  }
  void Attach(relay::EventRelay* r) {
    std::lock_guard<std::mutex> lock(mu);
    relay = r;
    if (r != nullptr && !events.empty()) r->SwitchMaster(events, replay);
  }
};

RunningAgent::RunningAgent(AgentFlags& flags)
    : v_(flags),
      relay_slot_(std::make_shared<std::atomic<relay::EventRelay*>>(nullptr)),
      relay_to_leader_(std::make_shared<RelayToLeader>()) {}

RunningAgent::~RunningAgent() { Stop(); }

bool RunningAgent::Fail(const std::string& step, const Status& status) {
  LOG(ERROR) << "kvagent cannot start: " << step << ": " << status.ToString();
  return false;
}

bool RunningAgent::Start() {
  return RefuseTakenRunDir() && StartMetrics() && StartDataPlane() &&
         (v_.master.empty() ? StartEmbeddedMaster() : StartMasterLink() && StartRelay()) &&
         PrefaultPool() && StartServing();
}

// Another agent on this run dir would lose its event sockets to us (an ipc bind replaces the
// file) before we found agent.sock taken: refuse first, before pre-faulting the pool.
bool RunningAgent::RefuseTakenRunDir() {
  if (ipc::ConnectUnix(v_.agent.SocketPath()).ok()) {
    return Fail("run dir", InvalidParams("another kvagent serves " + v_.agent.SocketPath() +
                                         "; stop it or pick another --run-dir"));
  }
  return true;
}

bool RunningAgent::StartMetrics() {
  if (!v_.metrics_listen.empty()) {
    auto started = metrics::MetricsHttpServer::Start(v_.metrics_listen, [this] {
      metrics::Exposition fds;
      AppendFdMetrics(&fds);
      return RenderAgentMetrics(metrics_sources_.load(std::memory_order_acquire)) + fds.Text();
    });
    if (!started.ok()) return Fail("metrics", started.status());
    metrics_server_ = std::move(*started);
    metrics_url_ = metrics_server_->url();
  }
  return true;
}

// The run dir, the pool mapped (no page touched yet: every port is bound before the pool is
// pre-faulted, so that a taken port is reported at once, not after minutes of pre-faulting a
// large pool), its fence and the data plane.
bool RunningAgent::StartDataPlane() {
  if (Status st = MakeRunDir(v_.agent.run_dir); !st.ok()) return Fail("run dir", st);
  auto pool_options = v_.transfer.PoolOptions();
  auto engine_options = v_.transfer.EngineOptions();
  // CheckAgentFlags checked both.
  if (!pool_options.ok()) return Fail("node pool", pool_options.status());
  if (!engine_options.ok()) return Fail("data plane", engine_options.status());
  auto pool = transfer::NodePool::Map(*pool_options);
  if (!pool.ok()) return Fail("node pool", pool.status());
  pool_ = std::move(*pool);
  incarnation_ = NewIncarnation();
  auto key = LoadOrCreateAgentKey(v_.agent.run_dir);
  if (!key.ok()) return Fail("agent key", key.status());
  agent_key_ = key->value;
  if (!key->unsaved.empty()) {
    LOG(WARNING) << key->unsaved
                 << "; this agent's key lives in this process only: kvmaster will take its next "
                    "start for another agent until this one is silent for the agent TTL";
  }
  fence_ = std::make_unique<transfer::PoolFence>(incarnation_);
  engine_options->fence = fence_.get();
  engine_options->serve = v_.serve_data;
  if (v_.secret) engine_options->data_plane_key = v_.secret->MacKey(KeyPlane::kDataPlaneMac);
  auto engine = transfer::TransferEngine::Create(*pool_, *engine_options);
  if (!engine.ok()) return Fail("data plane", engine.status());
  engine_ = std::move(*engine);
  return true;
}

bool RunningAgent::StartEmbeddedMaster() {
  EmbeddedMasterOptions o;
  o.master = v_.embedded;
  o.agent_name = v_.agent_name;
  o.incarnation = incarnation_;
  o.agent_key = agent_key_;
  o.pool_bytes = pool_->size();
  o.data_endpoint = engine_->endpoint();
  o.events.endpoint = "ipc://" + v_.agent.run_dir + "/events.sock";
  o.events.replay_endpoint = "ipc://" + v_.agent.run_dir + "/events-replay.sock";
  o.fence = fence_.get();
  if (!v_.relay.events_tcp.empty()) o.events.extra_endpoints.push_back(v_.relay.events_tcp);
  auto group = relay::ResolveEventsGroup(v_.relay.events_group);
  if (!group.ok()) return Fail("event sockets", group.status());
  o.events.ipc_group = *group;
  if (v_.secret) o.events.curve = v_.secret->CurveKeys(KeyPlane::kEvents);
  auto embedded = EmbeddedMaster::Start(std::move(o));
  if (!embedded.ok()) return Fail("embedded master", embedded.status());
  events_ = (*embedded)->events_endpoint();
  for (const std::string& e : (*embedded)->extra_endpoints()) events_ += " and " + e;
  mode_ = "standalone";
  embedded_master_ = embedded->get();
  port_ = std::move(*embedded);
  return true;
}

bool RunningAgent::StartMasterLink() {
  master_link::RemoteMasterOptions o;
  o.endpoint = v_.master;
  o.cluster = v_.cluster;
  o.transport = v_.master_transport == "framed" ? master_link::MasterTransport::kFramed
                : v_.master_transport == "zmq"  ? master_link::MasterTransport::kZmq
                                                : master_link::MasterTransport::kAuto;
  o.agent_name = v_.agent_name;
  o.incarnation = incarnation_;
  o.agent_key = agent_key_;
  o.pool_bytes = pool_->size();
  o.data_endpoint = engine_->endpoint();
  o.heartbeat = std::chrono::milliseconds(v_.heartbeat_ms);
  o.timeout = std::chrono::milliseconds(v_.master_timeout_ms);
  // Fences reach the pool from the link thread; each is in force (local copies waited for,
  // payloads arriving for a fenced write cut off) before the link acknowledges it.
  auto refence = [engine = engine_.get()] {
    std::promise<void> done;
    engine->Refence([&done] { done.set_value(); });
    done.get_future().wait();
  };
  o.set_master_epoch = [fence = fence_.get(), refence](uint64_t epoch) {
    fence->SetEpoch(epoch);
    refence();
  };
  o.apply_fences = [fence = fence_.get(), refence](const master_link::Fences& f) {
    if (fence->Apply(f.master_epoch, f.write_watermark, f.fenced_writes)) refence();
  };
  // The link only calls it after a re-registration (a master that restarted or forgot us).
  o.on_master_restarted = [slot = relay_slot_] {
    if (auto* r = slot->load()) r->RequestResync();
  };
  o.on_leader_changed = [to_leader = relay_to_leader_](const std::string& e, const std::string& r) {
    to_leader->Leader(e, r);
  };
  if (v_.secret && o.transport != master_link::MasterTransport::kZmq) {
    o.framed_key = FramedRpcKey(*v_.secret);
  }
  if (v_.secret && o.transport != master_link::MasterTransport::kFramed) {
    o.curve = v_.secret->CurveKeys(KeyPlane::kMasterRpc);
  }
  auto remote = master_link::RemoteMaster::Start(std::move(o));
  if (!remote.ok()) return Fail("master link", remote.status());
  link_ = remote->get();
  port_ = std::move(*remote);
  return true;
}

bool RunningAgent::StartRelay() {
  auto relay_options = v_.relay.Options(v_.agent.run_dir, v_.master);
  if (!relay_options.ok()) return Fail("event relay", relay_options.status());
  relay_options->list_content = ContentThrough(link_);
  if (relay_options->master_events.empty() && !relay_options->await_master) {  // kvmaster says
    relay_options->master_endpoints =
        [link = link_, master = v_.master]() -> std::optional<std::pair<std::string, std::string>> {
      auto e = link->EventEndpoints();
      if (!e) return std::nullopt;
      return std::pair{
          relay::ResolveAdvertised(e->first, master),
          e->second.empty() ? std::string() : relay::ResolveAdvertised(e->second, master)};
    };
  }
  if (v_.secret) relay_options->curve = v_.secret->CurveKeys(KeyPlane::kEvents);
  auto started = relay::EventRelay::Start(std::move(*relay_options));
  if (!started.ok()) return Fail("event relay", started.status());
  relay_ = std::move(*started);
  relay_slot_->store(relay_.get());
  relay_to_leader_->Attach(relay_.get());
  events_ = relay_->endpoint();
  for (const std::string& e : relay_->extra_endpoints()) events_ += " and " + e;
  mode_ = "kvmaster " + v_.master;
  if (!link_->WaitReady(std::chrono::milliseconds(v_.ready_wait_ms))) {
    LOG(WARNING) << "kvagent: kvmaster " << v_.master << " is not reachable yet ("
                 << link_->Describe()
                 << "); serving degraded: requests fail with MASTER_UNAVAILABLE until the "
                    "link is up (it keeps retrying)";
    mode_ += " (degraded: not reachable yet)";
  }
  return true;
}

// Now the long part: fault every page of the pool in, telling systemd that start-up goes on
// (EXTEND_TIMEOUT_USEC: a 64 GiB pool must not trip the unit's start timeout) and how far.
bool RunningAgent::PrefaultPool() {
  const Status prefaulted = pool_->Prefault([](uint64_t done, uint64_t total) {
    NotifyServiceManager(
        "EXTEND_TIMEOUT_USEC=60000000\nSTATUS=kvagent: pre-faulting "
        "the node pool: " +
        FormatBytes(done) + " of " + FormatBytes(total));
  });
  if (!prefaulted.ok()) return Fail("node pool", prefaulted);
  return true;
}

// The request pipeline over the master port, and agent.sock.
bool RunningAgent::StartServing() {
  if (!v_.checksums) {
    LOG(WARNING) << "kvagent: --checksums=false: values are stored and read without checksums; "
                    "a get cannot tell corrupt bytes (for measuring their cost only)";
  } else {
    // Chooses the path now (it may time two once), not on the first request.
    LOG(INFO) << "kvagent: checksums: CRC32C on " << Crc32cImplementation();
  }
  auto pipeline = std::make_unique<RequestPipeline>(std::move(port_), pool_.get(), engine_.get(),
                                                    fence_.get(), v_.checksums);
  pipeline->SetCopyThreads(CopyThreads(v_.copy_threads));
  if (!v_.master.empty() && v_.reserved_write_bytes > 0) {
    WriteReservations::Options reserved;
    reserved.budget_bytes = v_.reserved_write_bytes;
    pipeline->EnableReservedWrites(reserved);
  }
  pipeline->set_extra_counters([slot = relay_slot_, url = metrics_url_](std::vector<Counter>* out) {
    if (const relay::EventRelay* r = slot->load()) AppendRelayCounters(*r, out);
    if (!url.empty()) out->push_back({"agent.metrics_endpoint", 0, url});
  });
  const RequestPipeline* pipeline_view = pipeline.get();
  // systemd's watchdog (WatchdogSec=): pinged from the ring-service thread, with a status line.
  v_.agent.watchdog_interval = Watchdog::IntervalFromEnvironment();
  v_.agent.watchdog_status = [pipeline_view] { return "kvagent " + pipeline_view->StatusLine(); };
  v_.agent.incarnation = incarnation_;  // clients see the pool's incarnation too
  auto agent = Agent::Start(v_.agent, std::move(pipeline));
  if (!agent.ok()) return Fail("agent", agent.status());
  agent_ = std::move(*agent);
  sources_ = {pipeline_view, agent_.get(), engine_.get(), embedded_master_};
  metrics_sources_.store(&sources_, std::memory_order_release);
  AnnounceReady();
  return true;
}

void RunningAgent::AnnounceReady() {
  const std::string status =
      "kvagent ready: " + mode_ + ", pool " + FormatBytes(pool_->size()) + " (" +
      std::string(transfer::PoolPagesName(pool_->pages())) + "), data " + engine_->endpoint() +
      ", events " + events_ + ", clients on " + v_.agent.SocketPath() + ", heap on " +
      HeapPagesDescription() + (metrics_url_.empty() ? "" : ", metrics " + metrics_url_) +
      (v_.secret ? ", cluster secret " + v_.secret->Fingerprint() : std::string());
  LOG(INFO) << status;
  NotifyServiceManager("READY=1\nSTATUS=" + status);
}

void RunningAgent::ServeUntil(const StopSignals& signals) {
  const char* signal_name = signals.Wait();
  NotifyServiceManager("STOPPING=1");
  LOG(INFO) << "received " << signal_name << "; shutting down";
  Stop();
}

void RunningAgent::Stop() {
  metrics_server_.reset();     // before what it reads
  if (agent_) agent_->Stop();  // the service thread stops the master link too
  relay_slot_->store(nullptr);
  relay_to_leader_->Attach(nullptr);
  relay_.reset();  // before the link its content source reads through
  agent_.reset();  // the pipeline and its master port
  port_.reset();   // a master port no pipeline took (start-up failed)
  link_ = nullptr;
  embedded_master_ = nullptr;
  engine_.reset();
  fence_.reset();
  pool_.reset();
}

}  // namespace kvagent::agent

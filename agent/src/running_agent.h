// A running kvagent: what main() starts, step by step, and stops in reverse.
//
// Start-up order: the run dir (refused when another agent serves it); the metrics port; the
// node pool mapped; the data plane (its port bound); the master (embedded: registered and
// mounted at once; remote: registered in the background — ready when the link is, or explicitly
// degraded); the event stream (embedded master's publisher, or the relay: its sockets bound);
// only then the pool pre-faulted (EXTEND_TIMEOUT_USEC to systemd meanwhile), so a taken port
// fails start-up at once; then agent.sock. "kvagent ready: ..." and sd_notify(READY=1) come
// last. Each failed step logs "kvagent cannot start: <step>: <status>".
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "agent_flags.h"
#include "agent_metrics.h"
#include "embedded_master.h"
#include "kvagent/agent/agent.h"
#include "kvagent/agent/master_port.h"
#include "kvagent/common/metrics_http.h"
#include "kvagent/common/stop_signals.h"
#include "kvagent/master_link/remote_master.h"
#include "kvagent/relay/event_relay.h"
#include "kvagent/transfer/node_pool.h"
#include "kvagent/transfer/pool_fence.h"
#include "kvagent/transfer/transfer_engine.h"

namespace kvagent::agent {

struct RelayToLeader;

class RunningAgent {
 public:
  // `flags` were checked (CheckAgentFlags) and outlive this object.
  explicit RunningAgent(AgentFlags& flags);
  // Stops whatever was started, in the reverse order (also after a failed Start).
  ~RunningAgent();
  RunningAgent(const RunningAgent&) = delete;
  RunningAgent& operator=(const RunningAgent&) = delete;

  // Runs the start-up steps; false (the failed step logged) when one fails.
  bool Start();
  // Serves until SIGTERM or SIGINT (STOPPING=1 to systemd), then stops everything.
  void ServeUntil(const StopSignals& signals);

 private:
  bool Fail(const std::string& step, const Status& status);
  bool RefuseTakenRunDir();
  bool StartMetrics();
  bool StartDataPlane();
  bool StartEmbeddedMaster();
  bool StartMasterLink();
  bool StartRelay();
  bool PrefaultPool();
  bool StartServing();
  void AnnounceReady();
  void Stop();

  AgentFlags& v_;
  // /metrics answers from the start (kvagent_up 0) and in full once the agent serves.
  std::atomic<const MetricsSources*> metrics_sources_{nullptr};
  MetricsSources sources_;
  std::unique_ptr<metrics::MetricsHttpServer> metrics_server_;
  std::string metrics_url_;
  std::unique_ptr<transfer::NodePool> pool_;
  uint64_t incarnation_ = 0;
  uint64_t agent_key_ = 0;  // the run dir's agent.key: binds this agent to its name at the master
  // The pool's fence: which data-plane ops may still touch it (pool incarnation, master epoch,
  // abandoned writes). It outlives the engine and the pipeline that consult it.
  std::unique_ptr<transfer::PoolFence> fence_;
  std::unique_ptr<transfer::TransferEngine> engine_;
  std::unique_ptr<MasterPort> port_;  // until the pipeline takes it
  master_link::RemoteMaster* link_ = nullptr;
  EmbeddedMaster* embedded_master_ = nullptr;
  std::unique_ptr<relay::EventRelay> relay_;
  // The relay, for the link's re-registration hook; cleared before the relay goes.
  std::shared_ptr<std::atomic<relay::EventRelay*>> relay_slot_;
  std::shared_ptr<RelayToLeader> relay_to_leader_;
  std::unique_ptr<Agent> agent_;
  std::string mode_;    // "standalone" or "kvmaster <address>" (with "(degraded ...)")
  std::string events_;  // the event endpoints routers subscribe to
};

}  // namespace kvagent::agent

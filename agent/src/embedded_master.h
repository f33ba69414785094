// EmbeddedMaster: the master library inside the agent (`kvagent --standalone`, the default when
// no --master is given). A single node then needs one process.
//
// A MasterService and its MasterRpc run on the agent's service thread: Call hands the request
// bytes to MasterRpc and runs `done` with the reply at once, so the standalone put path has no
// thread hop (ring service -> master -> memcpy -> master -> completion). Calls made from inside
// a `done` are queued and run after it returns (a trampoline), because MasterRpc's reply bytes
// are valid only until its next call.
//
// At Start the node pool is registered and mounted at the master. Every `tick` the
// timer runs MasterService::Tick (leases, put timeouts, eviction) and the agent's own heartbeat.
// The master's KV events go to an EventPublisher (docs/events.md) bound where the relay of a remote
// agent would publish: ipc://<run-dir>/events.sock, replay on events-replay.sock, plus any
// extra PUB endpoints (--events-tcp). Publishing never blocks the service thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvagent/agent/master_port.h"
#include "kvagent/events/event_publisher.h"
#include "kvagent/master/master_metrics.h"
#include "kvagent/master/master_rpc.h"
#include "kvagent/master/master_service.h"
#include "kvagent/transfer/pool_fence.h"

namespace kvagent::agent {

struct EmbeddedMasterOptions {
  master::MasterOptions master;  // TTLs, part size, watermarks, state_dir
  std::string agent_name;        // how the agent registers itself
  uint64_t incarnation = 1;
  uint64_t agent_key = 0;     // master.fbs RegisterAgent; the pipeline's requests carry it
  uint64_t pool_bytes = 0;    // the node pool, mounted as pool index 0
  std::string data_endpoint;  // the pool's data-plane endpoint (TransferEngine::endpoint())
  events::EventPublisherOptions events;
  std::chrono::milliseconds tick{50};
  // The pool's fence: registered with this master's epoch at start (may be null in tests).
  transfer::PoolFence* fence = nullptr;
};

class EmbeddedMaster final : public MasterPort {
 public:
  // Opens the service (replaying options.master.state_dir when set), starts the publisher
  // (publishing the service's start events: AllBlocksCleared, then what it restored), registers
  // the agent and mounts the pool. Errors name what failed: a bad option, an unusable state
  // dir, an event endpoint that cannot be bound.
  static Result<std::unique_ptr<EmbeddedMaster>> Start(EmbeddedMasterOptions options);
  ~EmbeddedMaster() override;

  void Bind(PostFn post) override;
  void Call(flatbuffers::DetachedBuffer request, MasterReplyFn done) override;
  bool ready() const override { return true; }
  MasterIdentity identity() const override { return identity_; }
  std::string Describe() const override;
  void AppendStats(std::vector<std::pair<std::string, uint64_t>>* out) const override;
  Clock::time_point NextDeadline() const override { return next_tick_; }
  void OnTimer(Clock::time_point now) override;
  void Stop() override;

  // The master's Stats counters as of the last tick (any thread; for /metrics).
  master::StatCounterList StatsSnapshot() const { return board_.Read(); }

  // The bound event endpoints (for the ready line and tests).
  std::string events_endpoint() const { return publisher_->endpoint(); }
  std::string replay_endpoint() const { return publisher_->replay_endpoint(); }
  std::vector<std::string> extra_endpoints() const { return publisher_->extra_endpoints(); }

 private:
  EmbeddedMaster() = default;
  void PublishEvents();

  EmbeddedMasterOptions options_;
  master::SteadyClock clock_;
  std::unique_ptr<master::MasterService> service_;
  std::unique_ptr<master::MasterRpc> rpc_;
  std::unique_ptr<events::EventPublisher> publisher_;
  MasterIdentity identity_;
  Clock::time_point next_tick_ = Clock::time_point::max();
  // Calls waiting for the one running now (see the trampoline above).
  std::deque<std::pair<flatbuffers::DetachedBuffer, MasterReplyFn>> queued_;
  bool dispatching_ = false;
  bool stopped_ = false;
  master::StatsBoard board_;               // refreshed every tick
  master::StatCounterList tick_counters_;  // OnTimer's, refilled every tick
};

}  // namespace kvagent::agent

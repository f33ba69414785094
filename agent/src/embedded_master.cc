#include "embedded_master.h"

#include <glog/logging.h>

namespace kvagent::agent {

Result<std::unique_ptr<EmbeddedMaster>> EmbeddedMaster::Start(EmbeddedMasterOptions options) {
  std::unique_ptr<EmbeddedMaster> m(new EmbeddedMaster());
  m->options_ = std::move(options);
  // Every write of a standalone agent is a memcpy on this thread, done before the write ends:
  // no byte of an abandoned write can arrive later, so its space is free at once.
  m->options_.master.writes_are_local = true;
  auto service = master::MasterService::Open(m->options_.master, &m->clock_);
  if (!service.ok()) return service.status();
  m->service_ = std::move(*service);
  m->rpc_ = std::make_unique<master::MasterRpc>(m->service_.get());

  auto publisher = events::EventPublisher::Start(m->options_.events);
  if (!publisher.ok()) return publisher.status();
  m->publisher_ = std::move(*publisher);
  m->rpc_->set_extra_stats([p = m->publisher_.get()](auto* out) {
    const events::EventPublisherStats st = p->stats();
    out->emplace_back("events_published", st.published_events);
    out->emplace_back("event_batches_published", st.published_batches);
    out->emplace_back("events_dropped", st.dropped_events);
    out->emplace_back("event_next_seq", st.next_seq);
  });

  auto agent = m->service_->RegisterAgent(m->options_.agent_name, m->options_.incarnation,
                                          m->options_.agent_key);
  if (!agent.ok()) return agent.status();
  // Local copies into the pool carry this master's epoch (its placements do).
  if (m->options_.fence != nullptr) m->options_.fence->SetEpoch(m->service_->epoch());
  const std::string_view endpoint = m->options_.data_endpoint;
  auto mounted = m->service_->MountPool(*agent, 0, m->options_.pool_bytes,
                                        std::span<const std::string_view>(&endpoint, 1));
  if (!mounted.ok()) return mounted.status();
  m->identity_ = MasterIdentity{*agent, mounted->pool_id, m->options_.agent_key};
  // The start events (AllBlocksCleared, then any restored objects) go out first.
  m->PublishEvents();
  m->board_.Publish(m->rpc_->StatCounters());
  m->next_tick_ = Clock::now() + m->options_.tick;
  return m;
}

EmbeddedMaster::~EmbeddedMaster() {
  Stop();
  if (service_) {
    if (Status st = service_->Flush(); !st.ok()) LOG(ERROR) << st.ToString();
  }
  if (publisher_) {
    PublishEvents();
    publisher_->Flush();
  }
}

void EmbeddedMaster::Bind(PostFn) {}  // replies are delivered before Call returns

void EmbeddedMaster::Call(flatbuffers::DetachedBuffer request, MasterReplyFn done) {
  if (stopped_) return;
  queued_.emplace_back(std::move(request), std::move(done));
  if (dispatching_) return;  // the outer Call runs it once the current callback returns
  dispatching_ = true;
  while (!queued_.empty()) {
    auto [bytes, callback] = std::move(queued_.front());
    queued_.pop_front();
    // Built by this process (MasterMessages): nothing to verify.
    const std::span<const uint8_t> reply = rpc_->HandleOwn({bytes.data(), bytes.size()});
    callback(reply);
  }
  dispatching_ = false;
  PublishEvents();
}

void EmbeddedMaster::OnTimer(Clock::time_point now) {
  // The embedded master would otherwise expire its own agent after the agent TTL.
  (void)service_->Heartbeat(identity_.agent_id);
  service_->Tick();
  PublishEvents();
  rpc_->StatCounters(&tick_counters_);  // in its own memory (master_rpc.h)
  board_.Publish(tick_counters_);       // what /metrics reads (off this thread)
  next_tick_ = now + options_.tick;
}

void EmbeddedMaster::Stop() {
  stopped_ = true;
  queued_.clear();
}

void EmbeddedMaster::PublishEvents() {
  std::vector<events::KvEvent> ev = service_->TakeEvents();
  if (!ev.empty()) publisher_->Publish(std::move(ev));
}

std::string EmbeddedMaster::Describe() const {
  return "standalone (embedded master), agent " + std::to_string(identity_.agent_id) + ", pool " +
         std::to_string(identity_.pool_id) + ", events on " + publisher_->endpoint();
}

void EmbeddedMaster::AppendStats(std::vector<std::pair<std::string, uint64_t>>* out) const {
  out->emplace_back("ready", 1);
}

}  // namespace kvagent::agent

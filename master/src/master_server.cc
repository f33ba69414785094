#include "kvagent/master/master_server.h"

#include <glog/logging.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "kvagent/common/curve_auth.h"
#include "kvagent/common/event_publisher.h"
#include "kvagent/common/format.h"
#include "kvagent/common/watchdog.h"
#include "kvagent/common/zmq_limits.h"
#include "kvagent/master/master_rpc.h"
#include "kvagent/master/master_service.h"

namespace kvagent::master {

class MasterServer::Loop {
 public:
  Loop(std::unique_ptr<MasterService> service, std::unique_ptr<events::EventPublisher> publisher,
       zmq::context_t context, std::unique_ptr<ZapHandler> zap, zmq::socket_t router, int tick_ms,
       const Clock* clock, std::chrono::microseconds watchdog_interval)
      : service_(std::move(service)),
        publisher_(std::move(publisher)),
        rpc_(service_.get()),
        context_(std::move(context)),
        zap_(std::move(zap)),
        router_(std::move(router)),
        tick_ms_(tick_ms),
        clock_(clock),
        watchdog_(watchdog_interval, [this] { return StatusLine(); }) {
    rpc_.set_extra_stats([this](std::vector<std::pair<std::string, uint64_t>>* out) {
      const events::EventPublisherStats st = publisher_->stats();
      out->emplace_back("events_published", st.published_events);
      out->emplace_back("event_batches_published", st.published_batches);
      out->emplace_back("events_dropped", st.dropped_events);
      out->emplace_back("event_next_seq", st.next_seq);
      out->emplace_back("event_replay_requests", st.replay_requests);
      out->emplace_back("bad_messages", bad_frames_);
      out->emplace_back("refused_connections", zap_ ? zap_->refused() : 0);
    });
    // Agents learn where the events are from their registration reply.
    rpc_.set_event_endpoints(publisher_->endpoint(), publisher_->replay_endpoint());
    PublishEvents();
    board_.Publish(rpc_.StatCounters());
    thread_ = std::thread([this] { Run(); });
  }

  ~Loop() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
    if (Status st = service_->Flush(); !st.ok()) LOG(ERROR) << st.ToString();
    PublishEvents();
    publisher_->Flush();
  }

  events::EventPublisher& publisher() { return *publisher_; }
  const StatsBoard& board() const { return board_; }

 private:
  void PublishEvents() {
    std::vector<events::KvEvent> ev = service_->TakeEvents();
    if (!ev.empty()) publisher_->Publish(std::move(ev));
  }

  void Reply(const zmq::message_t& identity, std::span<const uint8_t> reply) {
    router_.send(zmq::buffer(identity.data(), identity.size()), zmq::send_flags::sndmore);
    router_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    router_.send(zmq::buffer(reply.data(), reply.size()), zmq::send_flags::none);
  }

  void HandleFrames() {
    if (frames_.size() == 3 && frames_[1].size() == 0) {
      auto body = std::span(static_cast<const uint8_t*>(frames_[2].data()), frames_[2].size());
      Reply(frames_[0], rpc_.Handle(body));
      return;
    }
    // Not [identity, "", request]: answer with an error when there is someone to answer.
    ++bad_frames_;
    if (frames_.size() >= 2) {
      LOG_EVERY_N(WARNING, 100) << "malformed message of " << frames_.size()
                                << " frame(s) on the RPC socket; expected [\"\", request]";
      Reply(frames_[0], rpc_.Handle({}));
    }
  }

  // systemd's STATUS= (this thread).
  std::string StatusLine() const {
    const MasterStats s = service_->Stats();
    return "kvmaster serving " + std::to_string(s.agents) + " agent(s), " + std::to_string(s.keys) +
           " key(s), " + FormatBytes(s.bytes_used) + " of " + FormatBytes(s.bytes_capacity) +
           " used";
  }

  void Run() {
    zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0}};
    int64_t next_tick = clock_->NowMs() + tick_ms_;
    while (!stop_.load(std::memory_order_relaxed)) {
      const int64_t now = clock_->NowMs();
      const int64_t wait = std::max<int64_t>(0, std::min<int64_t>(next_tick - now, tick_ms_));
      zmq::poll(items, 1, std::chrono::milliseconds(wait));
      if (items[0].revents & ZMQ_POLLIN) {
        // Drain what is queued, but come back to Tick at least every 1024 messages.
        for (int n = 0; n < 1024; ++n) {
          frames_.clear();
          auto got =
              zmq::recv_multipart(router_, std::back_inserter(frames_), zmq::recv_flags::dontwait);
          if (!got) break;
          HandleFrames();
        }
        // One hand-off per wake-up rather than per request: fewer publisher wake-ups, same
        // order (events accumulate in the service in the order requests were handled).
        PublishEvents();
      }
      if (clock_->NowMs() >= next_tick) {
        service_->Tick();
        PublishEvents();
        board_.Publish(rpc_.StatCounters());  // what /metrics reads (off this thread)
        next_tick = clock_->NowMs() + tick_ms_;
      }
      // From this loop (it wakes at least every tick): if it hangs, systemd stops hearing us.
      watchdog_.Poll(std::chrono::steady_clock::now());
    }
  }

  std::unique_ptr<MasterService> service_;
  std::unique_ptr<events::EventPublisher> publisher_;
  MasterRpc rpc_;
  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;  // before the context goes: checks the ROUTER's clients
  zmq::socket_t router_;
  int tick_ms_;
  const Clock* clock_;
  std::vector<zmq::message_t> frames_;
  uint64_t bad_frames_ = 0;
  StatsBoard board_;
  Watchdog watchdog_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Result<std::unique_ptr<MasterServer>> MasterServer::Start(MasterServerOptions options,
                                                          const Clock* clock) {
  auto service = MasterService::Open(options.master, clock);
  if (!service.ok()) return service.status();

  zmq::context_t context(1);
  std::unique_ptr<ZapHandler> zap;
  zmq::socket_t router(context, zmq::socket_type::router);
  if (options.secret) {
    // The handler first: no client may complete a handshake before it checks keys.
    auto curve =
        StartCurveServer(context.handle(), options.secret->CurveKeys(KeyPlane::kMasterRpc));
    if (!curve.ok()) return curve.status();
    KVAGENT_RETURN_IF_ERROR(MakeCurveServer(router.handle(), curve->keys));
    zap = std::move(curve->zap);
  }
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::sndhwm, kMasterRpcPeerQueue);
  router.set(zmq::sockopt::rcvhwm, kMasterRpcPeerQueue);
  router.set(zmq::sockopt::maxmsgsize, kMaxMasterRequestBytes);
  try {
    router.bind(options.listen);
  } catch (const zmq::error_t& e) {
    return InvalidParams("cannot listen on " + options.listen + ": " + e.what() +
                         "; pick a free address with --listen");
  }
  std::string endpoint = router.get(zmq::sockopt::last_endpoint);

  events::EventPublisherOptions pub;
  pub.endpoint = options.events;
  pub.replay_endpoint = options.events_replay;
  pub.replay_batches = options.replay_batches;
  if (options.secret) pub.curve = options.secret->CurveKeys(KeyPlane::kEvents);
  auto publisher = events::EventPublisher::Start(pub);
  if (!publisher.ok()) return publisher.status();

  std::unique_ptr<MasterServer> server(new MasterServer());
  server->endpoint_ = endpoint;
  server->loop_ = std::make_unique<Loop>(
      std::move(service.value()), std::move(publisher.value()), std::move(context), std::move(zap),
      std::move(router), std::max(1, options.tick_ms), clock, options.watchdog_interval);
  return server;
}

MasterServer::~MasterServer() = default;

std::string MasterServer::events_endpoint() const { return loop_->publisher().endpoint(); }
std::string MasterServer::replay_endpoint() const { return loop_->publisher().replay_endpoint(); }
StatCounterList MasterServer::StatsSnapshot() const { return loop_->board().Read(); }

}  // namespace kvagent::master

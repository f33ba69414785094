#include "kvagent/master/master_server.h"

#include <glog/logging.h>
#include <poll.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "framed_rpc_server.h"
#include "kvagent/common/format.h"
#include "kvagent/common/watchdog.h"
#include "kvagent/events/event_publisher.h"
#include "kvagent/master/master_rpc.h"
#include "kvagent/master/master_service.h"
#include "kvagent/master/router_reply.h"
#include "kvagent/zmq/curve_auth.h"
#include "kvagent/zmq/zmq_limits.h"

namespace kvagent::master {
namespace {

// A long-polling Replicate is held at most this long, whatever it asked for.
constexpr int64_t kMaxParkMs = 1000;
// A follower that has not asked for this long no longer counts (for stats and sync acks).
constexpr int64_t kFollowerSilentMs = 3000;
// Bounds on what requests may make the server keep: parked long polls (beyond: answered at
// once), followers counted (beyond: a new name is not), and replies held for followers (beyond
// the count or past kMaxHoldMs — their callers have timed out — they are dropped, never sent).
constexpr size_t kMaxParked = 1024;
// A Replicate whose snapshot is being built is held at most this long (then told to ask again);
// a follower with no state waits a minute for its first (standby.cc).
constexpr int64_t kMaxSnapshotParkMs = 60'000;
constexpr size_t kMaxFollowers = 256;
constexpr size_t kMaxHeld = 65536;
constexpr int64_t kMaxHoldMs = 30000;
// Events whose room PublishEvents keeps between passes (at 272 bytes each, 17 MiB).
constexpr size_t kKeptEventCapacity = 65536;

}  // namespace

class MasterServer::Loop {
 public:
  Loop(std::unique_ptr<MasterService> service, std::unique_ptr<events::EventPublisher> publisher,
       zmq::context_t context, std::unique_ptr<ZapHandler> zap, zmq::socket_t router,
       std::unique_ptr<FramedRpcServer> framed, const MasterServerOptions& options,
       const Clock* clock)
      : service_(std::move(service)),
        publisher_(std::move(publisher)),
        rpc_(service_.get()),
        context_(std::move(context)),
        zap_(std::move(zap)),
        router_(std::move(router)),
        framed_(std::move(framed)),
        tick_ms_(std::max(1, options.tick_ms)),
        may_serve_(options.may_serve),
        sync_followers_(std::max(0, options.sync_followers)),
        sync_electable_only_(options.sync_electable_only),
        clock_(clock),
        watchdog_(options.watchdog_interval, [this] { return StatusLine(); }) {
    rpc_.set_background_snapshots(true);  // a follower's snapshot does not stop the loop
    rpc_.set_extra_stats([this](std::vector<std::pair<std::string, uint64_t>>* out) {
      const events::EventPublisherStats st = publisher_->stats();
      out->emplace_back("events_published", st.published_events);
      out->emplace_back("event_batches_published", st.published_batches);
      out->emplace_back("events_dropped", st.dropped_events);
      out->emplace_back("event_next_seq", st.next_seq);
      out->emplace_back("event_replay_requests", st.replay_requests);
      out->emplace_back("bad_messages", bad_frames_);
      out->emplace_back("refused_connections", zap_ ? zap_->refused() : 0);
      out->emplace_back("epoch", service_->epoch());
      out->emplace_back("followers", LiveFollowers());
      out->emplace_back("replication_acked_seq", AckedBy(std::max(1, sync_followers_)));
      out->emplace_back("sync_followers", sync_followers_);
      out->emplace_back("sync_waiting_replies", held_.size());
      out->emplace_back("sync_dropped_replies", dropped_held_);
      if (framed_) {
        const FramedRpcStats f = framed_->stats();
        out->emplace_back("framed_connections", f.connections);
        out->emplace_back("framed_accepted", f.accepted);
        out->emplace_back("framed_refused", f.refused);
        out->emplace_back("framed_bad_streams", f.bad_streams);
        out->emplace_back("framed_slow_readers", f.slow_readers);
        out->emplace_back("framed_unauthenticated", f.unauthenticated);
        out->emplace_back("framed_handshake_timeouts", f.handshake_timeouts);
      }
    });
    if (may_serve_) rpc_.set_may_serve(may_serve_);
    // Agents learn where the events are from their registration reply.
    rpc_.set_event_endpoints(publisher_->endpoint(), publisher_->replay_endpoint());
    if (framed_) rpc_.set_framed_endpoint(framed_->endpoint());  // and the fast way to ask
    PublishEvents();
    last_seq_.store(service_->replication_last_seq(), std::memory_order_release);
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
  uint64_t epoch() const { return service_->epoch(); }
  uint64_t last_seq() const { return last_seq_.load(std::memory_order_acquire); }
  const StatsBoard& board() const { return board_; }

 private:
  // Who asked: a ROUTER peer (its identity frame) or a framed connection (conn != 0).
  struct Peer {
    zmq::message_t identity;
    FramedRpcServer::ConnectionId conn = 0;
  };
  struct Parked {  // a Replicate waiting for a record, or for its snapshot to be built
    Peer peer;
    std::vector<uint8_t> request;
    uint64_t after_seq = 0;
    int64_t until_ms = 0;
    bool snapshot = false;
  };
  struct Held {  // a reply waiting for followers (sync replication)
    Peer peer;
    std::vector<uint8_t> reply;
    uint64_t seq = 0;
    int64_t until_ms = 0;  // dropped past it: its caller has given up
  };
  struct Follower {
    uint64_t acked = 0;  // holds every record up to this one of our log (0: none yet)
    int64_t seen_ms = 0;
    bool electable = false;  // an HA member (Replicate.electable)
  };

  bool serving() const { return !may_serve_ || may_serve_(); }

  // Encoded here (EncodeAndPublish) and freed here; the vector is the service's again for the
  // next ones. So none of this thread's memory is freed by the publisher's thread, and no
  // vector is allocated per pass.
  void PublishEvents() {
    service_->TakeEvents(&taken_events_);
    if (taken_events_.empty()) return;
    publisher_->EncodeAndPublish(taken_events_);
    taken_events_.clear();
    // A mass removal (an agent's drop) may have grown it to hundreds of megabytes: not kept.
    if (taken_events_.capacity() > kKeptEventCapacity) taken_events_ = {};
  }

  // `detached`: a Replicate's records, sent after the reply as a part of their own (a ROUTER
  // peer's only: MasterRpc::Handle detaches nothing for a framed one).
  void Reply(const Peer& peer, std::span<const uint8_t> reply, std::string_view detached = {},
             const std::shared_ptr<const void>& owner = nullptr) {
    if (peer.conn != 0) {
      framed_->Reply(peer.conn, reply);  // written by Flush, once per loop pass
      return;
    }
    unseen_ = true;  // see Run
    SendRouterReply(router_, peer.identity, reply, detached, owner);
  }

  void HandleFrames() {
    if (frames_.size() != 3 || frames_[1].size() != 0) {
      // Not [identity, "", request]: answer with an error when there is someone to answer.
      ++bad_frames_;
      if (frames_.size() >= 2) {
        LOG_EVERY_N(WARNING, 100) << "malformed message of " << frames_.size()
                                  << " frame(s) on the RPC socket; expected [\"\", request]";
        Reply(Peer{std::move(frames_[0]), 0}, rpc_.Handle({}));
      }
      return;
    }
    auto body = std::span(static_cast<const uint8_t*>(frames_[2].data()), frames_[2].size());
    HandleRequest(Peer{std::move(frames_[0]), 0}, body, &frames_[2]);
  }

  // Where a refused call for another agent came from (MasterService logs why, once per agent):
  // logged once per address, for the first 64 addresses.
  void NoteAgentKeyRefusal(const Peer& peer, zmq::message_t* message) {
    std::string from;
    if (peer.conn != 0 && framed_) {
      from = framed_->PeerAddress(peer.conn) + " (framed transport)";
    } else if (message != nullptr) {
      const char* address = nullptr;
      try {
        address = message->gets("Peer-Address");
      } catch (const zmq::error_t&) {
        address = nullptr;  // not a TCP peer (ipc://)
      }
      from = address != nullptr && *address != '\0' ? std::string(address) + " (ZMQ)"
                                                    : std::string("a local ipc peer (ZMQ)");
    }
    if (agent_key_refusal_sources_.size() >= 64 ||
        !agent_key_refusal_sources_.insert(from).second) {
      return;
    }
    LOG(WARNING) << "refused a call for an agent without its agent key from " << from
                 << " (further ones from there are only counted: master.agent_key_refusals)";
  }

  // One request from either transport: answered now, parked (a long poll) or held (until the
  // followers have its records).
  void HandleRequest(Peer peer, std::span<const uint8_t> body, zmq::message_t* message = nullptr) {
    const std::span<const uint8_t> reply = rpc_.Handle(body, /*may_detach=*/peer.conn == 0);
    const MasterRpc::LastRequest& last = rpc_.last();
    if (last.agent_key_refused) NoteAgentKeyRefusal(peer, message);
    if (last.replicate) {
      NoteFollower(last);
      if (last.replicate_pending && parked_.size() < kMaxParked) {
        parked_.push_back(Parked{std::move(peer), std::vector<uint8_t>(body.begin(), body.end()),
                                 last.after_seq, clock_->NowMs() + kMaxSnapshotParkMs, true});
        return;
      }
      if (last.replicate_empty && last.wait_ms > 0 && parked_.size() < kMaxParked) {
        const int64_t wait = std::min<int64_t>(last.wait_ms, kMaxParkMs);
        parked_.push_back(Parked{std::move(peer), std::vector<uint8_t>(body.begin(), body.end()),
                                 last.after_seq, clock_->NowMs() + wait});
        return;
      }
      Reply(peer, reply, last.detached, last.detached_owner);
      return;
    }
    if (sync_followers_ > 0 && !last.refused) {
      const uint64_t seq = service_->replication_last_seq();
      if (seq > AckedBy(sync_followers_)) {
        held_.push_back(Held{std::move(peer), std::vector<uint8_t>(reply.begin(), reply.end()), seq,
                             clock_->NowMs() + kMaxHoldMs});
        if (held_.size() > kMaxHeld) {
          held_.pop_front();
          ++dropped_held_;
        }
        return;
      }
    }
    Reply(peer, reply);
  }

  // ---- followers ------------------------------------------------------------------------------

  void NoteFollower(const MasterRpc::LastRequest& r) {
    if (followers_.size() >= kMaxFollowers && followers_.count(r.follower) == 0) return;
    Follower& f = followers_[r.follower];
    // after_seq counts only for a follower of this master's log (else it is about to get a
    // snapshot and holds nothing of ours yet).
    f.acked = r.master_epoch == service_->epoch() ? r.after_seq : 0;
    f.seen_ms = clock_->NowMs();
    f.electable = r.electable;
  }

  // The record that at least `n` live followers hold (0: fewer than n followers); with
  // sync_electable_only_, only followers that can be elected count.
  uint64_t AckedBy(int n) const {
    std::vector<uint64_t> acks;
    const int64_t now = clock_->NowMs();
    for (const auto& [name, f] : followers_) {
      if (sync_electable_only_ && !f.electable) continue;  // a manual standby: never elected
      if (now - f.seen_ms <= kFollowerSilentMs) acks.push_back(f.acked);
    }
    if (n <= 0 || acks.size() < static_cast<size_t>(n)) return 0;
    std::nth_element(acks.begin(), acks.begin() + (n - 1), acks.end(), std::greater<>());
    return acks[n - 1];
  }

  uint64_t LiveFollowers() const {
    const int64_t now = clock_->NowMs();
    return std::count_if(followers_.begin(), followers_.end(), [&](const auto& f) {
      return now - f.second.seen_ms <= kFollowerSilentMs;
    });
  }

  // Answers the long polls that have a record now, or whose wait is over, and the snapshot
  // requests whose snapshot is built (or that waited too long: they are told to ask again).
  void ServeParked() {
    if (parked_.empty()) return;
    const uint64_t seq = service_->replication_last_seq();
    const int64_t now = clock_->NowMs();
    bool building = false;
    bool building_known = false;
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (it->snapshot) {
        if (!building_known) {
          building = service_->SnapshotBuilding();
          building_known = true;
        }
        if (building && now < it->until_ms) {
          ++it;
          continue;
        }
      } else if (seq <= it->after_seq && now < it->until_ms) {
        ++it;
        continue;
      }
      const std::span<const uint8_t> reply = rpc_.Handle(it->request, it->peer.conn == 0);
      NoteFollower(rpc_.last());
      if (rpc_.last().replicate_pending && now < it->until_ms) {
        // The snapshot built was already too old for this follower: a newer one is on its way.
        it->snapshot = true;
        building = true;
        ++it;
        continue;
      }
      Reply(it->peer, reply, rpc_.last().detached, rpc_.last().detached_owner);
      it = parked_.erase(it);
    }
  }

  // Sends the held replies the followers now cover; drops them all once we may not serve (a
  // change a deposed master made may be missing from the new leader: its outcome is unknown, so
  // the caller must not hear OK — it times out instead).
  void ReleaseHeld() {
    if (held_.empty()) return;
    if (!serving()) {
      LOG(WARNING) << "not serving any more: " << held_.size()
                   << " repl(ies) waiting for a follower are dropped (their callers time out: "
                      "the outcome of those changes is unknown)";
      dropped_held_ += held_.size();
      held_.clear();
      return;
    }
    const uint64_t acked = AckedBy(sync_followers_);
    while (!held_.empty() && held_.front().seq <= acked) {
      Reply(held_.front().peer, held_.front().reply);
      held_.pop_front();
    }
    const int64_t now = clock_->NowMs();
    while (!held_.empty() && held_.front().until_ms <= now) {
      held_.pop_front();
      ++dropped_held_;
    }
  }

  // Prunes followers that went away (at most once a second).
  void ForgetSilentFollowers(int64_t now) {
    if (now < next_prune_ms_) return;
    next_prune_ms_ = now + 1000;
    std::erase_if(followers_,
                  [&](const auto& f) { return now - f.second.seen_ms > 10 * kFollowerSilentMs; });
  }

  // ---- the loop -------------------------------------------------------------------------------

  // systemd's STATUS= (this thread).
  std::string StatusLine() const {
    const MasterStats s = service_->Stats();
    return "kvmaster serving " + std::to_string(s.agents) + " agent(s), " + std::to_string(s.keys) +
           " key(s), " + FormatBytes(s.bytes_used) + " of " + FormatBytes(s.bytes_capacity) +
           " used";
  }

  void Run() {
    pthread_setname_np(pthread_self(), "kvmaster-loop");  // `top -H`, profiles
    // The ROUTER is watched through its ZMQ_FD in a plain poll(): zmq_poll asks the socket for
    // ZMQ_EVENTS before and after each wait, two system calls each. The fd signals when
    // commands reach the socket, not for each request, so the socket is drained to EAGAIN
    // (that last receive takes in the commands and clears the fd) and looked at again, without
    // waiting, after any reply was sent: a send may take in the command that announces the next
    // request, which would then wait for the tick.
    const int router_fd = router_.get(zmq::sockopt::fd);
    int64_t next_tick = clock_->NowMs() + tick_ms_;
    while (!stop_.load(std::memory_order_relaxed)) {
      const int64_t now = clock_->NowMs();
      int64_t until = std::min(next_tick, now + tick_ms_);
      for (const Parked& p : parked_) until = std::min(until, p.until_ms);
      // No wait while the ROUTER may hold requests its fd did not signal, or framed requests
      // are buffered beyond the last pass's budget; without framed connections, no poll at all
      // then (a system call saved per pass).
      const bool pending = unseen_ || (framed_ && framed_->HasBuffered());
      if (!pending || framed_) {
        poll_fds_.clear();
        poll_fds_.push_back(pollfd{router_fd, POLLIN, 0});
        if (framed_) framed_->AppendPollFds(&poll_fds_);
        ::poll(poll_fds_.data(), poll_fds_.size(),
               pending ? 0 : static_cast<int>(std::clamp<int64_t>(until - now, 0, tick_ms_)));
      }
      // Drain what is queued, but come back to Tick at least every 1024 messages, and when its
      // time has come: 1024 batches of large requests take seconds, and a tick that late reads
      // as a stall of the master (its live clock counts at most a tick credit per gap).
      unseen_ = true;
      int handled = 0;
      for (; handled < 1024; ++handled) {
        frames_.clear();
        auto got =
            zmq::recv_multipart(router_, std::back_inserter(frames_), zmq::recv_flags::dontwait);
        if (!got) {
          unseen_ = false;  // drained: the fd signals what comes next
          break;
        }
        HandleFrames();
        if (handled % 8 == 7 && clock_->NowMs() >= next_tick) break;  // handled > 0 still
      }
      if (framed_) {
        handled += static_cast<int>(framed_->Serve(
            std::span(poll_fds_).subspan(1),
            [this](FramedRpcServer::ConnectionId conn, std::span<const uint8_t> request) {
              HandleRequest(Peer{zmq::message_t(), conn}, request);
            },
            1024));
      }
      if (handled > 0) {
        // One hand-off per wake-up rather than per request: fewer publisher wake-ups, same
        // order (events accumulate in the service in the order requests were handled).
        PublishEvents();
      }
      if (clock_->NowMs() >= next_tick) {
        // A master that may not serve changes nothing, not even by time: its agents are not
        // blamed for the pause (the tick gap counts as a stall of the master).
        if (serving()) {
          service_->Tick();
          PublishEvents();
        }
        rpc_.StatCounters(&tick_counters_);  // in its own memory (master_rpc.h)
        board_.Publish(tick_counters_);      // what /metrics reads (off this thread)
        next_tick = clock_->NowMs() + tick_ms_;
        if (framed_) framed_->ExpireUnproven();
        ForgetSilentFollowers(clock_->NowMs());
      }
      ServeParked();
      ReleaseHeld();
      if (framed_) framed_->Flush();  // every reply of this pass, one write per connection
      last_seq_.store(service_->replication_last_seq(), std::memory_order_release);
      // From this loop (it wakes at least every tick): if it hangs, systemd stops hearing us.
      watchdog_.Poll(std::chrono::steady_clock::now());
    }
    if (!held_.empty()) dropped_held_ += held_.size();
  }

  std::unique_ptr<MasterService> service_;
  std::unique_ptr<events::EventPublisher> publisher_;
  std::vector<events::KvEvent> taken_events_;  // PublishEvents'; its buffer goes back and forth
  MasterRpc rpc_;
  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;  // before the context goes: checks the ROUTER's clients
  zmq::socket_t router_;
  std::unique_ptr<FramedRpcServer> framed_;  // null: no --framed-listen
  std::vector<pollfd> poll_fds_;
  int tick_ms_;
  std::function<bool()> may_serve_;
  int sync_followers_;
  bool sync_electable_only_;
  const Clock* clock_;
  std::vector<zmq::message_t> frames_;
  bool unseen_ = true;  // the ROUTER may hold requests its fd did not signal (Run)
  uint64_t bad_frames_ = 0;
  std::unordered_set<std::string> agent_key_refusal_sources_;  // logged (NoteAgentKeyRefusal)
  std::deque<Parked> parked_;
  std::deque<Held> held_;
  uint64_t dropped_held_ = 0;
  std::map<std::string, Follower> followers_;
  int64_t next_prune_ms_ = 0;
  std::atomic<uint64_t> last_seq_{0};
  StatsBoard board_;
  StatCounterList tick_counters_;  // Run's, refilled every tick
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
  std::unique_ptr<FramedRpcServer> framed;
  if (!options.framed_listen.empty()) {
    FramedRpcServerOptions fo;
    fo.listen = options.framed_listen;
    if (options.secret) fo.key = FramedRpcKey(*options.secret);  // version 2: sealed frames
    auto f = FramedRpcServer::Listen(fo);
    if (!f.ok()) return f.status();
    framed = std::move(*f);
  }

  events::EventPublisherOptions pub;
  pub.endpoint = options.events;
  pub.replay_endpoint = options.events_replay;
  pub.replay_batches = options.replay_batches;
  if (options.secret) pub.curve = options.secret->CurveKeys(KeyPlane::kEvents);
  auto publisher = events::EventPublisher::Start(pub);
  if (!publisher.ok()) return publisher.status();

  std::unique_ptr<MasterServer> server(new MasterServer());
  server->endpoint_ = endpoint;
  if (framed) server->framed_endpoint_ = framed->endpoint();
  server->loop_ = std::make_unique<Loop>(std::move(service.value()), std::move(publisher.value()),
                                         std::move(context), std::move(zap), std::move(router),
                                         std::move(framed), options, clock);
  return server;
}

MasterServer::~MasterServer() = default;

std::string MasterServer::events_endpoint() const { return loop_->publisher().endpoint(); }
std::string MasterServer::replay_endpoint() const { return loop_->publisher().replay_endpoint(); }
uint64_t MasterServer::epoch() const { return loop_->epoch(); }
uint64_t MasterServer::last_seq() const { return loop_->last_seq(); }
StatCounterList MasterServer::StatsSnapshot() const { return loop_->board().Read(); }

}  // namespace kvagent::master

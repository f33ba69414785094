// The link thread: one DEALER to kvmaster, its connection monitor, registration, heartbeats,
// deadlines and reconnection (remote_master.h describes the behaviour).
#include <glog/logging.h>
#include <poll.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <unordered_map>
#include <zmq.hpp>

#include "kvagent/common/framed_connection.h"
#include "kvagent/common/host_port.h"
#include "kvagent/schemas/flatbuffer_checks.h"
#include "kvagent/schemas/master_generated.h"
#include "kvagent/zmq/curve_auth.h"
#include "kvagent/zmq/zmq_limits.h"
#include "link_shared.h"

namespace kvagent::master_link {
namespace {

namespace mfb = kvagent::master_proto;
using Clock = std::chrono::steady_clock;

// Request ids from here up are the link's own (registration, heartbeats); the pipeline's are
// below (master_port.h).
constexpr uint64_t kOwnIds = uint64_t{1} << 63;

std::string Ms(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

// The framed endpoint a registration reply names (tcp://HOST:PORT as kvmaster bound it), on the
// host this agent reached kvmaster at: --master's host (a kvmaster behind an address of its
// own, or a proxy, keeps being reached there); with ipc:// kvmaster is on this host, at the
// address it bound (a wildcard: the loopback). nullopt for anything else.
std::optional<std::string> FramedOnMasterHost(std::string_view advertised,
                                              std::string_view master) {
  const HostPortRules rules = TcpEndpointRules(/*listener=*/false);
  auto framed = ParseHostPort(advertised, "framed endpoint", rules);
  if (!framed.ok()) return std::nullopt;
  auto reached = ParseHostPort(master, "--master", rules);
  std::string host = reached.ok() ? reached->host : framed->host;
  if (host.empty() || host == "0.0.0.0" || host == "::") host = "127.0.0.1";
  return "tcp://" + JoinHostPort(host, framed->port);
}

// Reply bytes that stay valid (and 8-byte aligned, as FlatBuffers needs) while a posted task
// holds them.
struct ReplyBytes {
  zmq::message_t message;
  std::vector<uint64_t> aligned;
  std::span<const uint8_t> view;
  // A framed reply: copied out of the connection's buffer, which the next read reuses.
  explicit ReplyBytes(std::span<const uint8_t> bytes) {
    aligned.resize((bytes.size() + 7) / 8);
    if (!bytes.empty()) std::memcpy(aligned.data(), bytes.data(), bytes.size());
    view = {reinterpret_cast<const uint8_t*>(aligned.data()), bytes.size()};
  }
  explicit ReplyBytes(zmq::message_t m) : message(std::move(m)) {
    const auto* data = static_cast<const uint8_t*>(message.data());
    if (reinterpret_cast<uintptr_t>(data) % alignof(uint64_t) == 0) {
      view = {data, message.size()};
      return;
    }
    aligned.resize((message.size() + 7) / 8);
    std::memcpy(aligned.data(), data, message.size());
    view = {reinterpret_cast<const uint8_t*>(aligned.data()), message.size()};
  }
};

class Link {
 public:
  explicit Link(RemoteMaster::Shared* shared)
      : s_(*shared),
        o_(shared->options),
        ordered_(shared->watcher != nullptr),
        endpoint_(ordered_ ? std::string() : o_.endpoint),
        backoff_(o_.backoff_min) {}

  void Run() {
    retry_at_ = Clock::now();  // connect at once
    while (!s_.stop.load(std::memory_order_acquire)) {
      PollOnce();
      const auto now = Clock::now();
      if (ordered_ && s_.leader_changed.exchange(false, std::memory_order_acq_rel)) {
        OnLeaderChanged(now);
      }
      if (phase_ == Phase::kDown && now >= retry_at_) Connect(now);
      CheckDeadlines(now);
      if (phase_ == Phase::kReady && now >= next_heartbeat_) Heartbeat(now);
    }
    // Stopping: callbacks on the service thread are dropped (MasterPort::Stop); blocking callers
    // on other threads are told, so none waits for its timeout.
    const Status stopping(ErrorCode::kMasterUnavailable, "the agent is shutting down");
    for (Outgoing& o : s_.Take()) {
      if (o.on_link_thread) o.done(stopping);
    }
    for (auto& [id, call] : calls_) {
      if (call.on_link_thread) call.done(stopping);
    }
    calls_.clear();
    parked_.clear();
    CloseSocket();
    orphaned_.clear();  // the service thread's calls: dropped with their callbacks
  }

 private:
  enum class Phase { kDown, kRegistering, kMounting, kReady };
  enum class Own { kRegister, kMount, kHeartbeat };
  struct Call {
    agent::MasterReplyFn done;  // empty for the link's own requests
    bool on_link_thread = false;
    Own own = Own::kHeartbeat;
    // CallUntilAnswered: the request, kept to send again after a reconnect, and until when.
    flatbuffers::DetachedBuffer request;
    Clock::time_point retry_until = Clock::time_point::min();
    bool retried() const { return retry_until != Clock::time_point::min(); }
  };

  // ---- sockets ------------------------------------------------------------------------------

  void Connect(Clock::time_point now) {
    CloseSocket();
    if (ordered_) {
      if (!FindLeader(now)) return;
    } else {
      // kAuto starts every connection on the ROUTER: its registration reply says where the
      // framed transport is now (a restarted kvmaster may serve it on another port).
      endpoint_ = o_.endpoint;
      framed_now_ = o_.transport == MasterTransport::kFramed;
      s_.SetWhere("");
    }
    if (framed_now_) return ConnectFramed(now);
    dealer_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
    dealer_->set(zmq::sockopt::linger, 0);
    dealer_->set(zmq::sockopt::sndhwm, 100000);
    dealer_->set(zmq::sockopt::rcvhwm, 100000);
    dealer_->set(zmq::sockopt::maxmsgsize, kMaxMasterReplyBytes);
    if (o_.curve) {
      if (Status st = MakeCurveClient(dealer_->handle(), *o_.curve); !st.ok()) {
        return Down(st.message(), now);
      }
    }
    const std::string monitor = "inproc://kvagent-master-link-" + std::to_string(++sockets_);
    zmq_socket_monitor(dealer_->handle(), monitor.c_str(),
                       ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED |
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    monitor_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pair);
    monitor_->set(zmq::sockopt::linger, 0);
    monitor_->connect(monitor);
    try {
      dealer_->connect(endpoint_);
    } catch (const zmq::error_t& e) {
      return Down("cannot connect to " + endpoint_ + ": " + e.what(), now);
    }
    dealer_fd_ = dealer_->get(zmq::sockopt::fd);
    monitor_fd_ = monitor_->get(zmq::sockopt::fd);
    dealer_unseen_ = true;
    monitor_unseen_ = true;
    connected_ = false;
    handshake_done_ = false;
    ++attempt_;
    s_.SetState(LinkState::kConnecting, ConnectingText());
    Register(now);
  }

  // The framed transport: one TCP connection, polled by this thread (no monitor: its failures
  // come out of OnReady).
  // `moving`: the same attempt, moved from the ROUTER to the framed port (kAuto).
  void ConnectFramed(Clock::time_point now, bool moving = false) {
    auto conn = FramedConnection::Connect(endpoint_, kMaxMasterReplyBytes, o_.framed_key);
    if (!conn.ok()) return Down(conn.status().message(), now);
    framed_ = std::make_unique<FramedConnection>(std::move(*conn));
    if (!moving) ++attempt_;
    s_.SetState(LinkState::kConnecting, ConnectingText());
    Register(now);
    FlushFramed(now);
  }

  // Writes what the framed connection has queued, and takes in what it received.
  // With the replies the service thread read and passed on (and its read's failure).
  void FlushFramed(Clock::time_point now, short revents = 0) {
    framed_replies_.clear();
    Status st;
    {
      std::lock_guard<std::mutex> lock(s_.direct_mu);  // the service thread uses it too
      for (const std::vector<uint8_t>& reply : s_.handed) {
        framed_replies_.push_back(std::make_shared<ReplyBytes>(std::span(reply)));
      }
      s_.handed.clear();
      if (ServiceReads()) revents &= ~POLLIN;  // what came in is the service thread's to read
      st = s_.direct_failure.ok()
               ? framed_->OnReady(revents,
                                  [this](std::span<const uint8_t> reply) {
                                    framed_replies_.push_back(std::make_shared<ReplyBytes>(reply));
                                  })
               : s_.direct_failure;
    }
    // Replies first (OnReply may take the link down and drop the connection).
    for (auto& bytes : framed_replies_) {
      if (!framed_) return;
      OnReply(std::move(bytes), now);
    }
    framed_replies_.clear();
    if (!st.ok() && framed_) Down(st.message(), now);
  }

  void CloseSocket() {
    s_.on_framed.store(false, std::memory_order_relaxed);
    if (dealer_) zmq_socket_monitor(dealer_->handle(), nullptr, 0);
    monitor_.reset();
    dealer_.reset();
    if (framed_) {
      std::lock_guard<std::mutex> lock(s_.direct_mu);
      s_.direct = nullptr;  // no caller writes to it any more
      // Its calls in flight are the link's to fail or send again (Down).
      for (auto& [id, call] : s_.direct_calls) orphaned_.push_back(std::move(call));
      s_.direct_calls.clear();
      s_.direct_in_flight.store(0, std::memory_order_relaxed);
      s_.handed.clear();
      s_.direct_failure = Status::Ok();
      framed_.reset();
    }
  }

  // The framed connection takes callers' writes while the link is ready on it.
  void AllowDirectCalls(bool allow) {
    if (!framed_) return;
    std::lock_guard<std::mutex> lock(s_.direct_mu);
    s_.direct = allow ? framed_.get() : nullptr;
  }

  bool Send(const uint8_t* data, size_t size) {
    if (framed_) {
      std::lock_guard<std::mutex> lock(s_.direct_mu);
      if (framed_->queued() > kMaxFramedQueueBytes) return false;
      framed_->Send(std::span(data, size));
      return true;
    }
    dealer_unseen_ = true;  // see PollOnce
    try {
      if (!dealer_->send(zmq::const_buffer(nullptr, 0),
                         zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        return false;
      }
      return dealer_->send(zmq::const_buffer(data, size), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t&) {
      return false;
    }
  }

  // ---- the link's own requests --------------------------------------------------------------

  // Finishes the request whose body the caller built in fbb_ (after clearing it) and sends it.
  void SendOwn(Own kind, mfb::Body type, flatbuffers::Offset<void> body, Clock::time_point now) {
    const uint64_t id = next_own_id_++;
    fbb_.Finish(mfb::CreateRequest(fbb_, id, type, body, o_.agent_key));
    if (!Send(fbb_.GetBufferPointer(), fbb_.GetSize())) {
      return Down("cannot queue a message to " + endpoint_, now);
    }
    Call call;
    call.own = kind;
    calls_[id] = std::move(call);
    deadlines_.emplace_back(now + o_.timeout, id);
  }

  // The state while connecting: the attempt, and why the last one failed (what an operator
  // needs, e.g. a refused registration, stays in kvctl stat between attempts).
  std::string ConnectingText() const {
    if (attempt_ == 1 || last_down_.empty()) return "connecting";
    return "reconnecting, attempt " + std::to_string(attempt_) + " (the last: " + last_down_ + ")";
  }

  void Register(Clock::time_point now) {
    phase_ = Phase::kRegistering;
    AllowDirectCalls(false);  // until registered and mounted again
    fbb_.Clear();
    const auto body = mfb::CreateRegisterAgentDirect(fbb_, o_.agent_name.c_str(), o_.incarnation);
    SendOwn(Own::kRegister, mfb::Body::RegisterAgent, body.Union(), now);
  }

  void Heartbeat(Clock::time_point now) {
    next_heartbeat_ = now + o_.heartbeat;
    ++s_.heartbeats;
    fbb_.Clear();
    const auto body = mfb::CreateHeartbeat(fbb_, agent_id_, acked_fence_seq_);
    SendOwn(Own::kHeartbeat, mfb::Body::Heartbeat, body.Union(), now);
  }

  void OnOwnReply(Own kind, const mfb::Reply& reply, Clock::time_point now) {
    const std::string refused =
        reply.status() == 0 ? "" : (reply.message() ? reply.message()->str() : "no reason");
    switch (kind) {
      case Own::kRegister: {
        const auto* r = reply.body_as_RegisterAgentReply();
        if (r == nullptr) return Down("kvmaster refused to register this agent: " + refused, now);
        if (MovesToFramed(*r, now)) return;
        agent_id_ = r->agent_id();
        registered_master_ = r->master_epoch();
        if (ordered_ && registered_master_ < highest_epoch_) {
          ++s_.stale_replies;
          return Down("kvmaster " + endpoint_ + " registered this agent with epoch " +
                          std::to_string(registered_master_) + ", older than epoch " +
                          std::to_string(highest_epoch_) + " already seen (a deposed leader)",
                      now);
        }
        highest_epoch_ = std::max(highest_epoch_, registered_master_);
        s_.epoch.store(registered_master_, std::memory_order_relaxed);
        if (r->events_endpoint() != nullptr && r->events_endpoint()->size() > 0) {
          s_.SetEventEndpoints(r->events_endpoint()->str(), r->events_replay_endpoint()
                                                                ? r->events_replay_endpoint()->str()
                                                                : "");
        }
        // From here on the pool refuses ops placed by any other master; only then is it
        // mounted (offered for new replicas).
        if (o_.set_master_epoch) o_.set_master_epoch(registered_master_);
        if (registered_master_ != fenced_epoch_) {
          fenced_epoch_ = registered_master_;
          acked_fence_seq_ = 0;  // the new master's fences start over
        }
        phase_ = Phase::kMounting;
        fbb_.Clear();
        std::vector<flatbuffers::Offset<flatbuffers::String>> eps = {
            fbb_.CreateString(o_.data_endpoint)};
        const auto body =
            mfb::CreateMountPool(fbb_, agent_id_, 0, o_.pool_bytes, fbb_.CreateVector(eps));
        return SendOwn(Own::kMount, mfb::Body::MountPool, body.Union(), now);
      }
      case Own::kMount: {
        const auto* r = reply.body_as_MountPoolReply();
        if (r == nullptr) return Down("kvmaster refused to mount the node pool: " + refused, now);
        s_.agent_id.store(agent_id_, std::memory_order_release);
        s_.pool_id.store(r->pool_id(), std::memory_order_release);
        s_.on_framed.store(framed_now_, std::memory_order_relaxed);
        phase_ = Phase::kReady;
        AllowDirectCalls(true);
        backoff_ = o_.backoff_min;
        attempt_ = 0;
        next_heartbeat_ = now + o_.heartbeat;
        ++s_.registrations;
        LOG(INFO) << "master link: registered with kvmaster " << endpoint_
                  << (framed_now_ ? " (framed transport)" : " (ZMQ)") << " as agent " << agent_id_
                  << " (pool " << r->pool_id() << ", " << r->restored_objects()
                  << " restored object(s))";
        s_.SetState(LinkState::kReady, "ready");
        // Only a new master (another master epoch) restarted the event stream; after a mere link
        // drop the relay repairs what it missed through replay.
        if (registered_before_ && registered_master_ != last_master_epoch_) {
          LOG(INFO) << "master link: kvmaster " << endpoint_ << " is a new master (epoch "
                    << registered_master_ << ")";
          if (o_.on_master_restarted) o_.on_master_restarted();
        }
        last_master_epoch_ = registered_master_;
        registered_before_ = true;
        ResendParked(now);
        return;
      }
      case Own::kHeartbeat: {
        const auto* r = reply.body_as_HeartbeatReply();
        if (r != nullptr && r->known() && phase_ == Phase::kReady) return ApplyFences(*r);
        if (r == nullptr || r->known() || phase_ != Phase::kReady) return;
        LOG(WARNING) << "master link: kvmaster " << endpoint_
                     << " no longer knows this agent (it restarted or expired us); "
                        "registering again";
        s_.SetState(LinkState::kConnecting, "registering again");
        return Register(now);
      }
    }
  }

  // Applies the fences of a heartbeat reply; the next heartbeat acknowledges them.
  void ApplyFences(const mfb::HeartbeatReply& r) {
    if (r.fence_seq() == acked_fence_seq_ && r.write_watermark() <= applied_watermark_) return;
    if (!fbcheck::ElementsAligned(r.fenced_writes())) {  // the Verifier checks 4 bytes only
      LOG_EVERY_N(WARNING, 100) << "master link: a heartbeat reply's fences are misaligned; "
                                   "ignored (is kvmaster the same version?)";
      return;
    }
    Fences f;
    f.master_epoch = fenced_epoch_;
    f.fence_seq = r.fence_seq();
    f.write_watermark = r.write_watermark();
    if (r.fenced_writes() != nullptr) {
      f.fenced_writes.assign(r.fenced_writes()->begin(), r.fenced_writes()->end());
    }
    if (o_.apply_fences) o_.apply_fences(f);
    acked_fence_seq_ = f.fence_seq;
    applied_watermark_ = f.write_watermark;
    ++s_.fences_applied;
  }

  // Sends again the CallUntilAnswered requests that waited for the link.
  void ResendParked(Clock::time_point now) {
    std::vector<Call> parked = std::move(parked_);
    parked_.clear();
    for (Call& call : parked) {
      if (now >= call.retry_until) {
        FailParked(call);
        continue;
      }
      const uint64_t id = flatbuffers::GetRoot<mfb::Request>(call.request.data())->request_id();
      if (!Send(call.request.data(), call.request.size())) {
        parked_.push_back(std::move(call));
        continue;
      }
      ++s_.retried_calls;
      calls_[id] = std::move(call);
      deadlines_.emplace_back(now + o_.timeout, id);
    }
    s_.in_flight.store(calls_.size(), std::memory_order_relaxed);
  }

  void FailParked(Call& call) {
    Fail(call.done, call.on_link_thread,
         Status(ErrorCode::kMasterUnavailable,
                "no kvmaster answered within the request's retry time (" + s_.detail() + ")"));
  }

  // ---- the loop -----------------------------------------------------------------------------

  // One wait of the loop. The sockets are watched through their ZMQ_FD in a plain poll():
  // zmq_poll asks every socket for ZMQ_EVENTS before and after each wait, two system calls each
  // (libzmq looks at the socket's command mailbox), over ten per reply with two sockets. A
  // socket's fd signals when commands reach the socket, not for each message, so a socket is
  // drained to EAGAIN whenever its fd signals (that last receive takes in the commands and clears
  // the fd), and the DEALER once more after anything was sent on it: a send may take in the
  // command that announces a reply, which would then wait for the next timeout.
  void PollOnce() {
    if (framed_) return PollFramed();
    if (dealer_ && dealer_unseen_) ReceiveReplies(Clock::now());
    if (monitor_ && monitor_unseen_) OnMonitorEvents(Clock::now());
    const bool sockets = dealer_ != nullptr;
    pollfd fds[3] = {{s_.wake.get(), POLLIN, 0}, {dealer_fd_, POLLIN, 0}, {monitor_fd_, POLLIN, 0}};
    if (::poll(fds, sockets ? 3 : 1, static_cast<int>(PollTimeoutMs())) < 0) return;  // EINTR
    const auto now = Clock::now();
    if (fds[0].revents & POLLIN) {
      uint64_t count = 0;
      (void)!::read(s_.wake.get(), &count, sizeof(count));
      SendQueued(now);
    }
    // Each only while its socket is the one polled (a reply or event above may have closed it).
    if (sockets && monitor_ && (fds[2].revents & POLLIN)) OnMonitorEvents(now);
    if (sockets && dealer_ && (fds[1].revents & POLLIN)) ReceiveReplies(now);
  }

  void PollFramed() {
    short events = 0;
    {
      std::lock_guard<std::mutex> lock(s_.direct_mu);
      events = framed_->events();
      if (ServiceReads()) events &= ~POLLIN;  // a reply wakes nobody: the service thread reads
    }
    pollfd fds[2] = {{s_.wake.get(), POLLIN, 0}, {framed_->fd(), events, 0}};
    if (::poll(fds, 2, static_cast<int>(PollTimeoutMs())) < 0) return;  // EINTR
    const auto now = Clock::now();
    if (fds[0].revents & POLLIN) {
      uint64_t count = 0;
      (void)!::read(s_.wake.get(), &count, sizeof(count));
    }
    // The calls callers wrote themselves are queued without a wake-up: taken at every wake-up
    // (and when a reply names a call not taken yet, OnReply), so that their deadlines count.
    SendQueued(now);
    if (framed_) FlushFramed(now, fds[1].revents);
  }

  long PollTimeoutMs() const {
    const auto now = Clock::now();
    auto until = now + std::chrono::seconds(1);
    if (phase_ == Phase::kDown) until = std::min(until, retry_at_);
    if (phase_ == Phase::kReady) until = std::min(until, next_heartbeat_);
    // The deadlines of the calls the service thread wrote to a framed connection itself are
    // looked at this often (DirectCallOverdue).
    if (framed_ && phase_ == Phase::kReady) until = std::min(until, next_direct_check_);
    if (!deadlines_.empty()) until = std::min(until, deadlines_.front().first);
    for (const Call& call : parked_) until = std::min(until, call.retry_until);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count();
    return std::max<long>(0, ms + 1);
  }

  void SendQueued(Clock::time_point now) {
    for (Outgoing& o : s_.Take()) {
      if (phase_ != Phase::kReady && o.retried()) {
        parked_.push_back(Call{std::move(o.done), o.on_link_thread, Own::kHeartbeat,
                               std::move(o.request), o.retry_until});
        continue;
      }
      if (phase_ != Phase::kReady) {
        ++s_.failed_fast;
        Fail(o.done, o.on_link_thread, NotReady());
        continue;
      }
      const uint64_t id = flatbuffers::GetRoot<mfb::Request>(o.request.data())->request_id();
      if (calls_.count(id) != 0 || id == 0 || id >= kOwnIds) {
        Fail(o.done, o.on_link_thread, ReusedOrReservedId(id));
        continue;
      }
      if (!Send(o.request.data(), o.request.size())) {
        Fail(o.done, o.on_link_thread,
             Status(ErrorCode::kMasterUnavailable,
                    "the queue to kvmaster at " + endpoint_ + " is full; retry shortly"));
        continue;
      }
      Call call;
      call.done = std::move(o.done);
      call.on_link_thread = o.on_link_thread;
      if (o.retried()) {
        call.request = std::move(o.request);
        call.retry_until = o.retry_until;
      }
      calls_[id] = std::move(call);
      deadlines_.emplace_back(now + o_.timeout, id);
      s_.in_flight.store(calls_.size(), std::memory_order_relaxed);
    }
  }

  // Receives until EAGAIN (the socket's fd is then clear and nothing is left unseen) or 4096
  // messages (then the next wait looks again first).
  void ReceiveReplies(Clock::time_point now) {
    dealer_unseen_ = true;
    for (int budget = 0; budget < 4096 && dealer_; ++budget) {
      zmq::message_t delimiter;
      if (!dealer_->recv(delimiter, zmq::recv_flags::dontwait)) {
        dealer_unseen_ = false;
        return;
      }
      if (!delimiter.more()) continue;  // not [b"", Reply]: ignore
      zmq::message_t body;
      if (!dealer_->recv(body, zmq::recv_flags::dontwait)) return;
      while (body.more()) {  // drain anything beyond the two frames
        zmq::message_t extra;
        if (!dealer_->recv(extra, zmq::recv_flags::dontwait)) break;
        if (!extra.more()) break;
      }
      OnReply(std::make_shared<ReplyBytes>(std::move(body)), now);
    }
  }

  void OnReply(std::shared_ptr<ReplyBytes> bytes, Clock::time_point now) {
    flatbuffers::Verifier verifier(bytes->view.data(), bytes->view.size());
    if (bytes->view.empty() || !verifier.VerifyBuffer<mfb::Reply>(nullptr)) {
      LOG_EVERY_N(WARNING, 100) << "master link: a reply from " << endpoint_
                                << " failed verification; ignored";
      return;
    }
    const mfb::Reply* reply = flatbuffers::GetRoot<mfb::Reply>(bytes->view.data());
    auto found = calls_.find(reply->request_id());
    const bool direct = found == calls_.end() && framed_ && HasDirectCall(reply->request_id());
    // Else already failed by a deadline (cannot happen: new socket).
    if (found == calls_.end() && !direct) return;
    // A master that does not serve, or (with discovery) one deposed by a newer epoch, has done
    // nothing we may act on: the call stays in flight and fails (or waits for the next master,
    // CallUntilAnswered) with every other one as the link goes down.
    const uint64_t epoch = reply->master_epoch();
    if (reply->not_serving() || (ordered_ && epoch != 0 && epoch < highest_epoch_)) {
      ++s_.stale_replies;
      if (ordered_) backoff_ = std::min(backoff_, kOrderedBackoffMax);
      return Down(reply->not_serving()
                      ? "kvmaster " + endpoint_ + " does not serve now (" +
                            (reply->message() ? reply->message()->str() : std::string()) + ")"
                      : "kvmaster " + endpoint_ + " answered with epoch " + std::to_string(epoch) +
                            ", older than epoch " + std::to_string(highest_epoch_) +
                            " (a deposed leader)",
                  now);
    }
    if (ordered_) highest_epoch_ = std::max(highest_epoch_, epoch);
    if (direct) {  // the service thread's call, read here: its reply goes there
      agent::MasterReplyFn done = TakeDirectCall(reply->request_id());
      if (done) s_.post([done = std::move(done), bytes]() { done(bytes->view); });
      return;
    }
    Call call = std::move(found->second);
    calls_.erase(found);
    s_.in_flight.store(calls_.size(), std::memory_order_relaxed);
    if (!call.done) return OnOwnReply(call.own, *reply, now);
    if (call.on_link_thread) return call.done(bytes->view);
    s_.post([done = std::move(call.done), bytes]() { done(bytes->view); });
  }

  // The service thread reads the connection (RemoteMaster::TakeReplies) and takes its calls'
  // replies itself; only while the link is ready on it (direct_mu held).
  bool ServiceReads() const {
    return s_.direct != nullptr && s_.service_reads.load(std::memory_order_relaxed);
  }

  bool HasDirectCall(uint64_t id) {
    std::lock_guard<std::mutex> lock(s_.direct_mu);
    return s_.direct_calls.count(id) != 0;
  }

  agent::MasterReplyFn TakeDirectCall(uint64_t id) {
    std::lock_guard<std::mutex> lock(s_.direct_mu);
    auto found = s_.direct_calls.find(id);
    if (found == s_.direct_calls.end()) return {};
    agent::MasterReplyFn done = std::move(found->second.done);
    s_.direct_calls.erase(found);
    s_.direct_in_flight.store(s_.direct_calls.size(), std::memory_order_relaxed);
    return done;
  }

  // The service thread's calls on the framed connection: true when one is past its deadline
  // (looked at every kCheckDirectCallsEvery: deadlines are seconds).
  bool DirectCallOverdue(Clock::time_point now) {
    next_direct_check_ = now + kCheckDirectCallsEvery;
    if (s_.direct_in_flight.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard<std::mutex> lock(s_.direct_mu);
    for (const auto& [id, call] : s_.direct_calls) {
      if (now >= call.deadline) return true;
    }
    return false;
  }

  // Receives until EAGAIN (the monitor's fd is then clear) or until an event takes the link down.
  void OnMonitorEvents(Clock::time_point now) {
    monitor_unseen_ = false;
    while (monitor_) {
      zmq::message_t event;
      if (!monitor_->recv(event, zmq::recv_flags::dontwait)) return;
      uint16_t id = 0;
      if (event.size() >= sizeof(id)) std::memcpy(&id, event.data(), sizeof(id));
      while (event.more()) {
        zmq::message_t address;
        if (!monitor_->recv(address, zmq::recv_flags::dontwait) || !address.more()) break;
      }
      if (id == ZMQ_EVENT_CONNECTED) {
        connected_ = true;
      } else if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        handshake_done_ = true;
      } else if (id == ZMQ_EVENT_DISCONNECTED && !handshake_done_) {
        // Dropped before the handshake completed: the two ends disagree on authentication (a
        // peer with another secret, or only one of them with a secret).
        return Down(AuthMismatch(), now);
      } else if (id == ZMQ_EVENT_DISCONNECTED) {
        return Down("the connection to kvmaster " + endpoint_ + " was lost", now);
      } else if (id == ZMQ_EVENT_CONNECT_RETRIED && !connected_) {
        return Down("kvmaster " + endpoint_ + " refuses connections", now);
      } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
                 id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        return Down(AuthMismatch(), now);
      }
    }
  }

  void CheckDeadlines(Clock::time_point now) {
    std::erase_if(parked_, [&](Call& call) {
      if (now < call.retry_until) return false;
      FailParked(call);
      return true;
    });
    if (framed_ && now >= next_direct_check_ && DirectCallOverdue(now)) {
      ++s_.timeouts;
      return Down("kvmaster " + endpoint_ + " did not answer within " + Ms(o_.timeout), now);
    }
    while (!deadlines_.empty()) {
      const auto [deadline, id] = deadlines_.front();
      if (calls_.find(id) == calls_.end()) {
        deadlines_.pop_front();  // answered
        continue;
      }
      if (now < deadline) return;
      ++s_.timeouts;
      return Down("kvmaster " + endpoint_ + " did not answer within " + Ms(o_.timeout), now);
    }
  }

  // The link is down: fail every call in flight, drop the socket (no stale reply can arrive on
  // a new one), and schedule the next attempt.
  void Down(const std::string& why, Clock::time_point now) {
    const bool was_ready = phase_ == Phase::kReady;
    CloseSocket();
    phase_ = Phase::kDown;
    const bool fall_back = framed_now_ && !was_ready && o_.transport == MasterTransport::kAuto;
    if (fall_back) FallBackToZmq(why, now);
    framed_now_ = false;  // the next connection chooses again
    const Status failed(ErrorCode::kMasterUnavailable,
                        why + "; the agent reconnects by itself: retry in a moment");
    size_t failed_calls = 0;
    for (DirectCall& call : orphaned_) {
      if (call.retry_until != Clock::time_point::min() && now < call.retry_until) {
        parked_.push_back(Call{std::move(call.done), false, Own::kHeartbeat,
                               std::move(call.request), call.retry_until});
        continue;
      }
      ++failed_calls;
      Fail(call.done, false, failed);
    }
    orphaned_.clear();
    for (auto& [id, call] : calls_) {
      if (!call.done) continue;
      if (call.retried() && now < call.retry_until) {
        parked_.push_back(std::move(call));  // sent again after the next registration
        continue;
      }
      ++failed_calls;
      Fail(call.done, call.on_link_thread, failed);
    }
    s_.failed_in_flight += failed_calls;
    calls_.clear();
    deadlines_.clear();
    s_.in_flight.store(0, std::memory_order_relaxed);
    s_.SetState(LinkState::kDown, why);
    last_down_ = why;
    if (fall_back) {  // ZMQ at once (FallBackToZmq said why)
      retry_at_ = now;
      return;
    }
    retry_at_ = now + backoff_;
    if (was_ready) {
      ++s_.link_downs;
      LOG(WARNING) << "master link: " << why << "; " << failed_calls
                   << " request(s) in flight failed; reconnecting in " << Ms(backoff_);
    } else {
      LOG_EVERY_N(WARNING, 10) << "master link: " << why << "; retrying in " << Ms(backoff_);
    }
    backoff_ = std::min(ordered_ ? kOrderedBackoffMax : o_.backoff_max, backoff_ * 2);
  }

  // ---- the transport (kAuto) ----------------------------------------------------------------

  // A registration on the ROUTER whose reply names a framed endpoint: registers again there and
  // serves on it (true). The second registration is the same agent (same name, same
  // incarnation), so nothing in the master changes.
  bool MovesToFramed(const mfb::RegisterAgentReply& r, Clock::time_point now) {
    if (framed_now_ || ordered_ || o_.transport != MasterTransport::kAuto ||
        OnZmqAfterAFailure(now) || r.framed_endpoint() == nullptr ||
        r.framed_endpoint()->size() == 0) {
      return false;
    }
    const std::optional<std::string> framed =
        FramedOnMasterHost(r.framed_endpoint()->string_view(), o_.endpoint);
    if (!framed) {
      LOG_FIRST_N(WARNING, 1) << "master link: kvmaster " << endpoint_
                              << " names a framed endpoint that is not tcp://HOST:PORT ("
                              << r.framed_endpoint()->str() << "); staying on ZMQ";
      return false;
    }
    CloseSocket();
    calls_.clear();  // only the registration: no caller's call is sent before the link is ready
    deadlines_.clear();
    endpoint_ = *framed;
    framed_now_ = true;
    s_.SetWhere(o_.endpoint + ", framed transport at " + endpoint_);
    ConnectFramed(now, /*moving=*/true);
    return true;
  }

  // kAuto: a framed connection failed before it was ready. ZMQ now, the framed transport again
  // after framed_retry_after.
  void FallBackToZmq(const std::string& why, Clock::time_point now) {
    ++s_.framed_fallbacks;
    framed_failed_at_ = now;
    LOG(WARNING) << "master link: the framed transport at " << endpoint_
                 << " failed before it was ready (" << why << "); using kvmaster's ZMQ endpoint "
                 << (ordered_ ? std::string("(the leader's)") : o_.endpoint) << " for the next "
                 << Ms(o_.framed_retry_after)
                 << " (let this agent reach that port, or run it with --master-transport zmq)";
  }

  // ---- discovery (a cluster address) ------------------------------------------------------

  // Where this link reaches `leader`: its framed endpoint on the framed transport, else its
  // ROUTER.
  std::string EndpointOf(const coord::LeaderRecord& leader, Clock::time_point now) const {
    return FramedAt(leader, now) ? leader.framed : leader.rpc;
  }
  bool FramedAt(const coord::LeaderRecord& leader, Clock::time_point now) const {
    if (o_.transport == MasterTransport::kFramed) return true;
    return o_.transport == MasterTransport::kAuto && !leader.framed.empty() &&
           !OnZmqAfterAFailure(now);
  }
  bool OnZmqAfterAFailure(Clock::time_point now) const {
    return now < framed_failed_at_ + o_.framed_retry_after;
  }

  // Points endpoint_ at the leader etcd shows now; false (and down) when there is none (or, on
  // the framed transport, when it serves none).
  bool FindLeader(Clock::time_point now) {
    highest_epoch_ = std::max(highest_epoch_, s_.watcher->highest_epoch());
    const std::optional<coord::Leader> leader = s_.watcher->current();
    if (!leader) {
      std::string why;
      const bool reachable = s_.watcher->etcd_reachable(&why);
      Down("no kvmaster leads cluster " + s_.watcher->address().ToString() + " now" +
               (reachable ? " (an election may be under way)" : " (etcd: " + why + ")"),
           now);
      return false;
    }
    if (o_.transport == MasterTransport::kFramed && leader->record.framed.empty()) {
      Down("kvmaster " + leader->record.name + ", the leader of " +
               s_.watcher->address().ToString() +
               ", serves no framed transport (kvmaster --framed-listen): give it one, or run "
               "this agent with --master-transport zmq",
           now);
      return false;
    }
    framed_now_ = FramedAt(leader->record, now);
    endpoint_ = framed_now_ ? leader->record.framed : leader->record.rpc;
    leader_epoch_ = leader->epoch;
    s_.SetWhere(leader->record.name + " at " + endpoint_ + " (epoch " +
                std::to_string(leader->epoch) + " of " + s_.watcher->address().ToString() + ")");
    if (leader->epoch != notified_epoch_ || leader->record.events != notified_events_) {
      notified_epoch_ = leader->epoch;
      notified_events_ = leader->record.events;
      if (o_.on_leader_changed) o_.on_leader_changed(leader->record.events, leader->record.replay);
    }
    return true;
  }

  // etcd shows another leader (or none): leave the one we are on at once, and connect to the
  // new one without waiting for a backoff.
  void OnLeaderChanged(Clock::time_point now) {
    highest_epoch_ = std::max(highest_epoch_, s_.watcher->highest_epoch());
    const std::optional<coord::Leader> leader = s_.watcher->current();
    const bool same =
        leader && leader->epoch == leader_epoch_ && EndpointOf(leader->record, now) == endpoint_;
    backoff_ = o_.backoff_min;
    retry_at_ = now;
    if (same || phase_ == Phase::kDown) return;
    ++s_.leader_changes;
    const std::string to =
        leader ? leader->record.name + " (epoch " + std::to_string(leader->epoch) + ")"
               : std::string("none yet");
    LOG(WARNING) << "master link: the leader of " << s_.watcher->address().ToString()
                 << " changed from epoch " << leader_epoch_ << " to " << to << "; moving";
    Down("the leader changed to " + to, now);
    retry_at_ = now;
    backoff_ = o_.backoff_min;
  }

  std::string AuthMismatch() const {
    return "kvmaster " + endpoint_ +
           " and this agent do not authenticate each other (the handshake failed): give both "
           "the same --cluster-secret-file (or neither, on loopback); and --master must be "
           "kvmaster's --listen endpoint (its --framed-listen one takes --master-transport framed)";
  }

  Status NotReady() const {
    return Status(ErrorCode::kMasterUnavailable,
                  "kvmaster at " + endpoint_ + " is not reachable (" + s_.detail() +
                      "); the agent keeps reconnecting by itself: check that kvmaster runs, "
                      "then retry");
  }

  void Fail(agent::MasterReplyFn& done, bool on_link_thread, const Status& status) {
    if (on_link_thread) return done(status);
    s_.post([done = std::move(done), status]() { done(status); });
  }

  // With discovery, reconnecting never waits longer than this: a leader that paused serving
  // (etcd briefly away) or a new one is tried again soon.
  static constexpr std::chrono::milliseconds kOrderedBackoffMax{1000};

  RemoteMaster::Shared& s_;
  const RemoteMasterOptions& o_;
  const bool ordered_;           // discovery through etcd: epochs are ordered
  std::string endpoint_;         // the master's ROUTER now (with discovery: the leader's)
  uint64_t leader_epoch_ = 0;    // the leader endpoint_ belongs to (discovery)
  uint64_t highest_epoch_ = 0;   // the newest epoch seen (discovery): older replies are refused
  uint64_t notified_epoch_ = 0;  // the leader on_leader_changed was last called for
  std::string notified_events_;
  zmq::context_t context_{1};
  std::unique_ptr<zmq::socket_t> dealer_;
  std::unique_ptr<zmq::socket_t> monitor_;
  // The framed transport instead of dealer_ and monitor_ (framed_now_: on this connection).
  bool framed_now_ = false;
  // kAuto: when a framed connection last failed before it was ready (the link stays on ZMQ until
  // framed_retry_after later).
  Clock::time_point framed_failed_at_ = Clock::time_point::min();
  std::unique_ptr<FramedConnection> framed_;
  std::vector<std::shared_ptr<ReplyBytes>> framed_replies_;  // scratch of FlushFramed
  // The service thread's calls on a connection just closed, for Down to fail or send again.
  std::vector<DirectCall> orphaned_;
  static constexpr std::chrono::milliseconds kCheckDirectCallsEvery{50};
  Clock::time_point next_direct_check_ = Clock::time_point::min();
  uint64_t sockets_ = 0;
  int dealer_fd_ = -1;  // ZMQ_FD of dealer_ and monitor_ (theirs: not closed here)
  int monitor_fd_ = -1;
  bool dealer_unseen_ = false;  // dealer_ may hold replies its fd did not signal (PollOnce)
  bool monitor_unseen_ = false;
  bool connected_ = false;
  bool handshake_done_ = false;  // ZMTP handshake (with CURVE: authentication) completed
  Phase phase_ = Phase::kDown;
  uint32_t agent_id_ = 0;
  uint32_t attempt_ = 0;
  std::string last_down_;  // why the link last went down
  bool registered_before_ = false;
  uint64_t last_master_epoch_ = 0;  // of the master we were last registered with
  uint64_t registered_master_ = 0;  // of the master answering the registration in progress
  uint64_t fenced_epoch_ = 0;       // the master whose fences the pool applies
  uint64_t acked_fence_seq_ = 0;    // the newest fence_seq applied (sent in heartbeats)
  uint64_t applied_watermark_ = 0;
  std::vector<Call> parked_;  // CallUntilAnswered requests waiting for the link
  std::chrono::milliseconds backoff_;
  Clock::time_point retry_at_;
  Clock::time_point next_heartbeat_;
  uint64_t next_own_id_ = kOwnIds;
  std::unordered_map<uint64_t, Call> calls_;
  // (deadline, id) in send order: every call has the same timeout, so the front is the earliest.
  std::deque<std::pair<Clock::time_point, uint64_t>> deadlines_;
  flatbuffers::FlatBufferBuilder fbb_{1024};
};

}  // namespace

void RunLink(RemoteMaster::Shared* shared) { Link(shared).Run(); }

}  // namespace kvagent::master_link

// EventSubscriber: live SUB + replay DEALER, seq tracking, gap repair, reset detection.
//
// Invariants (all state belongs to the one thread that calls Next):
//  - expected_ is the seq of the next batch to deliver; everything below it in the current
//    run has been delivered or reported as a gap. A batch with seq < expected_ is a
//    duplicate (replay and live overlap) and is dropped.
//  - last_live_ is the highest seq seen on the live socket. One PUB run only moves
//    forward, so a live seq at or below it means the publisher restarted (kReset).
//  - While replaying_, the live socket is not read: ZMQ keeps those messages (up to rcvhwm),
//    and they come out as duplicates or successors once the replay has finished. held_ is the
//    live batch that revealed the gap; it is delivered after the replay unless replay
//    already delivered it.
//  - A replay that goes silent for replay_timeout is given up and its DEALER replaced, so a
//    late answer can never be mistaken for the answer to a later request.
//  - An idle probe is an ordinary replay from expected_ with nothing held: it delivers what
//    the live socket lost, or just the end marker.
//  - A replay that follows a delivered batch starts one seq early, at that batch (checked_):
//    the publisher's batch there must be the one delivered (PayloadHash). A restarted
//    publisher whose new run went past our position before we heard it live would otherwise
//    answer with its own batches, taken for the continuation of the old run; a different batch
//    there is reported as a reset, and the new run followed from seq 0. Only for a batch of at
//    most kMaxCheckedBytes: an idle probe (each second of silence) fetches it again.
#include "kvagent/events/event_subscriber.h"

#include <deque>
#include <functional>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "event_socket.h"
#include "kvagent/zmq/curve_auth.h"
#include "kvagent/zmq/zmq_limits.h"

namespace kvagent::events {
namespace {

using Clock = std::chrono::steady_clock;

// Live: [topic, seq, payload]; replay: at most [b"", topic, seq, payload].
constexpr size_t kMaxFrames = 4;
// A replay answers with up to the publisher's whole ring at once; let ZMQ queue it here rather
// than leave it queued on the publisher's ROUTER.
constexpr int kReplayRcvHwm = 100000;
// The largest delivered batch a replay asks for again, to check it begins where we are.
constexpr size_t kMaxCheckedBytes = size_t{256} << 10;

struct Received {
  uint64_t seq = 0;
  std::string topic;
  std::string payload;
};

}  // namespace

class EventSubscriber::Sockets {
 public:
  explicit Sockets(EventSubscriberOptions options)
      : options_(std::move(options)), context_(1), sub_(context_, zmq::socket_type::sub) {}

  Status Connect() {
    sub_.set(zmq::sockopt::rcvhwm, options_.rcvhwm);
    sub_.set(zmq::sockopt::linger, 0);
    sub_.set(zmq::sockopt::maxmsgsize, kMaxEventFrameBytes);
    sub_.set(zmq::sockopt::subscribe, "");
    if (options_.curve && options_.endpoint.rfind("tcp://", 0) == 0) {
      KVAGENT_RETURN_IF_ERROR(MakeCurveClient(sub_.handle(), *options_.curve));
    }
    KVAGENT_RETURN_IF_ERROR(ConnectEventSocket(sub_, options_.endpoint, "event SUB"));
    if (!options_.replay_endpoint.empty()) KVAGENT_RETURN_IF_ERROR(NewDealer());
    if (options_.from_seq) {
      expected_ = *options_.from_seq;
      history_replay_ = true;
      StartReplay();
    }
    return Status::Ok();
  }

  Result<EventDelivery> Next(std::chrono::milliseconds timeout) {
    const Clock::time_point deadline = Clock::now() + timeout;
    while (true) {
      if (!ready_.empty()) {
        EventDelivery d = std::move(ready_.front());
        ready_.pop_front();
        return d;
      }
      const Clock::time_point now = Clock::now();
      if (replaying_ && now >= replay_deadline_) {
        FinishReplay(/*timed_out=*/true);
        continue;
      }
      const std::optional<Clock::time_point> probe_at = NextProbe();
      if (probe_at && now >= *probe_at) {
        StartReplay();
        continue;
      }
      if (now >= deadline) {
        return Status(ErrorCode::kTimeout, "no KV event batch within the timeout");
      }
      Clock::time_point until = deadline;
      if (replaying_) until = std::min(until, replay_deadline_);
      if (probe_at) until = std::min(until, *probe_at);
      zmq::socket_t& socket = replaying_ ? *dealer_ : sub_;
      if (!WaitReadable(socket, until - now)) continue;
      DrainOne(socket);
    }
  }

  std::optional<uint64_t> expected_seq() const { return expected_; }
  EventSubscriberStats stats() const { return stats_; }

 private:
  Status NewDealer() {
    try {
      dealer_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
      dealer_->set(zmq::sockopt::linger, 0);
      dealer_->set(zmq::sockopt::rcvhwm, kReplayRcvHwm);
      dealer_->set(zmq::sockopt::maxmsgsize, kMaxEventFrameBytes);
    } catch (const zmq::error_t& e) {  // EMFILE: out of file descriptors
      dealer_.reset();
      return Internal(std::string("event subscriber: cannot create the replay DEALER: ") +
                      e.what());
    }
    if (options_.curve && options_.replay_endpoint.rfind("tcp://", 0) == 0) {
      KVAGENT_RETURN_IF_ERROR(MakeCurveClient(dealer_->handle(), *options_.curve));
    }
    return ConnectEventSocket(*dealer_, options_.replay_endpoint, "event replay DEALER");
  }

  // When an idle probe is due: only while live, with a replay socket and a known position.
  std::optional<Clock::time_point> NextProbe() const {
    if (replaying_ || !dealer_ || !expected_ || options_.idle_probe_interval.count() <= 0) {
      return std::nullopt;
    }
    return last_activity_ + options_.idle_probe_interval;
  }

  static bool WaitReadable(zmq::socket_t& socket, Clock::duration wait) {
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(wait);
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    try {
      return zmq::poll(&item, 1, ms) > 0 && (item.revents & ZMQ_POLLIN);
    } catch (const zmq::error_t&) {
      return false;  // EINTR: the caller's loop re-checks its deadline
    }
  }

  // Handles one message from `socket` (the SUB or, during a replay, the DEALER).
  void DrainOne(zmq::socket_t& socket) {
    bool too_many = false;
    if (!ReceiveMultipart(socket, kMaxFrames, &parts_, &too_many)) return;
    if (replaying_) {
      OnReplayMessage(too_many);
    } else {
      OnLiveMessage(too_many);
    }
  }

  void OnLiveMessage(bool too_many) {
    std::optional<uint64_t> seq;
    if (!too_many && parts_.size() == 3) seq = DecodeSeq(FrameView(parts_[1]));
    if (!seq) {
      ++stats_.malformed_messages;  // not [topic, seq(8), payload]
      return;
    }
    last_activity_ = Clock::now();
    Received batch{*seq, std::string(FrameView(parts_[0])), std::string(FrameView(parts_[2]))};
    if (last_live_ && *seq <= *last_live_) OnReset(*seq);
    last_live_ = *seq;
    if (!expected_) expected_ = *seq;  // no from_seq: the stream starts where we joined it
    if (*seq < *expected_) {
      ++stats_.duplicates_dropped;  // a replay delivered it already
      return;
    }
    if (*seq > *expected_ && dealer_) {
      held_ = std::move(batch);
      StartReplay();
      return;
    }
    Deliver(std::move(batch), /*replayed=*/false);
  }

  void OnReset(uint64_t seq) {
    EventDelivery d;
    d.kind = EventDelivery::Kind::kReset;
    d.seq = seq;
    d.previous_seq = expected_.value_or(1) - 1;
    ready_.push_back(std::move(d));
    ++stats_.resets;
    expected_ = 0;  // follow the new run from its start, repairing what we missed
  }

  void StartReplay() {
    checked_.reset();
    if (last_delivered_ && *expected_ > 0 && last_delivered_->seq == *expected_ - 1 &&
        last_delivered_->bytes <= kMaxCheckedBytes) {
      checked_ = last_delivered_;
    }
    const std::string request = EncodeSeq(checked_ ? checked_->seq : *expected_);
    const bool sent = SendFrame(*dealer_, "", true) && SendFrame(*dealer_, request, false);
    ++stats_.replay_requests;
    replay_supplied_ = false;
    replaying_ = true;
    replay_deadline_ = Clock::now() + options_.replay_timeout;
    if (!sent) FinishReplay(/*timed_out=*/true);  // DEALER queue full: treat as unanswered
  }

  void OnReplayMessage(bool too_many) {
    // [b"", topic, seq, payload] (vLLM >= 0.26, ours) or [b"", seq, payload] (SGLang).
    const size_t n = parts_.size();
    std::optional<uint64_t> seq;
    if (!too_many && (n == 3 || n == 4) && parts_[0].size() == 0) {
      seq = DecodeSeq(FrameView(parts_[n - 2]));
    }
    if (!seq) {
      ++stats_.malformed_messages;
      return;
    }
    replay_deadline_ = Clock::now() + options_.replay_timeout;
    const std::string_view payload = FrameView(parts_[n - 1]);
    if (*seq == kReplayEndSeq && payload.empty()) {
      FinishReplay(/*timed_out=*/false);
      return;
    }
    if (checked_) {
      const Delivered checked = *checked_;
      checked_.reset();  // the first batch of the answer decides: retained or not
      if (*seq == checked.seq) {
        if (PayloadHash(payload) != checked.hash) return RestartSeenInReplay(*seq);
        return;  // the batch delivered last, as asked for: the answer continues our run
      }
    }
    if (*seq < *expected_) {
      ++stats_.duplicates_dropped;
      return;
    }
    std::string topic = n == 4 ? std::string(FrameView(parts_[1])) : std::string();
    Deliver(Received{*seq, std::move(topic), std::string(payload)}, /*replayed=*/true);
  }

  // The publisher's batch at seq `seq` is not the one delivered: it restarted, and its new run
  // passed our position unheard. Reported as a reset; this answer (of the new run, from `seq`)
  // is dropped with its DEALER, and the new run asked for from seq 0.
  void RestartSeenInReplay(uint64_t seq) {
    ++stats_.resets_seen_in_replay;
    OnReset(seq);
    if (!NewDealer().ok()) {
      dealer_.reset();
      FinishReplay(/*timed_out=*/false);  // gaps are reported from now on, not repaired
      return;
    }
    StartReplay();
  }

  // What tells two batches at one seq apart, cheaply whatever their size: their sizes and their
  // first and last 256 bytes (a batch's ts, float64 seconds when it was built, is among its
  // first bytes, so a batch of another publisher run differs there).
  static uint64_t PayloadHash(std::string_view payload) {
    constexpr size_t kEdge = 256;
    const std::hash<std::string_view> hash;
    uint64_t h = payload.size();
    h = h * 0x9E3779B97F4A7C15ULL ^ hash(payload.substr(0, kEdge));
    if (payload.size() > kEdge) {
      h = h * 0x9E3779B97F4A7C15ULL ^ hash(payload.substr(payload.size() - kEdge));
    }
    return h;
  }

  void FinishReplay(bool timed_out) {
    replaying_ = false;
    last_activity_ = Clock::now();
    if (timed_out) {
      // Whatever the old DEALER still receives belongs to this abandoned request.
      // Should that fail (out of file descriptors), gaps are reported from now on, not repaired.
      if (!NewDealer().ok()) dealer_.reset();
    }
    if (held_) {
      Received held = std::move(*held_);
      held_.reset();
      if (held.seq < *expected_) {
        ++stats_.duplicates_dropped;  // replay delivered it
      } else {
        Deliver(std::move(held), /*replayed=*/false);
      }
    }
    history_replay_ = false;
  }

  // Delivers `batch` (seq >= expected_), reporting first what is missing below it.
  void Deliver(Received batch, bool replayed) {
    if (batch.seq > *expected_) {
      EventDelivery gap;
      gap.kind = EventDelivery::Kind::kGap;
      gap.seq = *expected_;
      gap.gap_to = batch.seq - 1;
      ++stats_.gaps_reported;
      stats_.missing_batches += gap.gap_to - gap.seq + 1;
      ready_.push_back(std::move(gap));
    }
    EventDelivery d;
    d.kind = EventDelivery::Kind::kBatch;
    d.seq = batch.seq;
    d.replayed = replayed;
    d.topic = std::move(batch.topic);
    d.payload = std::move(batch.payload);
    if (options_.decode) {
      auto decoded = DecodeEventBatch(d.payload);
      if (decoded.ok()) {
        d.batch = std::move(*decoded);
      } else {
        d.decode_status = decoded.status();
      }
    }
    last_delivered_ = Delivered{d.seq, PayloadHash(d.payload), d.payload.size()};
    ready_.push_back(std::move(d));
    expected_ = batch.seq + 1;
    ++stats_.delivered_batches;
    if (replayed) {
      ++stats_.replayed_batches;
      // A gap repair or idle probe that supplies lost batches repairs one gap (the from_seq
      // history is not one).
      if (!history_replay_ && !replay_supplied_) ++stats_.gaps_repaired;
      replay_supplied_ = true;
    }
  }

  EventSubscriberOptions options_;
  zmq::context_t context_;
  zmq::socket_t sub_;
  std::unique_ptr<zmq::socket_t> dealer_;  // null without a replay endpoint
  std::vector<zmq::message_t> parts_;      // reused receive buffer
  std::deque<EventDelivery> ready_;        // at most a gap, a reset and a batch at a time
  std::optional<uint64_t> expected_;
  std::optional<uint64_t> last_live_;
  bool replaying_ = false;
  Clock::time_point replay_deadline_;
  Clock::time_point last_activity_ = Clock::now();  // last live batch or end of a replay
  std::optional<Received> held_;
  struct Delivered {
    uint64_t seq = 0;
    uint64_t hash = 0;  // PayloadHash of its payload
    size_t bytes = 0;   // of its payload
  };
  std::optional<Delivered> last_delivered_;
  std::optional<Delivered> checked_;  // the batch the current replay must begin with
  bool history_replay_ = false;       // the current replay is the from_seq history
  bool replay_supplied_ = false;      // the current replay has delivered a batch
  EventSubscriberStats stats_;
};

Result<std::unique_ptr<EventSubscriber>> EventSubscriber::Start(EventSubscriberOptions options) {
  if (options.endpoint.empty()) {
    return InvalidParams("event subscriber: no endpoint; set the publisher's PUB endpoint");
  }
  if (options.from_seq && options.replay_endpoint.empty()) {
    return InvalidParams(
        "event subscriber: from_seq needs the publisher's replay endpoint; set replay_endpoint");
  }
  auto sockets = std::make_unique<Sockets>(std::move(options));
  try {
    KVAGENT_RETURN_IF_ERROR(sockets->Connect());
  } catch (const zmq::error_t& e) {  // a socket option ZMQ refused, e.g. a negative rcvhwm
    return InvalidParams(std::string("event subscriber: bad socket option: ") + e.what() +
                         "; check rcvhwm");
  }
  return std::unique_ptr<EventSubscriber>(new EventSubscriber(std::move(sockets)));
}

EventSubscriber::EventSubscriber(std::unique_ptr<Sockets> sockets) : sockets_(std::move(sockets)) {}
EventSubscriber::~EventSubscriber() = default;

Result<EventDelivery> EventSubscriber::Next(std::chrono::milliseconds timeout) {
  return sockets_->Next(timeout);
}
std::optional<uint64_t> EventSubscriber::expected_seq() const { return sockets_->expected_seq(); }
EventSubscriberStats EventSubscriber::stats() const { return sockets_->stats(); }

}  // namespace kvagent::events

#include "event_replay.h"

#include <glog/logging.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "event_socket.h"
#include "kvagent/events/kv_event.h"
#include "kvagent/zmq/zmq_limits.h"

namespace kvagent::events {
namespace {

// A replay request is `[identity, b"", start_seq]`; anything longer is malformed.
constexpr size_t kMaxRequestFrames = 3;
constexpr int kRequestsPerRound = 16;
// Messages one Pump sends in all, so that live batches get their turn.
constexpr int kMessagesPerPump = 1024;

}  // namespace

EventReplay::EventReplay(size_t max_batches, size_t max_bytes, std::string topic)
    : max_batches_(max_batches), max_bytes_(max_bytes), topic_(std::move(topic)) {}

void EventReplay::Configure(zmq::socket_t& router) {
  router.set(zmq::sockopt::sndhwm, kReplayPeerQueue);
  router.set(zmq::sockopt::router_mandatory, true);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::maxmsgsize, kMaxReplayRequestBytes);
}

bool EventReplay::Retain(uint64_t seq, std::shared_ptr<std::string> payload,
                         std::string* recycled) {
  if (max_batches_ == 0) return false;
  retained_bytes_ += payload->size();
  retained_.push_back(Batch{seq, std::move(payload)});
  while (retained_.size() > 1 &&
         (retained_.size() > max_batches_ || retained_bytes_ > max_bytes_)) {
    Batch& oldest = retained_.front();
    retained_bytes_ -= oldest.payload->size();
    TakeSentBuffer(oldest.payload, recycled);  // unless a queued message still refers to it
    retained_.pop_front();
  }
  return true;
}

void EventReplay::OnReadable(zmq::socket_t& router) {
  std::vector<zmq::message_t> parts;
  for (int served = 0; served < kRequestsPerRound; ++served) {
    bool too_many = false;
    if (!ReceiveMultipart(router, kMaxRequestFrames, &parts, &too_many)) return;
    std::optional<uint64_t> start;
    if (!too_many && parts.size() == 3 && parts[1].size() == 0) {
      start = DecodeSeq(FrameView(parts[2]));
    }
    if (!start) {
      ++stats_.bad_requests;
      LOG_EVERY_N(WARNING, 100) << "event publisher: ignored a malformed replay request ("
                                << parts.size() << " frames); expected [b\"\", start_seq(8)]";
      continue;
    }
    ++stats_.requests;
    Start(std::string(FrameView(parts[0])), *start);
  }
}

void EventReplay::Start(std::string identity, uint64_t from_seq) {
  for (Replay& r : replays_) {
    if (r.identity == identity) {  // asked again: start over from where it asks now
      r.next_seq = from_seq;
      r.last_progress = Clock::now();
      return;
    }
  }
  if (replays_.size() >= kMaxReplays) {
    ++stats_.refused;
    LOG_EVERY_N(WARNING, 100) << "event publisher: " << kMaxReplays
                              << " replays already run; refused one (the subscriber retries)";
    return;
  }
  replays_.push_back(Replay{std::move(identity), from_seq, Clock::now()});
}

EventReplay::Sent EventReplay::SendBatch(zmq::socket_t& router, const std::string& identity,
                                         uint64_t seq, const std::shared_ptr<std::string>& shared) {
  void* s = router.handle();
  // Only the first frame can find the peer's queue full (EAGAIN) or the peer gone
  // (EHOSTUNREACH); the rest of a message always follows it.
  if (zmq_send(s, identity.data(), identity.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
    return errno == EAGAIN ? Sent::kFull : Sent::kGone;
  }
  const std::string seq_frame = EncodeSeq(seq);
  // The end marker's topic is empty, whatever the publisher's.
  const std::string_view topic = seq == kReplayEndSeq ? std::string_view() : topic_;
  zmq_send(s, nullptr, 0, ZMQ_SNDMORE);
  zmq_send(s, topic.data(), topic.size(), ZMQ_SNDMORE);
  zmq_send(s, seq_frame.data(), seq_frame.size(), ZMQ_SNDMORE);
  SendSharedFrame(router, shared);
  return Sent::kOk;
}

void EventReplay::Pump(zmq::socket_t& router) {
  int budget = kMessagesPerPump;
  const Clock::time_point now = Clock::now();
  for (size_t i = 0; i < replays_.size() && budget > 0;) {
    Replay& r = replays_[i];
    bool done = false;
    bool blocked = false;
    auto it = std::lower_bound(retained_.begin(), retained_.end(), r.next_seq,
                               [](const Batch& b, uint64_t seq) { return b.seq < seq; });
    while (budget > 0) {
      const bool end = it == retained_.end();
      const Sent sent = end ? SendBatch(router, r.identity, kReplayEndSeq, nullptr)
                            : SendBatch(router, r.identity, it->seq, it->payload);
      if (sent == Sent::kFull) {
        blocked = true;
        break;
      }
      --budget;
      if (sent == Sent::kGone || end) {
        done = true;  // finished, or the subscriber left
        break;
      }
      r.next_seq = it->seq + 1;
      r.last_progress = now;
      ++it;
    }
    if (blocked && now - r.last_progress > kReplayStallLimit) {
      ++stats_.abandoned;
      LOG_EVERY_N(WARNING, 100) << "event publisher: a replay subscriber read nothing for "
                                << kReplayStallLimit.count() << " s; its replay is given up";
      done = true;
    }
    if (done) {
      replays_.erase(replays_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

}  // namespace kvagent::events

// Private to common/: the replay half of an EventPublisher — the retained batches and the
// replays in progress — owned by the publisher's thread together with its ROUTER socket.
//
// A replay is paced by its subscriber. The ROUTER runs with ZMQ_ROUTER_MANDATORY and a send
// high-water mark of kReplayPeerQueue messages per peer: a send to a peer whose queue is full
// fails with EAGAIN instead of being dropped, and the replay resumes from that seq on a later
// Pump. Batches go out zero-copy: each message refers to the retained payload (a shared
// string) instead of copying it. So a subscriber that asks and never reads holds at most
// kReplayPeerQueue references, not a copy of everything retained (it held ~95 MiB per request
// before), and a replay never needs a high-water mark as large as the retention.
//
// At most kMaxReplays replays run at once; a request from a peer that already has one restarts
// it at the new seq, a request beyond the limit is refused (counted; the subscriber's replay
// times out and it asks again). A replay whose subscriber reads nothing for kReplayStallLimit is
// given up. Batches evicted from retention while a replay runs are skipped (the subscriber sees
// the gap); batches published meanwhile are included. Each replay ends with the end marker.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

namespace kvagent::events {

inline constexpr size_t kMaxReplays = 64;
inline constexpr std::chrono::seconds kReplayStallLimit{10};

struct EventReplayStats {
  uint64_t requests = 0;      // well-formed replay requests
  uint64_t bad_requests = 0;  // malformed ones (ignored)
  uint64_t refused = 0;       // beyond kMaxReplays
  uint64_t abandoned = 0;     // subscribers that stopped reading
};

class EventReplay {
 public:
  EventReplay(size_t max_batches, size_t max_bytes, std::string topic);

  // Sets the ROUTER's options (before it binds).
  static void Configure(zmq::socket_t& router);

  // Keeps `payload` as batch `seq` (the newest batch is kept even when it alone is larger than
  // the byte budget). An evicted batch's buffer that nobody else refers to goes to `*recycled`
  // when it is larger than what that holds (for reuse). False, and nothing kept, when no batches
  // are to be kept.
  bool Retain(uint64_t seq, std::shared_ptr<std::string> payload, std::string* recycled);

  // Reads up to 16 requests from `router` and starts (or restarts) their replays.
  void OnReadable(zmq::socket_t& router);
  // Sends what the subscribers of pending replays have room for.
  void Pump(zmq::socket_t& router);
  bool pending() const { return !replays_.empty(); }

  const EventReplayStats& stats() const { return stats_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Batch {
    uint64_t seq = 0;
    std::shared_ptr<std::string> payload;
  };
  struct Replay {
    std::string identity;
    uint64_t next_seq = 0;
    Clock::time_point last_progress;
  };
  enum class Sent { kOk, kFull, kGone };

  void Start(std::string identity, uint64_t from_seq);
  // Sends [identity, b"", topic, seq, payload]; payload by reference when `shared` is set.
  Sent SendBatch(zmq::socket_t& router, const std::string& identity, uint64_t seq,
                 const std::shared_ptr<std::string>& shared);

  const size_t max_batches_;
  const size_t max_bytes_;
  const std::string topic_;
  std::deque<Batch> retained_;  // oldest first, seqs increasing
  size_t retained_bytes_ = 0;
  std::vector<Replay> replays_;
  EventReplayStats stats_;
};

}  // namespace kvagent::events

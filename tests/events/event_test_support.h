// Test-side tools for the event publisher/subscriber tests: a private temp dir for ipc
// endpoints, a raw SUB and a raw replay client (plain cppzmq, independent of the code under
// test), and event factories. Every socket here is used by the thread that created it.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "kvagent/events/event_publisher.h"
#include "kvagent/events/kv_event.h"
#include "temp_dir.h"

namespace kvagent::events::testing {

using Frames = std::vector<std::string>;

using kvagent::testing::TempDir;  // temp_dir.h

inline std::optional<Frames> ReceiveFrames(zmq::socket_t& socket,
                                           std::chrono::milliseconds timeout) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout) <= 0) return std::nullopt;
  Frames frames;
  zmq::message_t msg;
  do {
    if (!socket.recv(msg, zmq::recv_flags::none)) return std::nullopt;
    frames.emplace_back(static_cast<const char*>(msg.data()), msg.size());
  } while (msg.more());
  return frames;
}

inline void SendFrames(zmq::socket_t& socket, const Frames& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    socket.send(zmq::buffer(frames[i]),
                i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

// A plain SUB subscribed to everything.
class RawSubscriber {
 public:
  explicit RawSubscriber(const std::string& endpoint)
      : context_(1), socket_(context_, zmq::socket_type::sub) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::subscribe, "");
    socket_.connect(endpoint);
  }
  std::optional<Frames> Receive(std::chrono::milliseconds timeout) {
    return ReceiveFrames(socket_, timeout);
  }

 private:
  zmq::context_t context_;
  zmq::socket_t socket_;
};

// One replay request through a fresh DEALER: every message up to and including the end
// marker, or what arrived before `timeout` of silence.
inline std::vector<Frames> RequestReplay(
    const std::string& endpoint, const Frames& request,
    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(endpoint);
  SendFrames(dealer, request);
  std::vector<Frames> replies;
  while (auto frames = ReceiveFrames(dealer, timeout)) {
    replies.push_back(*frames);
    if (frames->size() == 4 && (*frames)[2] == std::string(8, '\xff')) break;
  }
  return replies;
}

inline std::vector<Frames> RequestReplayFrom(const std::string& endpoint, uint64_t start) {
  return RequestReplay(endpoint, {"", EncodeSeq(start)});
}

inline bool IsEndMarker(const Frames& f) { return f == Frames{"", "", std::string(8, '\xff'), ""}; }

// A replay server of our own making, for layouts and behaviours EventPublisher does not have:
// a ROUTER (bound here, then used only by its thread) that answers each `[b"", start_seq]`
// with the given batches whose seq >= start_seq, in the 4-frame `[b"", topic, seq, payload]`
// or the 3-frame `[b"", seq, payload]` (SGLang) layout, then the end marker in the same layout.
class ReplayServer {
 public:
  ReplayServer(zmq::context_t& context, std::map<uint64_t, std::string> batches, bool with_topic)
      : router_(context, zmq::socket_type::router) {
    router_.set(zmq::sockopt::linger, 0);
    router_.bind("tcp://127.0.0.1:*");
    endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this, batches = std::move(batches), with_topic] {
      while (!stop_.load()) {
        auto request = ReceiveFrames(router_, std::chrono::milliseconds(20));
        if (!request || request->size() != 3) continue;
        ++requests_;
        const uint64_t start = DecodeSeq((*request)[2]).value_or(0);
        auto reply = [&](const std::string& seq, const std::string& payload) {
          Frames f{(*request)[0], ""};
          if (with_topic) f.push_back("");
          f.push_back(seq);
          f.push_back(payload);
          SendFrames(router_, f);
        };
        for (auto it = batches.lower_bound(start); it != batches.end(); ++it) {
          reply(EncodeSeq(it->first), it->second);
        }
        reply(EncodeSeq(kReplayEndSeq), "");
      }
    });
  }
  ~ReplayServer() {
    stop_.store(true);
    thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  int requests() const { return requests_.load(); }

 private:
  zmq::socket_t router_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

// A BlockStored whose hash is `n`, with 4 tokens of block size 4 and a non-ASCII session.
inline KvEvent StoredEvent(uint64_t n, size_t tokens = 4) {
  BlockStored e;
  e.block_hashes = {BlockHash::Unsigned(n)};
  e.token_ids.assign(tokens, static_cast<uint32_t>(n));
  e.block_size = static_cast<uint32_t>(tokens);
  e.session_id = "sessão-" + std::to_string(n % 7);
  return e;
}

// A started publisher, or nullptr after a test failure that says why.
inline std::unique_ptr<EventPublisher> StartPublisher(EventPublisherOptions options) {
  auto publisher = EventPublisher::Start(std::move(options));
  EXPECT_TRUE(publisher.ok()) << publisher.status().ToString();
  return publisher.ok() ? std::move(*publisher) : nullptr;
}

// PUB and replay ROUTER on loopback ports the OS picks.
inline EventPublisherOptions TcpPublisherOptions() {
  EventPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:0";
  o.replay_endpoint = "tcp://127.0.0.1:0";
  return o;
}

// PUB and replay ROUTER as ipc sockets in `dir`.
inline EventPublisherOptions IpcPublisherOptions(const TempDir& dir) {
  EventPublisherOptions o;
  o.endpoint = dir.Ipc("events.sock");
  o.replay_endpoint = dir.Ipc("events-replay.sock");
  return o;
}

// Publishes `count` batches of one event each (hashes first, first+1, ...).
inline void PublishSingles(EventPublisher& publisher, uint64_t first, uint64_t count,
                           size_t tokens = 4) {
  for (uint64_t i = first; i < first + count; ++i) {
    publisher.Publish(StoredEvent(i, tokens));
    publisher.Flush();
  }
}

// Publishes single-event batches until `sub` receives one (the SUB's subscription has then
// reached the PUB); returns the seq of that batch. Bounded: fails the test after ~10 s.
inline std::optional<uint64_t> WarmUp(EventPublisher& publisher, RawSubscriber& sub) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    publisher.Publish(StoredEvent(attempt));
    publisher.Flush();
    if (auto frames = sub.Receive(std::chrono::milliseconds(50))) {
      if (frames->size() == 3) return DecodeSeq((*frames)[1]);
    }
  }
  ADD_FAILURE() << "the SUB never received a batch";
  return std::nullopt;
}

}  // namespace kvagent::events::testing

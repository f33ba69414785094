// A DEALER client for kvmaster's ROUTER in tests: `[b"", request]` out, `[b"", reply]` back,
// with a receive timeout so a broken master fails the test instead of hanging it.
#pragma once

#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "rpc_test_util.h"

namespace kvagent::master::testing {

class MasterClient {
 public:
  explicit MasterClient(const std::string& endpoint, int timeout_ms = 10000)
      : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::rcvtimeo, timeout_ms);
    socket_.connect(endpoint);
  }

  // Sends raw frames (for malformed-message tests).
  void SendFrames(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      socket_.send(zmq::buffer(frames[i]),
                   i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  void Send(const Bytes& request) {
    socket_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(request.data(), request.size()), zmq::send_flags::none);
  }
  // The next reply's body, or nullopt on timeout or a reply that is not [b"", body].
  std::optional<std::string> Receive() {
    std::vector<zmq::message_t> frames;
    auto n = zmq::recv_multipart(socket_, std::back_inserter(frames));
    if (!n || frames.size() != 2 || frames[0].size() != 0) return std::nullopt;
    return frames[1].to_string();
  }
  // Send + Receive + verify; `*storage` keeps the bytes the returned pointer points into.
  const fb::Reply* Call(const Bytes& request, std::string* storage) {
    Send(request);
    auto body = Receive();
    if (!body) return nullptr;
    *storage = std::move(*body);
    return ParseReply(storage->data(), storage->size());
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

}  // namespace kvagent::master::testing

// Test support: a client that speaks the protocol by hand (ipc + agent.fbs, no SDK), so tests
// can put arbitrary bytes on the request ring and scribble over the shared control blocks.
#pragma once

#include <fcntl.h>
#include <flatbuffers/flatbuffers.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kvagent/ipc/frame_ring.h"
#include "kvagent/ipc/segment.h"
#include "kvagent/ipc/unix_socket.h"
#include "kvagent/schemas/agent_generated.h"

namespace kvagent::testing {

class RawClient {
 public:
  // Connects and completes the handshake; ok() says whether it worked, error() why not.
  // With a non-zero `memory_probe_address` the Hello asks for process memory (agent.fbs).
  explicit RawClient(const std::string& socket_path, uint64_t arena_bytes = 1 << 20,
                     uint64_t ring_bytes = 0, uint64_t memory_probe_address = 0,
                     uint64_t memory_probe_value = 0) {
    auto fd = ipc::ConnectUnix(socket_path);
    if (!fd.ok()) {
      Fail(fd.status().ToString());
      return;
    }
    socket_ = std::move(*fd);
    flatbuffers::FlatBufferBuilder fbb;
    auto name = fbb.CreateString("raw-client");
    fbb.Finish(proto::CreateHello(fbb, static_cast<uint32_t>(proto::ProtocolVersion::Current), name,
                                  arena_bytes, ring_bytes, memory_probe_address,
                                  memory_probe_value));
    if (!ipc::SendMessage(socket_.get(), {fbb.GetBufferPointer(), fbb.GetSize()}, kTimeout).ok()) {
      Fail("send Hello");
      return;
    }
    ipc::UniqueFd segment_fd;
    auto answer = ipc::ReceiveMessage(socket_.get(), kTimeout, &segment_fd);
    if (!answer.ok()) {
      Fail(answer.status().ToString());
      return;
    }
    welcome_bytes_ = *answer;
    const auto* w = flatbuffers::GetRoot<proto::Welcome>(welcome_bytes_.data());
    if (w->status() != 0) {
      Fail("refused: " + w->message()->str());
      return;
    }
    // A duplicate stays with the test, which may try to resize it (the seals refuse).
    segment_fd_ = ipc::UniqueFd(::fcntl(segment_fd.get(), F_DUPFD_CLOEXEC, 0));
    auto segment = ipc::Segment::Open(segment_fd.Release(), w->segment_bytes());
    if (!segment.ok()) {
      Fail(segment.status().ToString());
      return;
    }
    segment_ = std::make_unique<ipc::Segment>(std::move(*segment));
    producer_ = ipc::FrameProducer(segment_->request_ring());
    consumer_ = ipc::FrameConsumer(segment_->completion_ring());
    client_id_ = w->client_id();
    flatbuffers::FlatBufferBuilder attached;
    attached.Finish(proto::CreateAttached(attached, client_id_));
    if (!ipc::SendMessage(socket_.get(), {attached.GetBufferPointer(), attached.GetSize()},
                          kTimeout)
             .ok()) {
      Fail("send Attached");
      return;
    }
    ok_ = true;
  }

  bool ok() const { return ok_; }
  const proto::Welcome& welcome() const {
    return *flatbuffers::GetRoot<proto::Welcome>(welcome_bytes_.data());
  }
  const std::string& error() const { return error_; }
  ipc::Segment& segment() { return *segment_; }
  int socket_fd() const { return socket_.get(); }
  // The client's own descriptor of its segment (what a hostile client would ftruncate).
  int segment_fd() const { return segment_fd_.get(); }
  uint64_t client_id() const { return client_id_; }

  bool Send(uint64_t request_id, std::span<const uint8_t> frame) {
    return producer_.TryPush(request_id, frame) == ipc::PushResult::kOk;
  }

  // The next completion frame (request_id + bytes), or false after `timeout`.
  bool Receive(uint64_t* request_id, std::vector<uint8_t>* frame,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    if (!consumer_.WaitForData(std::chrono::microseconds(100), timeout)) return false;
    ipc::Frame f;
    if (consumer_.Peek(&f) != ipc::PeekResult::kFrame) return false;
    *request_id = f.request_id;
    frame->assign(f.payload.begin(), f.payload.end());
    consumer_.Pop();
    return true;
  }

  // True once the agent has closed our connection (EOF), waiting at most `timeout`.
  bool WaitForEof(std::chrono::milliseconds timeout) {
    auto r = ipc::ReceiveMessage(socket_.get(), timeout);
    return !r.ok() && r.status().code() == ErrorCode::kAgentUnavailable;
  }

 private:
  static constexpr std::chrono::milliseconds kTimeout{5000};
  void Fail(std::string why) { error_ = std::move(why); }

  ipc::UniqueFd socket_;
  ipc::UniqueFd segment_fd_;
  std::vector<uint8_t> welcome_bytes_;
  std::unique_ptr<ipc::Segment> segment_;
  ipc::FrameProducer producer_;
  ipc::FrameConsumer consumer_;
  uint64_t client_id_ = 0;
  bool ok_ = false;
  std::string error_;
};

}  // namespace kvagent::testing

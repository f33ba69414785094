#include "client_connection.h"

namespace kvagent::agent {

ClientConnection::ClientConnection(ClientId id, std::string name, ipc::PeerCredentials peer,
                                   std::shared_ptr<ipc::Segment> segment,
                                   std::shared_ptr<const ProcessMemory> memory)
    : id_(id),
      name_(std::move(name)),
      peer_(peer),
      segment_(std::move(segment)),
      memory_(std::move(memory)),
      requests_(segment_->request_ring()),
      completions_(segment_->completion_ring()) {}

void ClientConnection::MarkBroken(std::string reason) {
  if (broken_reason_.empty()) broken_reason_ = std::move(reason);
}

void ClientConnection::PushCompletion(uint64_t request_id, std::span<const uint8_t> frame) {
  if (broken()) return;
  if (backlog_.empty()) {
    switch (completions_.TryAppend(request_id, frame)) {
      case ipc::PushResult::kOk:
        return;
      case ipc::PushResult::kFull:
        break;
      case ipc::PushResult::kTooLarge:
        MarkBroken("a completion did not fit the completion ring");  // caller's bug
        return;
      case ipc::PushResult::kCorrupt:
        MarkBroken("the completion ring's consumer index is corrupt");
        return;
    }
  }
  backlog_.push_back({request_id, std::vector<uint8_t>(frame.begin(), frame.end())});
}

bool ClientConnection::FlushBacklog() {
  bool moved = false;
  while (!backlog_.empty() && !broken()) {
    const PendingCompletion& next = backlog_.front();
    const ipc::PushResult r = completions_.TryAppend(next.request_id, next.frame);
    if (r == ipc::PushResult::kFull) break;
    if (r != ipc::PushResult::kOk) {
      MarkBroken("the completion ring's consumer index is corrupt");
      break;
    }
    backlog_.pop_front();
    moved = true;
  }
  return moved;
}

ipc::FutexWaiter ClientConnection::BeginWait(bool* has_work) {
  if (backlogged()) {
    waiting_for_space_ = true;
    const uint32_t seq = completions_.BeginSpaceWait();
    if (completions_.HasSpaceFor(backlog_.front().frame.size())) *has_work = true;
    return {completions_.space_word(), seq, ipc::FutexScope::kShared};
  }
  waiting_for_space_ = false;
  const uint32_t seq = requests_.BeginDataWait();
  if (requests_.HasData()) *has_work = true;
  return {requests_.data_word(), seq, ipc::FutexScope::kShared};
}

void ClientConnection::EndWait() {
  if (waiting_for_space_) {
    completions_.EndSpaceWait();
  } else {
    requests_.EndDataWait();
  }
}

void ClientConnection::Flush() { completions_.Publish(); }

void ClientConnection::SignalShutdown() {
  Flush();
  segment_->header().agent_shutdown.store(1, std::memory_order_seq_cst);
  ipc::RingRef ring = segment_->completion_ring();
  ring.control->data_seq.fetch_add(1, std::memory_order_seq_cst);
  ipc::FutexWake(&ring.control->data_seq);
  ipc::RingRef req = segment_->request_ring();
  req.control->space_seq.fetch_add(1, std::memory_order_seq_cst);
  ipc::FutexWake(&req.control->space_seq);
}

}  // namespace kvagent::agent

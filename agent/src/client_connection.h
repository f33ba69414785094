// One attached client as the ring service sees it: its mapping, the agent's ends of its two
// rings, and completions waiting for room on its completion ring.
//
// Owned and used by the ring-service thread only. Everything read from the client's segment is
// treated as hostile: the rings check every index and record header (ipc/frame_ring.h), and a
// violation marks the connection broken; the service then disconnects the client.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvagent/agent/request_handler.h"
#include "kvagent/ipc/frame_ring.h"
#include "kvagent/ipc/segment.h"
#include "kvagent/ipc/unix_socket.h"
#include "process_memory.h"

namespace kvagent::agent {

class ClientConnection {
 public:
  ClientConnection(ClientId id, std::string name, ipc::PeerCredentials peer,
                   std::shared_ptr<ipc::Segment> segment,
                   std::shared_ptr<const ProcessMemory> memory = nullptr);
  ClientConnection(const ClientConnection&) = delete;
  ClientConnection& operator=(const ClientConnection&) = delete;

  ClientId id() const { return id_; }
  const std::string& name() const { return name_; }
  const ipc::PeerCredentials& peer() const { return peer_; }
  const std::shared_ptr<ipc::Segment>& segment() const { return segment_; }
  uint64_t arena_bytes() const { return segment_->layout().arena_bytes; }
  // The client's own memory when it was granted at the handshake (process_memory.h), or null.
  const std::shared_ptr<const ProcessMemory>& memory() const { return memory_; }
  ipc::FrameConsumer& requests() { return requests_; }

  // Queues a completion: straight onto the ring when it has room and nothing is waiting,
  // otherwise behind the backlog (order is kept). A completion larger than the ring must not be
  // passed (the caller replaces it with a small failure). Marks the connection broken when the
  // client's ring index is corrupt.
  void PushCompletion(uint64_t request_id, std::span<const uint8_t> frame);

  // Makes every completion queued by PushCompletion/FlushBacklog visible to the client and wakes
  // it if it sleeps. Completions are appended in bursts and published once per burst.
  void Flush();

  // Moves backlog onto the ring while it fits. Returns true if anything moved.
  bool FlushBacklog();
  bool backlogged() const { return !backlog_.empty(); }

  // Sleep protocol for the service's futex_waitv: advertises the wait this connection needs (data
  // on the request ring, or room on the completion ring when backlogged), and says whether the
  // connection already has work (then the service must not sleep).
  ipc::FutexWaiter BeginWait(bool* has_work);
  void EndWait();

  // Tells the client the agent is going away: sets the header's shutdown word and wakes any
  // thread of the client sleeping on either ring.
  void SignalShutdown();

  bool broken() const { return !broken_reason_.empty(); }
  const std::string& broken_reason() const { return broken_reason_; }
  void MarkBroken(std::string reason);

 private:
  struct PendingCompletion {
    uint64_t request_id;
    std::vector<uint8_t> frame;
  };

  const ClientId id_;
  const std::string name_;
  const ipc::PeerCredentials peer_;
  std::shared_ptr<ipc::Segment> segment_;
  std::shared_ptr<const ProcessMemory> memory_;
  ipc::FrameConsumer requests_;
  ipc::FrameProducer completions_;
  std::deque<PendingCompletion> backlog_;
  bool waiting_for_space_ = false;
  std::string broken_reason_;
};

}  // namespace kvagent::agent

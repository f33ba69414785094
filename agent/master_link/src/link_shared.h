// The state RemoteMaster's callers (service thread, relay thread) share with the link thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvagent/common/framed_connection.h"
#include "kvagent/coord/leader_watch.h"
#include "kvagent/ipc/unix_socket.h"
#include "kvagent/master_link/remote_master.h"

namespace kvagent::master_link {

enum class LinkState : int { kConnecting, kReady, kDown };

// Request ids of blocking calls from other threads (ListKeys) are in [2^62, 2^63): apart from the
// pipeline's (below 2^62) and the link's own (from 2^63).
inline constexpr uint64_t kBlockingIds = uint64_t{1} << 62;

// Bytes queued on a framed connection (not yet taken by the socket) beyond which a request is
// refused ("queue full") rather than buffered: a master that stopped reading costs the agent
// this much at most.
inline constexpr size_t kMaxFramedQueueBytes = size_t{256} << 20;

// A caller's request id that is 0, already in flight or in a range the link keeps for itself.
inline Status ReusedOrReservedId(uint64_t id) {
  return Internal("master request id " + std::to_string(id) + " is reused or reserved");
}

// A request on its way to the link thread.
struct Outgoing {
  flatbuffers::DetachedBuffer request;
  agent::MasterReplyFn done;
  // `done` runs on the link thread itself (blocking callers that wait on it) instead of being
  // posted to the service thread.
  bool on_link_thread = false;
  // CallUntilAnswered: kept across link failures until then (max(): a plain Call).
  std::chrono::steady_clock::time_point retry_until = std::chrono::steady_clock::time_point::min();
  bool retried() const { return retry_until != std::chrono::steady_clock::time_point::min(); }
};

// A call its caller (the service thread) wrote to the framed connection itself
// (RemoteMaster::CallDirect), kept in Shared::direct_calls until its reply.
struct DirectCall {
  agent::MasterReplyFn done;
  // CallUntilAnswered: the request, to send again after a reconnect, and until when.
  flatbuffers::DetachedBuffer request;
  std::chrono::steady_clock::time_point retry_until = std::chrono::steady_clock::time_point::min();
  std::chrono::steady_clock::time_point deadline;  // no reply by then: the link goes down
};

class RemoteMaster::Shared {
 public:
  explicit Shared(RemoteMasterOptions o) : options(std::move(o)) {}

  const RemoteMasterOptions options;

  // ---- queue: any thread -> link thread
  // Queues `o` and wakes the link thread (one eventfd write per burst: only when the queue was
  // empty). False once Close() ran: `o` is dropped without running its callback.
  bool Push(Outgoing o, bool wake = true);
  std::vector<Outgoing> Take();
  // After the link thread exited: refuses every later Push and returns what is still queued
  // (pushed after the thread's last Take).
  std::vector<Outgoing> Close();
  ipc::UniqueFd wake;  // eventfd, in the link thread's poll set
  std::atomic<bool> stop{false};
  void Wake();

  // Set by Bind before the first Call; read by the link thread after it took that Call from the
  // queue (the queue's mutex orders the two).
  agent::PostFn post;

  // ---- the framed transport: while the link is ready on a framed connection, the service
  // thread writes its calls to the connection itself and reads their replies itself
  // (RemoteMaster::TakeReplies), with no wake-up of the link thread either way. `direct_mu`
  // guards every use of the connection by either thread, and the fields below up to
  // direct_failure; the link thread sets `direct` when it is ready, and clears it, taking what
  // is left in direct_calls, before it drops the connection (so a direct call is always on the
  // link's current connection).
  std::mutex direct_mu;
  FramedConnection* direct = nullptr;
  std::unordered_map<uint64_t, DirectCall> direct_calls;  // by request id
  // Replies the service thread read that are not its calls' (the link's own, or ones the link
  // must judge: not serving, another epoch, unverifiable), for the link thread (woken).
  std::vector<std::vector<uint8_t>> handed;
  // The connection failed under the service thread's read: for the link thread to act on.
  Status direct_failure;
  std::atomic<size_t> direct_in_flight{0};  // direct_calls.size(), for a look without the lock
  // The service thread reads the connection (set by TakeReplies when it has calls out, cleared
  // by StopTakingReplies before it sleeps, which then wakes the link thread): meanwhile the link
  // thread does not poll the connection for input, so a reply wakes nobody.
  std::atomic<bool> service_reads{false};
  // Replies the service thread took itself (a counter for kvctl stat).
  std::atomic<uint64_t> taken_by_service{0};

  // ---- discovery (a cluster address): the watcher's thread sets leader_changed and wakes the
  // link thread, which reads watcher->current(). Created before the link thread, destroyed
  // after it.
  std::unique_ptr<coord::LeaderWatcher> watcher;
  std::atomic<bool> leader_changed{false};
  std::string Where() const;  // "tcp://..." or "NAME at tcp://... (epoch E of etcd://...)"
  void SetWhere(std::string where);

  // ---- state: written by the link thread, read anywhere
  std::atomic<LinkState> state{LinkState::kConnecting};
  std::atomic<uint32_t> agent_id{0};
  std::atomic<uint32_t> pool_id{0};
  void SetState(LinkState s, std::string detail);  // also wakes WaitReady
  std::string detail() const;
  // The master's event endpoints from its last RegisterAgentReply (as it bound them); empty
  // until a master that tells them answered.
  void SetEventEndpoints(std::string events, std::string replay);
  std::pair<std::string, std::string> event_endpoints() const;
  std::mutex state_mu;
  std::condition_variable ready_cv;

  // ---- counters
  std::atomic<uint64_t> registrations{0};
  std::atomic<bool> on_framed{false};         // the link is ready on the framed transport
  std::atomic<uint64_t> framed_fallbacks{0};  // kAuto: framed connections failed, back to ZMQ
  std::atomic<uint64_t> link_downs{0};
  std::atomic<uint64_t> timeouts{0};
  std::atomic<uint64_t> heartbeats{0};
  std::atomic<uint64_t> failed_fast{0};       // calls refused while not ready
  std::atomic<uint64_t> failed_in_flight{0};  // calls failed when the link went down
  std::atomic<uint64_t> retried_calls{0};     // calls sent again after a reconnect
  std::atomic<uint64_t> fences_applied{0};    // heartbeat replies whose fences were applied
  std::atomic<uint64_t> epoch{0};             // the epoch of the master registered with
  std::atomic<uint64_t> leader_changes{0};    // moves to a new leader (discovery)
  std::atomic<uint64_t> stale_replies{0};     // replies refused: an older epoch, or not serving
  std::atomic<uint64_t> in_flight{0};
  std::atomic<uint64_t> blocking_calls{0};  // numbers the blocking calls' request ids

  std::thread thread;

 private:
  std::mutex queue_mu_;
  std::vector<Outgoing> queue_;
  bool closed_ = false;                                  // guarded by queue_mu_
  std::string detail_;                                   // guarded by state_mu
  std::string where_;                                    // guarded by state_mu
  std::pair<std::string, std::string> event_endpoints_;  // guarded by state_mu
};

// The link thread's loop (master_link.cc): runs until shared->stop.
void RunLink(RemoteMaster::Shared* shared);

}  // namespace kvagent::master_link

// The SDK's side of one agent connection: the socket (liveness), the mapped segment, the
// producer end of the request ring, the consumer end of the completion ring, and the table of
// calls in flight.
//
// Calls in flight live in a fixed table of slots; a request id is (generation << 32 | slot),
// so a completion finds its slot without a lookup and a stale one (for a slot reused since) is
// recognized and dropped. Slot states: free -> waiting -> done -> free, or waiting -> abandoned
// (the caller gave up) -> free when its completion arrives. The reaper and an abandoning caller
// decide who frees the slot by exchanging the state: whoever sees the other's mark frees it.
//
// Reaping (leader/follower): a waiting thread that finds no leader becomes the leader and reaps
// completions for everyone (spin, then futex on the completion ring); the others sleep on a
// process-local condition variable and are notified only when their slot is done or the leader
// resigns. With one caller there is no notification and no thread hop at all.
//
// Memory orders:
//  - a slot's reply: the reaper writes `reply`, then sets `state` to done with a (seq_cst)
//    exchange, which releases it; the owner reads `reply` only after loading done (acquire or
//    seq_cst). Submit publishes a reused slot's fields with id.store(release) before the
//    request reaches the ring; Deliver's id.load(acquire) drops a completion for an older id.
//  - free vs abandoned: the reaper (done) and an abandoning caller (abandoned) each exchange
//    `state`; the one that sees the other's mark in the exchange's result frees the slot.
//  - the hand-off to a follower, which must not miss its wake-up:
//      follower: lock(reap_mu_); followers_.fetch_add(seq_cst); wait while
//                state.load(seq_cst) != done (reap_cv_ releases reap_mu_ while it sleeps)
//      reaper:   state.exchange(done, seq_cst); if followers_.load(seq_cst) > 0:
//                lock+unlock reap_mu_; notify_all
//    All four are seq_cst, so they sit in one total order (Dekker): the follower cannot see
//    `state` still waiting while the reaper sees no follower. (With the exchange acq_rel and
//    the predicate's load acquire, as before, both could read the old values under the C++
//    memory model: no notify, and the follower slept its whole 100 ms slice. x86's locked
//    exchange is a full fence, so it could not happen there.) A reaper that sees a follower
//    takes reap_mu_, which the follower holds from its increment until it sleeps, so the
//    notify cannot fall between the follower's check and its sleep.
//  - leader_active_ is read and written under reap_mu_ only; followers_ is read by Resign
//    under reap_mu_ too. slot_waiters_ is changed and read under slots_mu_. `dead_` is set
//    under dead_mu_ and every sleeper is then woken through its own lock (MarkDead).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <flatbuffers/flatbuffers.h>

#include "call_codec.h"
#include "kvagent/client.h"
#include "kvagent/ipc/arena_allocator.h"
#include "kvagent/ipc/frame_ring.h"
#include "kvagent/ipc/segment.h"
#include "kvagent/ipc/unix_socket.h"

namespace kvagent::sdk_detail {

// The arena: its mapping and the client-private allocator. Shared by the connection and every
// ArenaBuffer, so buffers outlive the Client safely.
struct ArenaState {
  ArenaState(std::shared_ptr<ipc::Segment> s, uint64_t bytes)
      : segment(std::move(s)), allocator(bytes) {}
  std::shared_ptr<ipc::Segment> segment;
  ipc::ArenaAllocator allocator;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects, runs the handshake, maps the segment and starts the monitor thread.
  static Result<std::shared_ptr<Connection>> Open(const ClientOptions& options);
  ~Connection();

  // Fails every pending and future call with AGENT_UNAVAILABLE, stops the monitor thread and
  // closes the socket (the agent then reclaims the segment). Idempotent.
  void Close();

  Result<ArenaBuffer> Allocate(size_t bytes);
  PendingCall Submit(const CallSpec& spec);

  // PendingCall's operations on its slot.
  bool Ready(uint32_t slot, uint64_t id);
  Reply Wait(uint32_t slot, uint64_t id);
  void Abandon(uint32_t slot, uint64_t id);

  uint64_t client_id() const { return client_id_; }
  uint64_t agent_incarnation() const { return agent_incarnation_; }
  // The caller's part of the arena (the call words follow it).
  uint64_t arena_bytes() const { return arena_->segment->layout().arena_bytes - call_word_bytes_; }
  bool process_memory() const { return process_memory_; }
  bool alive() const { return !dead_.load(std::memory_order_acquire); }

 private:
  enum SlotState : uint32_t { kFree, kWaiting, kDone, kAbandoned };
  struct Slot {
    std::atomic<uint64_t> id{0};
    std::atomic<uint32_t> state{kFree};
    uint32_t generation = 0;
    size_t key_count = 0;
    Clock::time_point deadline;
    Reply reply;
    std::vector<ArenaBuffer> temporaries;  // copies of raw values, freed with the slot
    // GetInto without process memory: where each key's value goes once it is in its temporary
    // arena buffer (copied out by Wait).
    struct ScatterTarget {
      size_t key;
      size_t temporary;                 // index into `temporaries`
      std::vector<MemoryRange> ranges;  // a copy: the caller's array may be gone (the C ABI's is)
    };
    std::vector<ScatterTarget> scatters;
    // Get: each key's room (what the agent may write there); empty for other ops.
    std::vector<uint64_t> capacities;
    // CloseCall closed the slot's call word (the next call opens it again).
    bool word_closed = false;
  };

  explicit Connection(const ClientOptions& options);
  Status Handshake(const ClientOptions& options);
  // After a Welcome that granted process memory: sets the peer scratch aside (in `scratch`).
  Status SetAsidePeerScratch(const ClientOptions& options, proto::BufferRef* scratch);
  // Where the values (Put/Upsert) or targets (Get) of `spec` go on the wire: arena ranges or
  // memory ranges; raw values without process memory are copied into `temporaries`, GetInto
  // targets get temporaries and `scatters`.
  Status LocateValues(const CallSpec& spec, std::vector<proto::BufferRef>* refs,
                      std::vector<proto::MemoryRange>* memory, std::vector<uint32_t>* counts,
                      std::vector<ArenaBuffer>* temporaries,
                      std::vector<Slot::ScatterTarget>* scatters);
  // True when [data, data + size) lies in our arena; then *offset is where.
  bool InArena(const void* data, size_t size, uint64_t* offset) const;
  // Copies the values of a finished GetInto from their temporaries into the caller's ranges.
  static void Scatter(Slot& slot, const Reply& reply);

  // Call words (Request.call_word): one uint32 per slot in the arena, shared with the agent.
  // CloseCall moves slot `index`'s word from open to closed: false while the agent is moving the
  // call's bytes (it then answers soon). AwaitMoved waits until the call is closed, answered, or
  // the agent gone.
  uint32_t* CallWord(uint32_t index) const;
  bool CloseCall(uint32_t index);
  void AwaitMoved(Slot& slot, uint32_t index);
  // False once the agent's process has exited (or when it is not known).
  bool AgentRunning() const;

  // Slots.
  Result<uint32_t> AcquireSlot(Clock::time_point deadline);
  void ReleaseSlot(uint32_t index);
  PendingCall Failed(const Status& status, size_t key_count);

  // Ring production under produce_mu_: waits (reaping meanwhile) while the ring is full.
  Status Push(uint64_t id, std::span<const uint8_t> frame, Clock::time_point deadline);

  // Reaping.
  bool TryLead();
  void Resign();
  void Lead(Slot& slot);
  void Follow(Slot& slot);
  void Reap();  // leader only
  void ReapIfNoLeader();
  void Deliver(uint64_t request_id, std::span<const uint8_t> frame);

  // Liveness.
  void Monitor();
  bool CheckShutdownWord();
  void MarkDead(const Status& why);
  Status DeadStatus();

  const std::chrono::microseconds spin_;
  const std::chrono::milliseconds call_timeout_;
  uint64_t client_id_ = 0;
  uint64_t agent_incarnation_ = 0;
  ipc::UniqueFd socket_;
  ipc::UniqueFd monitor_wake_;  // eventfd that stops the monitor thread
  std::thread monitor_;
  std::shared_ptr<ArenaState> arena_;
  bool process_memory_ = false;  // granted at the handshake
  uint64_t memory_probe_ = 0;    // the nonce the agent reads from our memory to grant it
  ArenaBuffer peer_scratch_;     // with process memory: the agent's staging for peers

  std::mutex produce_mu_;
  ipc::FrameProducer producer_;  // guarded by produce_mu_
  ipc::FrameConsumer consumer_;  // used by the leader only

  std::unique_ptr<Slot[]> slots_;
  uint32_t slot_count_ = 0;
  // The call words: the arena's last call_word_bytes_ (max_in_flight words, in whole pages),
  // beyond the allocator's range. Zero when the agent creates the segment.
  const uint64_t call_word_bytes_;
  uint32_t* call_words_ = nullptr;
  ipc::UniqueFd agent_process_;  // a pidfd of the agent (AgentRunning); invalid when unknown
  std::mutex slots_mu_;
  std::condition_variable slots_cv_;
  std::vector<uint32_t> free_slots_;
  std::atomic<int> slot_waiters_{0};

  std::mutex reap_mu_;
  std::condition_variable reap_cv_;
  bool leader_active_ = false;  // guarded by reap_mu_
  std::atomic<int> followers_{0};

  std::atomic<bool> dead_{false};
  std::mutex dead_mu_;
  Status dead_status_;
  std::atomic<bool> closed_{false};
};

}  // namespace kvagent::sdk_detail

// What the transports share: a submitted batch that completes when its last op does, the op as
// a transport sees it, and the engine's counters.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvagent/transfer/endpoint.h"
#include "kvagent/transfer/transfer_engine.h"

namespace kvagent::transfer {

// Relaxed atomics: counters for stats(), never used to order memory.
struct EngineCounters {
  std::atomic<uint64_t> ops_ok{0};
  std::atomic<uint64_t> ops_failed{0};
  std::atomic<uint64_t> ops_timed_out{0};
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> connections_opened{0};
  std::atomic<uint64_t> served_writes{0};
  std::atomic<uint64_t> served_reads{0};
  std::atomic<uint64_t> served_rejected{0};
  std::atomic<uint64_t> served_fenced{0};
  std::atomic<uint64_t> served_corrupted{0};  // writes whose payload failed its CRC on arrival
  std::atomic<uint64_t> served_unauthenticated{0};   // connections closed: no proof of membership
  std::atomic<uint64_t> served_shed_connections{0};  // closed at once: too many, or no fds
  std::atomic<uint64_t> served_dropped_connections{0};

  static void Add(std::atomic<uint64_t>& counter, uint64_t n = 1) {
    counter.fetch_add(n, std::memory_order_relaxed);
  }
};

// One Submit call. Each op writes only its own slot of results_; the acq_rel decrement of
// remaining_ makes every slot visible to whichever thread completes the last op, which then
// runs the callback exactly once.
class Batch {
 public:
  Batch(size_t count, TransferCallback done, EngineCounters* counters);
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // Records op `index`'s result; the call that records the last result runs the callback.
  void Complete(size_t index, Status status, uint64_t bytes, TransferKind kind);

  // For an empty batch: runs the callback with no results.
  void CompleteEmpty();

 private:
  std::vector<Status> results_;
  std::atomic<size_t> remaining_;
  TransferCallback done_;
  EngineCounters* counters_;
};

// An op after validation, as handed to a transport. Finish must be called exactly once.
struct PendingOp {
  TransferKind kind = TransferKind::kWrite;
  Endpoint peer;
  std::string peer_text;  // the endpoint as the caller spelled it, for messages
  uint64_t remote_offset = 0;
  uint8_t* local = nullptr;
  uint64_t length = 0;
  uint64_t pool_incarnation = 0;  // see TransferOp
  uint64_t master_epoch = 0;
  uint64_t write_id = 0;
  ReceivedChecksum* received = nullptr;                // see TransferOp
  std::optional<uint32_t> payload_crc = std::nullopt;  // see TransferOp (writes)
  std::shared_ptr<Batch> batch;
  size_t index = 0;

  // "WRITE of 4096 bytes to tcp://10.0.0.2:7100 at offset 8192": how messages name the op.
  std::string Describe() const;
  void Finish(Status status) {
    batch->Complete(index, std::move(status), length, kind);
    batch.reset();
  }
  // Finish with `code` and "<Describe()>: <reason>".
  void Fail(ErrorCode code, const std::string& reason) {
    Finish(Status(code, Describe() + ": " + reason));
  }
};

// The peer-timeout rule of both clients: a connection with work that has moved nothing for
// `timeout` is handed to `expire` (which drops it). `peers` maps keys to unique_ptrs of
// connections with has_work() and last_progress(). Returns how long the loop may sleep before
// the next check (-1: no connection has work), so a timeout fires within ~10% of `timeout`.
template <typename Peers, typename Expire>
int ExpireStalledPeers(const Peers& peers, std::chrono::milliseconds timeout, Expire expire) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<typename Peers::mapped_type::pointer> expired;
  bool busy = false;
  for (const auto& entry : peers) {
    const auto& connection = entry.second;
    if (!connection->has_work()) continue;
    if (now - connection->last_progress() >= timeout) {
      expired.push_back(connection.get());
    } else {
      busy = true;
    }
  }
  for (auto* connection : expired) expire(connection);
  if (!busy) return -1;
  return static_cast<int>(std::clamp<int64_t>(timeout.count() / 10, 1, 100));
}

// Hands each op to the connection for its peer in `peers` (keyed by the canonical endpoint),
// creating it with `open(op)` when there is none (`open` returns nullptr after failing the op
// itself), then calls `kick` once per connection that received ops, so that a batch's small
// requests to one peer leave together.
template <typename Peers, typename Open, typename Enqueue, typename Kick>
void DispatchToPeers(std::vector<PendingOp> ops, Peers& peers, Open open, Enqueue enqueue,
                     Kick kick) {
  std::vector<typename Peers::mapped_type::pointer> touched;
  for (PendingOp& op : ops) {
    std::string key = op.peer.ToString();
    auto it = peers.find(key);
    if (it == peers.end()) {
      auto connection = open(op, key);
      if (!connection) continue;
      it = peers.emplace(std::move(key), std::move(connection)).first;
    }
    auto* connection = it->second.get();
    enqueue(connection, std::move(op));
    if (std::find(touched.begin(), touched.end(), connection) == touched.end()) {
      touched.push_back(connection);
    }
  }
  for (auto* connection : touched) kick(connection);
}

}  // namespace kvagent::transfer

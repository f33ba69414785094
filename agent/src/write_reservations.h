// WriteReservations: writes the master reserved for this agent ahead of the puts that use them.
//
// A put through a separate kvmaster would cost two master round trips (WriteStart before the
// copy, End after it). Engines put values of a few sizes over and over (one KV block size per
// model), so the agent asks the master ahead, off the put's path, for writes of the sizes it
// has seen (master ReserveWrites); a put whose every key finds one copies its bytes into the
// reserved placements at once and commits them under their keys with one message
// (BatchPutCommit). A put that finds none takes the two-round-trip way and leaves a wish, so
// the next ones find some.
//
// Reserved writes are the master's writes in flight: stamped with their write ids and the
// master's epoch, fenced by the master when given back or expired. They are used within
// Options::max_age (far inside the master's release timeout), never after the master's epoch
// changed or this agent registered again (they are dropped then: that master does not know
// them), and never twice (one taken for a put that then fails is given back).
//
// Service thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "data_moves.h"
#include "master_messages.h"
#include "pipeline_context.h"

namespace kvagent::agent {

class WriteReservations {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    // The most space this agent holds in reserved writes, over all sizes (the master also caps
    // it, at an eighth of all pools).
    uint64_t budget_bytes = 64ull << 20;
    // Reserved writes older than this are given back unused (the master abandons them after its
    // put release timeout, ten minutes by default).
    std::chrono::milliseconds max_age{60'000};
    // A size not put for this long gives its reserved writes back.
    std::chrono::milliseconds idle{10'000};
  };
  struct Reserved {
    uint64_t write_id = 0;
    std::vector<ReplicaPlace> replicas;  // grouped by part, parts in order
  };

  WriteReservations(PipelineContext& ctx, MasterMessages& messages, Options options);

  // One reserved write for each of `sizes` (with `replica_count` replicas per part), all or
  // none, appended to `out` in order, each with the placements its value takes (a reserved
  // write is of the value's SizeBucket: the value fills its parts in order, each up to its
  // length, and the master frees the rest at commit). None: the sizes are noted, so
  // reservations of them are asked for once they repeat.
  bool Take(std::span<const uint64_t> sizes, uint8_t replica_count, std::vector<Reserved>* out);
  // The master epoch the reserved writes taken last belong to (their data-plane writes and
  // their commit carry it).
  uint64_t epoch() const { return epoch_; }
  // Where the pools named by reserved writes are (valid until the next Take or Maintain).
  const PoolTable& pools() const { return pools_; }
  // Reserved writes taken for a put that did not commit them: the master gets them back.
  void GiveBack(std::span<const uint64_t> write_ids);
  // Periodic (every pass of the service loop; does its work at most every 100 ms): gives back
  // what aged or idled, asks for more where the stock ran low.
  void Maintain();

  // When Maintain has work next (max while nothing is held or owed).
  Clock::time_point NextDeadline() const {
    return classes_.empty() && returns_.empty() ? Clock::time_point::max() : next_maintain_;
  }

  uint64_t held() const;  // reserved writes in stock (service thread)
  // The same as last published by the service thread, for any thread (the metrics endpoint).
  uint64_t held_published() const { return held_published_.load(std::memory_order_relaxed); }

  // The size of the reserved writes a value of `size` bytes goes into: up to 1 KiB in steps of
  // 256 B, above in quarters of its power of two (at most a quarter of it is unused).
  static uint64_t SizeBucket(uint64_t size);

 private:
  struct Stocked {
    Reserved reserved;
    // Used only before this: max_age, or half the master's lifetime for it, after the
    // ReserveWrites that granted it was sent.
    Clock::time_point use_by;
  };
  struct SizeClass {
    uint64_t size = 0;
    uint8_t replica_count = 1;
    std::deque<Stocked> stock;
    uint32_t target = 0;  // how many to keep in stock
    bool asking = false;  // a ReserveWrites for it is in flight
    Clock::time_point last_used;
    Clock::time_point retry_at;  // after a failed ask
  };
  SizeClass* Find(uint64_t size, uint8_t replica_count);
  void Missed(uint64_t size, uint8_t replica_count, size_t keys);
  void Wish(uint64_t size, uint8_t replica_count, size_t keys);
  uint64_t ReservedBytes(const SizeClass& c) const;
  void Ask(SizeClass& c);
  void OnGranted(uint64_t size, uint8_t replica_count, Clock::time_point asked_at,
                 uint64_t generation, Result<std::span<const uint8_t>> reply);
  void ReturnStock(SizeClass& c);
  void SendReturns();
  // Drops everything when the master's epoch or this agent's registration changed.
  void CheckIdentity();

  PipelineContext& ctx_;
  MasterMessages& messages_;
  const Options options_;
  std::vector<SizeClass> classes_;  // a few: the sizes being put
  std::vector<uint64_t> returns_;   // to give back with the next ReserveWrites
  struct Miss {
    uint64_t size = 0;
    uint8_t replica_count = 1;
    Clock::time_point at;
  };
  std::vector<Miss> misses_;  // sizes without a stock, missed once recently
  PoolTable pools_;
  struct KnownPool {
    std::string endpoint;  // backs pools_'s views
    uint64_t incarnation = 0;
  };
  std::map<uint32_t, KnownPool> known_pools_;
  uint64_t epoch_ = 0;
  uint32_t agent_id_ = 0;
  uint64_t generation_ = 0;  // bumped when everything is dropped: late grants are ignored
  Clock::time_point next_maintain_;
  std::atomic<uint64_t> held_published_{0};
  void Publish() { held_published_.store(held(), std::memory_order_relaxed); }
};

}  // namespace kvagent::agent

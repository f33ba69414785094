// LeaseKeeper: an etcd lease kept alive by a thread of its own, and how long its holder may act
// on it.
//
// The lease is renewed every quarter of its TTL (retried every 100 ms after a failure). After
// each renewal that etcd confirmed, the keeper knows the lease lives at least until the moment
// the renewal was *sent* plus the TTL: etcd restarts the TTL when it receives the renewal, which
// is later. valid_until() is that moment minus the step-down margin (a quarter of the TTL, at
// least 200 ms). A holder that acts only while now < valid_until() — a leader serving — has
// stopped before etcd can expire the lease and let another member win, whatever happened to the
// renewals (etcd unreachable, this process stopped or starved, the host suspended), as long as
// the two clocks run at the same rate within the margin. The times are on BootClock
// (CLOCK_BOOTTIME), which counts a suspend of this host as etcd does; the steady clock would not,
// and a leader resuming after a suspend longer than the margin would go on serving on a lease
// etcd had expired while another member was elected.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "kvagent/common/boot_clock.h"
#include "kvagent/common/status.h"
#include "kvagent/coord/etcd_client.h"

namespace kvagent::coord {

class LeaseKeeper {
 public:
  using Clock = BootClock;

  // Grants a lease of `ttl` (etcd may raise it to its minimum) and starts renewing it.
  // MASTER_UNAVAILABLE when etcd cannot be reached.
  static Result<std::unique_ptr<LeaseKeeper>> Start(EtcdClientOptions options,
                                                    std::chrono::seconds ttl);
  // Stops renewing (the lease then expires by itself unless Revoke was called).
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  int64_t id() const { return id_; }
  std::chrono::milliseconds ttl() const { return ttl_; }
  std::chrono::milliseconds margin() const { return margin_; }

  // Until when the holder may act on the lease (see above). Clock::time_point::min() once
  // lost().
  Clock::time_point valid_until() const;
  bool valid() const { return Clock::now() < valid_until(); }
  // etcd answered that the lease is gone (expired or revoked): it will never be valid again.
  bool lost() const { return lost_.load(std::memory_order_acquire); }
  // Renewals etcd confirmed, and attempts that failed.
  uint64_t renewals() const { return renewals_.load(std::memory_order_relaxed); }
  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

  // Stops renewing and revokes the lease now, so its keys go at once (a clean step-down: the
  // others need not wait for the TTL). Best effort: logs when etcd cannot be reached.
  void Revoke();

 private:
  class Renewer;
  LeaseKeeper() = default;
  int64_t id_ = 0;
  std::chrono::milliseconds ttl_{0};
  std::chrono::milliseconds margin_{0};
  std::atomic<int64_t> valid_until_ns_{0};
  std::atomic<bool> lost_{false};
  std::atomic<uint64_t> renewals_{0};
  std::atomic<uint64_t> failures_{0};
  std::unique_ptr<Renewer> renewer_;
};

}  // namespace kvagent::coord

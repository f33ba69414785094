// Standby: a kvmaster that follows another one (`kvmaster --follow ENDPOINT --state-dir DIR`).
//
// One thread owns a ZMQ DEALER to the primary's ROUTER and the operation log in DIR. It asks for
// the primary's records (master.fbs Replicate) every `poll` and appends them to the log as they
// come; the first answer, and any answer after the primary restarted or after the standby fell
// behind what the primary keeps, is a snapshot of the whole committed state that replaces the
// log. The log is therefore always one the primary could have written itself, and promoting the
// standby is starting a MasterServer over DIR: the same replay that restores a restarted master
// (objects, replicas, session tags, block metadata; in-flight writes and leases are not
// replicated). The standby serves no requests until then.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <optional>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/status.h"

namespace kvagent::master {

struct StandbyOptions {
  std::string primary;      // the primary's ROUTER endpoint, e.g. tcp://10.0.0.1:50051
  std::string state_dir;    // the followed operation log goes to DIR/master.oplog (required)
  std::string status_file;  // optional: rewritten after each page (primary=, epoch=,
                            // applied_seq=, refused_pages=)
  std::string name;         // this follower's name, told to the primary (its follower count)
  // This follower is an HA member that can be elected (Replicate.electable); false for a
  // manual --follow standby.
  bool electable = false;
  // Long poll: the primary holds a request that finds nothing new up to this long and answers
  // as soon as it makes a record, so records arrive within a round trip (0: ask every `poll`).
  std::chrono::milliseconds wait{500};
  std::chrono::milliseconds poll{20};       // between requests when there was nothing new
  std::chrono::milliseconds timeout{1000};  // a request unanswered this long (after `wait`):
                                            // reconnect (a first request, for a whole
                                            // snapshot: at least 60 s)
  // The primary's master-rpc keys when it runs with a cluster secret (a CURVE client).
  std::optional<CurvePlaneKeys> curve;
};

class Standby {
 public:
  // Opens the log in options.state_dir and starts following. Fails when the directory is
  // unusable or the endpoint is malformed.
  static Result<std::unique_ptr<Standby>> Start(StandbyOptions options);
  // Stops following; the log holds every page applied so far.
  ~Standby();
  // The same, keeping the object for its final applied_seq() and epoch().
  void Stop();
  Standby(const Standby&) = delete;
  Standby& operator=(const Standby&) = delete;

  // True once a snapshot of the primary has been applied (the log is a usable state).
  bool synced() const { return synced_.load(std::memory_order_acquire); }
  // The primary's record the log is at.
  uint64_t applied_seq() const { return applied_seq_.load(std::memory_order_acquire); }
  // The primary's epoch whose log this is (0: none yet).
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  // How long since the primary last answered (since Start while it never did).
  std::chrono::milliseconds silent_for() const;
  // Pages of records the primary sent that this kvmaster could not replay (not kept).
  uint64_t refused_pages() const { return refused_pages_.load(std::memory_order_relaxed); }

 private:
  class Follower;
  Standby() = default;
  std::unique_ptr<Follower> follower_;
  std::atomic<bool> synced_{false};
  std::atomic<uint64_t> applied_seq_{0};
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int64_t> last_answer_ms_{0};
  std::atomic<uint64_t> refused_pages_{0};
};

}  // namespace kvagent::master

// LeaderWatcher: follows a cluster's leader key in etcd from a thread of its own (discovery for
// agents and kvctl, and the members' view of the election).
//
// The thread reads the key, then watches it; every change of the leader (a new epoch, or the
// same term publishing its endpoints) is passed to `on_change` and kept for current(). When the
// watch breaks (etcd restarted or unreachable) the thread reads the key again with a backoff
// (100 ms doubling to 1 s) and watches anew; meanwhile the last known leader stays current and
// etcd_reachable() is false. Every `reread_interval` it also reads the key again, so a watch
// stream that went silent without breaking is noticed.
//
// Thread-safe; on_change runs on the watcher thread and must not block for long.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "kvagent/common/status.h"
#include "kvagent/coord/cluster_address.h"
#include "kvagent/coord/records.h"

namespace kvagent::coord {

struct LeaderWatcherOptions {
  std::chrono::milliseconds timeout{1000};          // per etcd call
  std::chrono::milliseconds reread_interval{2000};  // see above
};

class LeaderWatcher {
 public:
  // nullopt: no leader at the moment (none elected, or the elected one is still starting).
  using OnChange = std::function<void(const std::optional<Leader>&)>;

  // Starts the thread; returns at once (the first read happens in the background).
  static Result<std::unique_ptr<LeaderWatcher>> Start(ClusterAddress address, OnChange on_change,
                                                      LeaderWatcherOptions options = {});
  ~LeaderWatcher();  // stops the thread
  LeaderWatcher(const LeaderWatcher&) = delete;
  LeaderWatcher& operator=(const LeaderWatcher&) = delete;

  // The leader as last seen (only a serving one: its record has endpoints).
  std::optional<Leader> current() const;
  // The highest leader epoch seen so far (0: none), serving or not.
  uint64_t highest_epoch() const;
  // The epoch of the leader key there now, serving or still starting (0: no key: no leader).
  uint64_t key_epoch() const;
  // False while etcd cannot be read; `why` says what failed.
  bool etcd_reachable(std::string* why = nullptr) const;
  // Blocks until a serving leader is known (returns it) or `limit` passes (nullopt).
  std::optional<Leader> WaitForLeader(std::chrono::milliseconds limit) const;

  const ClusterAddress& address() const { return address_; }

  class Thread;  // private to the library

 private:
  LeaderWatcher(ClusterAddress address);
  ClusterAddress address_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::optional<Leader> leader_;
  uint64_t highest_epoch_ = 0;
  uint64_t key_epoch_ = 0;
  bool reachable_ = false;
  std::string why_ = "not read yet";
  std::unique_ptr<Thread> thread_;
};

}  // namespace kvagent::coord

// The master's counters for /metrics (kvmaster, and a standalone kvagent's embedded master).
//
// The master is single-threaded, so the metrics HTTP thread never asks it: the owning thread
// copies its Stats counters (MasterRpc::StatCounters, what `kvctl stat` shows as "master.*")
// onto a StatsBoard at every tick (50 ms), and the HTTP thread reads the board.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kvagent/common/metrics.h"

namespace kvagent::master {

using StatCounterList = std::vector<std::pair<std::string, uint64_t>>;

class StatsBoard {
 public:
  // Copies into the list it holds (its memory reused: no allocation once the names are known).
  void Publish(const StatCounterList& counters) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_ = counters;
  }
  StatCounterList Read() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_;
  }

 private:
  mutable std::mutex mu_;
  StatCounterList counters_;
};

// The "master.*" counters (names without the prefix) under stable names (kvmaster_*; the list is
// in docs/operations.md). A counter the table does not know yet is still exported, as the gauge
// kvmaster_<name>.
void AppendMasterMetrics(const StatCounterList& counters, metrics::Exposition* out);

}  // namespace kvagent::master

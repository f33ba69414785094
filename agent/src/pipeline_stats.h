// The agent's counters as `kvctl stat` shows them ("agent.*").
#pragma once

#include <vector>

#include "pipeline_context.h"

namespace kvagent::agent {

// clients, requests/batches/keys per op, bytes moved, failures, and the master link's state
// (agent.master_link: its Describe() line; agent.master_link.*: its own counters), with
// `clients` attached now. Safe on any thread once the pipeline is built (the counters are
// single-writer atomics; the master port's ready/Describe/AppendStats and the extra counters
// are thread-safe): the metrics endpoint reads the same list as `kvctl stat`.
std::vector<Counter> AgentCounters(const PipelineContext& ctx, size_t clients);

}  // namespace kvagent::agent

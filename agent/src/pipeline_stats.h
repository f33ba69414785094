// The agent's counters as `kvctl stat` shows them ("agent.*").
#pragma once

#include <vector>

#include "pipeline_context.h"

namespace kvagent::agent {

// clients, requests/batches/keys per op, bytes moved, failures, and the master link's state
// (agent.master_link: its Describe() line; agent.master_link.*: its own counters).
std::vector<Counter> AgentCounters(const PipelineContext& ctx);

}  // namespace kvagent::agent

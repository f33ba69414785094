// The agent's /metrics: every `kvctl stat` counter under a stable Prometheus name (the table in
// agent_metrics.cc, listed in docs/operations.md), the data plane's counters, and the put/get
// phase histograms. Rendering runs on the metrics HTTP thread and only reads.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kvagent/agent/agent.h"
#include "kvagent/agent/request_handler.h"
#include "kvagent/common/metrics.h"
#include "kvagent/transfer/transfer_engine.h"

namespace kvagent::agent {

class EmbeddedMaster;
class RequestPipeline;

// What the agent's /metrics reads once it serves; every pointer outlives the metrics server.
struct MetricsSources {
  const RequestPipeline* pipeline = nullptr;
  const Agent* agent = nullptr;
  const transfer::TransferEngine* engine = nullptr;
  const EmbeddedMaster* embedded = nullptr;  // standalone only: its master's counters
};

// The whole exposition. `sources` null: the agent is still starting (only kvagent_build_info and
// kvagent_up 0).
std::string RenderAgentMetrics(const MetricsSources* sources);

// "agent.*" counters (as `kvctl stat` lists them) as metrics. A counter the table does not
// know yet is still exported, as the gauge kvagent_<name with dots as underscores>.
void AppendAgentMetrics(const std::vector<Counter>& counters, metrics::Exposition* out);

// The data plane's TransferStats.
void AppendTransferMetrics(const transfer::TransferStats& stats, metrics::Exposition* out);

}  // namespace kvagent::agent

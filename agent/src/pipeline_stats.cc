#include "pipeline_stats.h"
#include "write_reservations.h"

#include <string>
#include <utility>

namespace kvagent::agent {
namespace {

// Counter names of the ops, indexed by proto::Op.
constexpr const char* kOpNames[PipelineCounters::kOps] = {
    "ping", "put", "upsert", "get", "exist", "remove", "remove_all", "list", "stat", "sessions"};

}  // namespace

std::vector<Counter> AgentCounters(const PipelineContext& ctx, size_t clients) {
  const PipelineCounters& c = ctx.counters;
  std::vector<Counter> out;
  out.push_back({"agent.clients", clients, ""});
  for (size_t op = 1; op < PipelineCounters::kOps; ++op) {
    const std::string name = kOpNames[op];
    out.push_back({"agent.requests." + name, c.requests[op], ""});
    out.push_back({"agent.batches." + name, c.batches[op], ""});
    out.push_back({"agent.keys." + name, c.keys[op], ""});
  }
  out.push_back({"agent.bytes_to_pool", c.bytes_to_pool, ""});
  out.push_back({"agent.bytes_to_peers", c.bytes_to_peers, ""});
  out.push_back({"agent.bytes_from_pool", c.bytes_from_pool, ""});
  out.push_back({"agent.bytes_from_peers", c.bytes_from_peers, ""});
  out.push_back({"agent.transfer_failures", c.transfer_failures, ""});
  out.push_back({"agent.replica_fallbacks", c.replica_fallbacks, ""});
  out.push_back({"agent.expired_keys", c.expired_keys, ""});
  out.push_back({"agent.revoked_keys", c.revoked_keys, ""});
  out.push_back({"agent.lease_expired", c.lease_expired, ""});
  out.push_back({"agent.checksum_mismatches", c.checksum_mismatches, ""});
  out.push_back({"agent.peer_rereads", c.peer_rereads, ""});
  out.push_back({"agent.corrupted_keys", c.corrupted_keys, ""});
  out.push_back({"agent.degraded_puts", c.degraded_puts, ""});
  out.push_back({"agent.fenced_local_writes", c.fenced_local_writes, ""});
  out.push_back({"agent.reserved_puts", c.reserved_puts, ""});
  if (ctx.reservations != nullptr) {
    out.push_back({"agent.reserved_writes", ctx.reservations->held_published(), ""});
  }
  out.push_back({"agent.checksums", ctx.checksums ? 1u : 0u, ctx.checksums ? "on" : "off"});
  if (ctx.fence != nullptr) {
    out.push_back({"agent.pool_incarnation", ctx.fence->pool_incarnation(), ""});
    out.push_back({"agent.fence_refusals", ctx.fence->refused(), ""});
  }
  const transfer::TransferStats ts = ctx.engine->stats();
  out.push_back({"agent.data.served_writes", ts.served_writes, ""});
  out.push_back({"agent.data.served_reads", ts.served_reads, ""});
  out.push_back({"agent.data.served_rejected", ts.served_rejected, ""});
  out.push_back({"agent.data.served_fenced", ts.served_fenced, ""});
  out.push_back({"agent.data.served_corrupted", ts.served_corrupted, ""});
  out.push_back({"agent.data.served_dropped_connections", ts.served_dropped_connections, ""});
  out.push_back({"agent.data.served_unauthenticated", ts.served_unauthenticated, ""});
  out.push_back({"agent.data.served_shed_connections", ts.served_shed_connections, ""});
  out.push_back({"agent.data.ops_failed", ts.ops_failed, ""});
  out.push_back({"agent.master_failures", c.master_failures, ""});
  out.push_back({"agent.abandoned_requests", c.abandoned_requests, ""});
  out.push_back({"agent.pool_bytes", ctx.pool->size(),
                 std::string(transfer::PoolPagesName(ctx.pool->pages()))});
  out.push_back({"agent.data_endpoint", 0, ctx.engine->endpoint()});
  out.push_back({"agent.master_link", ctx.master->ready() ? 1u : 0u, ctx.master->Describe()});
  std::vector<std::pair<std::string, uint64_t>> link;
  ctx.master->AppendStats(&link);
  for (auto& [name, value] : link) out.push_back({"agent.master_link." + name, value, ""});
  if (ctx.extra_counters) ctx.extra_counters(&out);
  return out;
}

}  // namespace kvagent::agent

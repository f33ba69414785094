#include "agent_metrics.h"

#include <string_view>

#include "embedded_master.h"
#include "kvagent/common/version.h"
#include "kvagent/master/master_metrics.h"
#include "request_pipeline.h"

namespace kvagent::agent {
namespace {

enum class Kind : uint8_t {
  kCounter,    // value as a counter
  kGauge,      // value as a gauge
  kInfo,       // `text` as the label `label` of <metric> 1
  kInfoValue,  // the value, as the label `label` of <metric> 1 (an identifier, not a quantity)
  kElsewhere,  // exported under `metric` from its own source (the data plane's TransferStats)
  kNone,       // not exported (said in docs/operations.md)
};

struct Mapping {
  std::string_view stat;  // kvctl stat name
  std::string_view metric;
  Kind kind;
  std::string_view help;
  std::string_view label = {};  // kInfo
};

// Stable names: renaming one breaks dashboards. Units in the name (_total, _bytes, _seconds).
constexpr Mapping kTable[] = {
    {"agent.clients", "kvagent_clients", Kind::kGauge, "SDK clients attached now"},
    {"agent.bytes_to_pool", "kvagent_pool_written_bytes_total", Kind::kCounter,
     "put bytes copied into this node's pool"},
    {"agent.bytes_to_peers", "kvagent_peer_written_bytes_total", Kind::kCounter,
     "put bytes moved to other agents' pools"},
    {"agent.bytes_from_pool", "kvagent_pool_read_bytes_total", Kind::kCounter,
     "get bytes copied out of this node's pool"},
    {"agent.bytes_from_peers", "kvagent_peer_read_bytes_total", Kind::kCounter,
     "get bytes moved from other agents' pools"},
    {"agent.transfer_failures", "kvagent_transfer_failed_keys_total", Kind::kCounter,
     "keys whose bytes the data plane failed to move"},
    {"agent.replica_fallbacks", "kvagent_replica_fallbacks_total", Kind::kCounter,
     "get parts read again from another replica after a peer's read failed"},
    {"agent.expired_keys", "kvagent_expired_keys_total", Kind::kCounter,
     "keys answered TIMEOUT without the work because the caller's deadline had passed"},
    {"agent.revoked_keys", "kvagent_revoked_keys_total", Kind::kCounter,
     "writes revoked (failed transfer, or the client left)"},
    {"agent.lease_expired", "kvagent_lease_expired_total", Kind::kCounter,
     "gets that outlived their read lease (answered TIMEOUT)"},
    {"agent.master_failures", "kvagent_master_failures_total", Kind::kCounter,
     "master calls that failed (unreachable, timed out)"},
    {"agent.abandoned_requests", "kvagent_abandoned_requests_total", Kind::kCounter,
     "requests of clients that left before their answer"},
    {"agent.checksum_mismatches", "kvagent_checksum_mismatches_total", Kind::kCounter,
     "replicas read whose bytes failed their checksum"},
    {"agent.peer_rereads", "kvagent_peer_rereads_total", Kind::kCounter,
     "peers' bytes that failed their checksum once, so were read again before the replica was "
     "blamed"},
    {"agent.corrupted_keys", "kvagent_corrupted_keys_total", Kind::kCounter,
     "gets answered DATA_CORRUPTED (every replica failed its checksum)"},
    {"agent.degraded_puts", "kvagent_degraded_puts_total", Kind::kCounter,
     "puts stored with fewer replicas than asked"},
    {"agent.fenced_local_writes", "kvagent_fenced_local_writes_total", Kind::kCounter,
     "local copies the pool fence refused"},
    {"agent.reserved_puts", "kvagent_reserved_puts_total", Kind::kCounter,
     "keys put with one master round trip, into writes reserved ahead"},
    {"agent.reserved_writes", "kvagent_reserved_writes", Kind::kGauge,
     "reserved writes this agent holds now"},
    {"agent.checksums", "kvagent_checksums_enabled", Kind::kGauge,
     "1 when values are stored and read with checksums (--checksums)"},
    {"agent.pool_incarnation", "kvagent_pool_incarnation_info", Kind::kInfoValue,
     "the node pool's incarnation (new at every agent start)", "incarnation"},
    {"agent.fence_refusals", "kvagent_fence_refusals_total", Kind::kCounter,
     "data-plane ops the pool fence refused (another pool, master epoch or abandoned write)"},
    {"agent.data.served_writes", "kvagent_transfer_served_writes_total", Kind::kElsewhere, ""},
    {"agent.data.served_reads", "kvagent_transfer_served_reads_total", Kind::kElsewhere, ""},
    {"agent.data.served_rejected", "kvagent_transfer_served_rejected_total", Kind::kElsewhere, ""},
    {"agent.data.served_fenced", "kvagent_transfer_served_fenced_total", Kind::kElsewhere, ""},
    {"agent.data.served_corrupted", "kvagent_transfer_served_corrupted_total", Kind::kElsewhere,
     ""},
    {"agent.data.served_dropped_connections", "kvagent_transfer_dropped_peer_connections_total",
     Kind::kElsewhere, ""},
    {"agent.data.served_unauthenticated", "kvagent_transfer_served_unauthenticated_total",
     Kind::kElsewhere, ""},
    {"agent.data.served_shed_connections", "kvagent_transfer_shed_connections_total",
     Kind::kElsewhere, ""},
    {"agent.data.ops_failed", "kvagent_transfer_failed_ops_total", Kind::kElsewhere, ""},
    {"agent.pool_bytes", "kvagent_pool_bytes", Kind::kGauge, "size of this node's memory pool"},
    {"agent.pool_bytes", "kvagent_pool_info", Kind::kInfo, "which pages back the node pool",
     "pages"},
    {"agent.data_endpoint", "kvagent_data_endpoint_info", Kind::kInfo,
     "the data-plane endpoint peers use", "endpoint"},
    {"agent.master_link", "kvagent_master_link_up", Kind::kGauge,
     "1 while the master link is up (standalone: always)"},
    {"agent.master_link.ready", "kvagent_master_link_ready", Kind::kGauge,
     "1 when requests can reach the master"},
    {"agent.master_link.registrations", "kvagent_master_link_registrations_total", Kind::kCounter,
     "registrations with kvmaster (more than 1: it restarted or forgot us)"},
    {"agent.master_link.link_downs", "kvagent_master_link_downs_total", Kind::kCounter,
     "times the master link went down"},
    {"agent.master_link.framed", "kvagent_master_link_framed", Kind::kGauge,
     "1 while the master link is up on kvmaster's framed transport, 0 on ZMQ"},
    {"agent.master_link.framed_fallbacks", "kvagent_master_link_framed_fallbacks_total",
     Kind::kCounter,
     "framed connections that failed before they were ready (the link then used ZMQ a minute)"},
    {"agent.master_link.replies_taken_by_service",
     "kvagent_master_link_replies_taken_by_service_total", Kind::kCounter,
     "master replies the service thread read from the framed connection itself"},
    {"agent.master_link.timeouts", "kvagent_master_link_timeouts_total", Kind::kCounter,
     "master requests unanswered within --master-timeout-ms"},
    {"agent.master_link.heartbeats", "kvagent_master_link_heartbeats_total", Kind::kCounter,
     "heartbeats answered by kvmaster"},
    {"agent.master_link.failed_fast", "kvagent_master_link_failed_fast_total", Kind::kCounter,
     "master requests failed at once because the link was down"},
    {"agent.master_link.epoch", "kvagent_master_link_epoch", Kind::kGauge,
     "epoch of the master the agent is registered with (with etcd: the leader's term)"},
    {"agent.master_link.leader_changes", "kvagent_master_link_leader_changes_total", Kind::kCounter,
     "times etcd showed another leader of the cluster (etcd:// only)"},
    {"agent.master_link.stale_replies", "kvagent_master_link_stale_replies_total", Kind::kCounter,
     "master replies refused for an epoch older than one seen (etcd:// only)"},
    {"agent.master_link.etcd_reachable", "kvagent_master_link_etcd_reachable", Kind::kGauge,
     "1 while the agent reads the cluster's leader key from etcd (etcd:// only)"},
    {"agent.master_link.failed_in_flight", "kvagent_master_link_failed_in_flight_total",
     Kind::kCounter, "master requests in flight when the link went down"},
    {"agent.master_link.in_flight", "kvagent_master_link_in_flight_requests", Kind::kGauge,
     "master requests waiting for an answer now"},
    {"agent.master_link.retried_calls", "kvagent_master_link_retried_calls_total", Kind::kCounter,
     "End calls sent again after the link came back"},
    {"agent.master_link.fences_applied", "kvagent_master_link_fences_applied_total", Kind::kCounter,
     "fences from kvmaster's heartbeats applied to the pool"},
    {"agent.relay.phase", "kvagent_relay_phase_info", Kind::kInfo,
     "the event relay's phase (joining, syncing, live)", "phase"},
    {"agent.relay.master_switches", "kvagent_relay_master_switches_total", Kind::kCounter,
     "times the relay moved to a new master's events (etcd:// failovers)"},
    {"agent.relay.next_seq", "kvagent_relay_next_seq", Kind::kGauge,
     "seq of the next batch on the agent's event socket"},
    {"agent.relay.relayed_batches", "kvagent_relay_relayed_batches_total", Kind::kCounter,
     "master event batches republished as they came"},
    {"agent.relay.repaired_gaps", "kvagent_relay_repaired_gaps_total", Kind::kCounter,
     "master seq gaps filled by replay"},
    {"agent.relay.unrepaired_gaps", "kvagent_relay_unrepaired_gaps_total", Kind::kCounter,
     "master seq gaps replay could not fill (each: a re-announce)"},
    {"agent.relay.missing_batches", "kvagent_relay_missing_batches_total", Kind::kCounter,
     "master batches lost in unrepaired gaps"},
    {"agent.relay.resets", "kvagent_relay_resets_total", Kind::kCounter,
     "master restarts seen by the relay"},
    {"agent.relay.reannounces", "kvagent_relay_reannounces_total", Kind::kCounter,
     "completed re-announces of the store"},
    {"agent.relay.objects_reannounced", "kvagent_relay_reannounced_objects_total", Kind::kCounter,
     "BlockStored events published by re-announces"},
    {"agent.relay.clearing_reannounces", "kvagent_relay_clearing_reannounces_total", Kind::kCounter,
     "re-announces that began with AllBlocksCleared (the relay's first)"},
    {"agent.relay.objects_removed", "kvagent_relay_removed_objects_total", Kind::kCounter,
     "BlockRemoved events of re-announces by differences (objects gone from the store)"},
    {"agent.relay.indexed_objects", "kvagent_relay_indexed_objects", Kind::kGauge,
     "objects the agent's event consumers were told are stored"},
    {"agent.relay.dropped_events", "kvagent_relay_dropped_events_total", Kind::kCounter,
     "events the agent's publisher queue dropped"},
    {"agent.relay.malformed_messages", "kvagent_relay_malformed_messages_total", Kind::kCounter,
     "master event frames that broke the event wire format (docs/events.md)"},
    {"agent.relay.unreadable_batches", "kvagent_relay_unreadable_batches_total", Kind::kCounter,
     "master event batches strict consumers cannot read, left out (their changes follow in a "
     "re-announce)"},
    {"agent.metrics_endpoint", "", Kind::kNone, ""},
};

// The per-op columns of `kvctl stat`: "agent.<column>.<op>".
struct OpFamily {
  std::string_view prefix;
  std::string_view metric;
  std::string_view help;
};
constexpr OpFamily kOpFamilies[] = {
    {"agent.requests.", "kvagent_requests_total", "requests received from clients, per op"},
    {"agent.batches.", "kvagent_master_batches_total",
     "master calls that carried them, per op (fewer than requests: batching)"},
    {"agent.keys.", "kvagent_master_batch_keys_total", "keys in those master calls, per op"},
};

}  // namespace

std::string RenderAgentMetrics(const MetricsSources* sources) {
  metrics::Exposition out;
  out.Gauge("kvagent_build_info", "the kvagent release serving these metrics", 1,
            {{"version", kVersion}});
  out.Gauge("kvagent_up", "1 once the agent serves clients (0 while it starts)",
            sources != nullptr ? 1 : 0);
  if (sources == nullptr) return out.Text();
  AppendAgentMetrics(sources->pipeline->Counters(sources->agent->client_count()), &out);
  AppendTransferMetrics(sources->engine->stats(), &out);
  sources->pipeline->latency().Append(&out);
  if (sources->embedded != nullptr) {
    master::AppendMasterMetrics(sources->embedded->StatsSnapshot(), &out);
  }
  return out.Text();
}

void AppendAgentMetrics(const std::vector<Counter>& counters, metrics::Exposition* out) {
  for (const Counter& c : counters) {
    bool done = false;
    for (const OpFamily& f : kOpFamilies) {
      if (c.name.rfind(f.prefix, 0) == 0) {
        out->Counter(f.metric, f.help, c.value, {{"op", c.name.substr(f.prefix.size())}});
        done = true;
        break;
      }
    }
    if (done) continue;
    for (const Mapping& m : kTable) {
      if (m.stat != c.name) continue;
      done = true;
      switch (m.kind) {
        case Kind::kCounter:
          out->Counter(m.metric, m.help, c.value);
          break;
        case Kind::kGauge:
          out->Gauge(m.metric, m.help, static_cast<double>(c.value));
          break;
        case Kind::kInfo:
          if (!c.text.empty()) out->Gauge(m.metric, m.help, 1, {{std::string(m.label), c.text}});
          break;
        case Kind::kInfoValue:
          out->Gauge(m.metric, m.help, 1, {{std::string(m.label), std::to_string(c.value)}});
          break;
        case Kind::kElsewhere:
        case Kind::kNone:
          break;
      }
    }
    if (!done) {
      out->Gauge(
          metrics::FallbackName(
              "kvagent_", std::string_view(c.name).substr(c.name.rfind("agent.", 0) == 0 ? 6 : 0)),
          "kvctl stat counter " + c.name + " (no stable name yet)", static_cast<double>(c.value));
    }
  }
}

void AppendTransferMetrics(const transfer::TransferStats& s, metrics::Exposition* out) {
  out->Counter("kvagent_transfer_ok_ops_total", "data-plane ops that succeeded", s.ops_ok);
  out->Counter("kvagent_transfer_failed_ops_total",
               "data-plane ops that failed (timeouts included)", s.ops_failed);
  out->Counter("kvagent_transfer_timed_out_ops_total",
               "data-plane ops whose peer moved no bytes for --data-peer-timeout-ms",
               s.ops_timed_out);
  out->Counter("kvagent_transfer_written_bytes_total",
               "payload bytes of successful writes to peers", s.bytes_written);
  out->Counter("kvagent_transfer_read_bytes_total", "payload bytes of successful reads from peers",
               s.bytes_read);
  out->Counter("kvagent_transfer_connections_opened_total", "data-plane connections opened",
               s.connections_opened);
  out->Counter("kvagent_transfer_served_writes_total", "peers' writes stored into this pool",
               s.served_writes);
  out->Counter("kvagent_transfer_served_reads_total", "peers' reads answered from this pool",
               s.served_reads);
  out->Counter("kvagent_transfer_served_rejected_total",
               "peers' requests refused (range outside the pool, or the fence)", s.served_rejected);
  out->Counter("kvagent_transfer_served_fenced_total", "peers' requests refused by the pool fence",
               s.served_fenced);
  out->Counter("kvagent_transfer_served_corrupted_total",
               "peers' writes refused because their bytes arrived damaged (payload CRC32C)",
               s.served_corrupted);
  out->Counter("kvagent_transfer_served_unauthenticated_total",
               "data connections closed for no proof of cluster membership",
               s.served_unauthenticated);
  out->Counter("kvagent_transfer_shed_connections_total",
               "data connections closed at once (too many, or no file descriptors)",
               s.served_shed_connections);
  out->Counter("kvagent_transfer_dropped_peer_connections_total",
               "peer connections dropped for breaking the protocol (a damaged request header too)",
               s.served_dropped_connections);
}

}  // namespace kvagent::agent

#include "kvagent/master/master_metrics.h"

#include <string_view>

namespace kvagent::master {
namespace {

struct Mapping {
  std::string_view stat;  // kvctl stat name without "master."
  std::string_view metric;
  bool counter;  // else a gauge
  std::string_view help;
};

// Stable names: renaming one breaks dashboards.
constexpr Mapping kTable[] = {
    {"keys", "kvmaster_keys", false, "readable objects"},
    {"writes_in_flight", "kvmaster_writes_in_flight", false,
     "writes started and not yet ended or revoked"},
    {"bytes_used", "kvmaster_used_bytes", false,
     "bytes allocated in all pools (64-byte granularity, in-flight writes included)"},
    {"bytes_capacity", "kvmaster_capacity_bytes", false, "size of all mounted pools"},
    {"agents", "kvmaster_agents", false, "registered agents"},
    {"pools", "kvmaster_pools", false, "mounted pools"},
    {"session_tags", "kvmaster_session_tags", false, "distinct session IDs referenced"},
    {"evictions", "kvmaster_evictions_total", true, "objects evicted"},
    {"expired_agents", "kvmaster_expired_agents_total", true,
     "agents dropped for missing heartbeats"},
    {"taken_over_puts", "kvmaster_taken_over_puts_total", true,
     "puts taken over after --put-timeout-ms"},
    {"timed_out_writes", "kvmaster_timed_out_writes_total", true,
     "writes abandoned at the release timeout"},
    {"bad_requests", "kvmaster_bad_requests_total", true,
     "requests rejected whole (malformed, failed validation)"},
    {"bad_messages", "kvmaster_bad_messages_total", true,
     "ZMQ messages not shaped [identity, \"\", request]"},
    {"events_emitted", "kvmaster_events_emitted_total", true,
     "KV events produced by state changes"},
    {"events_published", "kvmaster_events_published_total", true,
     "KV events handed to the PUB socket"},
    {"event_batches_published", "kvmaster_event_batches_published_total", true,
     "KV event batches handed to the PUB socket"},
    {"events_dropped", "kvmaster_events_dropped_total", true,
     "KV events dropped because the publisher's queue was full"},
    {"event_next_seq", "kvmaster_event_next_seq", false, "seq of the next event batch"},
    {"event_replay_requests", "kvmaster_event_replay_requests_total", true,
     "replay requests served by the event replay socket"},
    {"refused_connections", "kvmaster_refused_connections_total", true,
     "ZMQ connections refused by CURVE authentication (no or another cluster secret)"},
    {"oplog_records", "kvmaster_oplog_records_total", true, "operation-log records appended"},
    {"replication_last_seq", "kvmaster_replication_last_seq", false,
     "newest operation-log record a standby can fetch"},
    {"suspect_agents", "kvmaster_suspect_agents", false,
     "agents silent past the TTL, not yet dropped"},
    {"agents_suspected", "kvmaster_agents_suspected_total", true,
     "times an agent went silent past the TTL and became suspect"},
    {"fenced_bytes", "kvmaster_fenced_bytes", false,
     "space of abandoned writes waiting for their fences"},
    {"pending_fences", "kvmaster_pending_fences", false, "fences not acknowledged yet"},
    {"bad_replicas", "kvmaster_bad_replicas_total", true,
     "replicas dropped because a reader found them corrupt"},
    {"stalls_forgiven", "kvmaster_stalls_forgiven_total", true,
     "times the master itself stalled (its agents not blamed)"},
    {"log_writable", "kvmaster_log_writable", false,
     "0 while the state dir refuses operation-log records (full, I/O error)"},
    {"log_refusals", "kvmaster_log_refusals_total", true,
     "mutating calls refused because the log could not take them"},
    {"log_bytes", "kvmaster_log_bytes", false, "size of the operation log file"},
    {"log_compactions", "kvmaster_log_compactions_total", true,
     "operation-log snapshots written while running"},
    {"reserved_writes", "kvmaster_reserved_writes", false,
     "reserved writes agents hold now (not bound to a key yet)"},
    {"reserved_bytes", "kvmaster_reserved_bytes", false, "the space of those reserved writes"},
    {"writes_reserved", "kvmaster_writes_reserved_total", true, "reserved writes handed out"},
    {"reserved_commits", "kvmaster_reserved_commits_total", true,
     "keys committed into a reserved write (one round trip)"},
    {"reserved_returned", "kvmaster_reserved_returned_total", true,
     "reserved writes given back unused, or refused at commit"},
    {"name_conflicts", "kvmaster_name_conflicts_total", true,
     "registrations refused: an agent another registration of its name replaced came back"},
    {"agent_key_refusals", "kvmaster_agent_key_refusals_total", true,
     "registrations and calls for an agent that did not carry its agent key"},
    {"oversized_values", "kvmaster_oversized_values_total", true,
     "puts refused as larger than the pools' high watermark"},
    {"epoch", "kvmaster_epoch", false,
     "this master's epoch (with etcd: its term, the leader key's create revision)"},
    {"followers", "kvmaster_followers", false,
     "standbys or followers that fetched the log within the last 3 s"},
    {"replication_acked_seq", "kvmaster_replication_acked_seq", false,
     "newest record held by --sync-followers followers (at least 1)"},
    {"sync_followers", "kvmaster_sync_followers", false,
     "followers a change waits for before it is acknowledged (--sync-followers)"},
    {"sync_waiting_replies", "kvmaster_sync_waiting_replies", false,
     "replies held until followers hold their records"},
    {"sync_dropped_replies", "kvmaster_sync_dropped_replies_total", true,
     "held replies dropped, never sent (the master stopped serving, or they waited too long)"},
    {"framed_connections", "kvmaster_framed_connections", false,
     "framed RPC connections open now (--framed-listen)"},
    {"framed_accepted", "kvmaster_framed_accepted_total", true, "framed RPC connections accepted"},
    {"framed_refused", "kvmaster_framed_refused_total", true,
     "framed RPC connections closed at once: the connection limit was reached"},
    {"framed_bad_streams", "kvmaster_framed_bad_streams_total", true,
     "framed RPC connections closed for a stream that is not the protocol"},
    {"framed_slow_readers", "kvmaster_framed_slow_readers_total", true,
     "framed RPC connections closed because their replies piled up unread"},
    {"framed_unauthenticated", "kvmaster_framed_unauthenticated_total", true,
     "framed RPC connections closed because a request did not open under the cluster secret"},
    {"framed_handshake_timeouts", "kvmaster_framed_handshake_timeouts_total", true,
     "framed RPC connections closed because they did not prove themselves within 10 s"},
};

}  // namespace

void AppendMasterMetrics(const StatCounterList& counters, metrics::Exposition* out) {
  for (const auto& [name, value] : counters) {
    bool found = false;
    for (const Mapping& m : kTable) {
      if (m.stat != name) continue;
      found = true;
      if (m.counter) {
        out->Counter(m.metric, m.help, value);
      } else {
        out->Gauge(m.metric, m.help, static_cast<double>(value));
      }
    }
    if (found) continue;
    out->Gauge(metrics::FallbackName("kvmaster_", name),
               "kvctl stat counter master." + name + " (no stable name yet)",
               static_cast<double>(value));
  }
}

}  // namespace kvagent::master

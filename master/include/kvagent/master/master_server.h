// MasterServer: a MasterService behind a ZMQ ROUTER, with its KV events on an EventPublisher.
//
// One thread owns the ROUTER socket and the service (the service is single-threaded): it
// receives `[identity, b"", Request]`, answers `[identity, b"", Reply]` through MasterRpc,
// hands the events the requests produced to the publisher after each wake-up (a bounded queue
// drained by the publisher's own thread, so a slow subscriber never blocks a request), and runs
// MasterService::Tick every tick_ms. kvmaster is this class plus flags and signal handling.
//
// Followers (kvmaster --follow, or the members of an etcd cluster) fetch records with Replicate
// on the same socket: a request that finds nothing new is held up to its wait_ms and answered
// as soon as a record is made (a long poll), and its after_seq tells how far that follower is.
// With sync_followers = N, every other reply is held until N followers hold every record made up
// to it (a put is then acknowledged only once a follower has it); held replies are dropped, never
// sent, once the master may no longer serve.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <optional>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/status.h"
#include "kvagent/master/master_metrics.h"
#include "kvagent/master/types.h"

namespace kvagent::master {

struct MasterServerOptions {
  std::string listen = "tcp://0.0.0.0:50051";  // ROUTER for master.fbs requests
  // The same requests as length-prefixed frames on plain TCP, served on the loop's thread
  // (framed_rpc_server.h; docs/protocol.md "Framed RPC"); empty: none. With a secret, every
  // connection is encrypted and authenticated under it (version 2 of the wire).
  std::string framed_listen;
  std::string events = "tcp://0.0.0.0:5557";         // PUB, docs/events.md
  std::string events_replay = "tcp://0.0.0.0:5558";  // ROUTER replay; empty: none
  size_t replay_batches = 10000;
  int tick_ms = 50;  // period of Tick (agent TTL, put timeouts, delayed release, eviction)
  // systemd watchdog: the serving thread sends WATCHDOG=1 and a STATUS= line this often (0:
  // never), so a hung loop stops the pings (common/watchdog.h).
  std::chrono::microseconds watchdog_interval{0};
  MasterOptions master;
  // High availability: whether this master may serve now (its leadership is confirmed), asked
  // before every request (MasterRpc::set_may_serve) and every tick; while false it changes
  // nothing and publishes nothing. Cheap and thread-safe. Unset: always.
  std::function<bool()> may_serve;
  // Synchronous replication: replies wait until this many followers hold the records they
  // depend on (0: asynchronous).
  int sync_followers = 0;
  // Count only followers that can be elected (Replicate.electable) toward sync_followers: set
  // for an HA member, whose manual --follow standbys hold changes no elected leader has.
  bool sync_electable_only = false;
  // With a secret, the ROUTER is a CURVE server of the master-rpc plane and the event sockets'
  // tcp:// endpoints of the events plane (curve_auth.h); without one, all are plain.
  std::optional<ClusterSecret> secret;
};

class MasterServer {
 public:
  // Opens the service (replaying --state-dir), binds every socket, publishes the start events
  // (AllBlocksCleared, then the restored objects) and starts serving. Fails with a message
  // naming the endpoint or directory at fault. `clock` must outlive the server.
  static Result<std::unique_ptr<MasterServer>> Start(MasterServerOptions options,
                                                     const Clock* clock);
  // Stops serving, flushes the log and the queued events, closes the sockets.
  ~MasterServer();
  MasterServer(const MasterServer&) = delete;
  MasterServer& operator=(const MasterServer&) = delete;

  // The endpoints actually bound (port 0 resolved).
  const std::string& endpoint() const { return endpoint_; }
  // The framed RPC endpoint actually bound (empty: none).
  const std::string& framed_endpoint() const { return framed_endpoint_; }
  std::string events_endpoint() const;
  std::string replay_endpoint() const;

  // The master's epoch (MasterService::epoch) and its newest replicated record.
  uint64_t epoch() const;
  uint64_t last_seq() const;
  // The Stats counters ("master.*" of `kvctl stat`) as of the last tick (at most tick_ms old).
  // Any thread: the metrics endpoint reads them without disturbing the serving thread.
  StatCounterList StatsSnapshot() const;

 private:
  class Loop;
  MasterServer() = default;
  std::unique_ptr<Loop> loop_;
  std::string endpoint_;
  std::string framed_endpoint_;
};

}  // namespace kvagent::master

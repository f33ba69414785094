// RemoteMaster: the agent's link to kvmaster (`kvagent --master tcp://HOST:PORT`), a MasterPort.
//
// One link thread owns one ZMQ DEALER to the master's ROUTER (master.fbs framing:
// `[b"", Request]` out, `[b"", Reply]` back) and a monitor socket that reports the TCP
// connection's fate. The link:
//  - registers (stable name, random incarnation per process), mounts the node pool, and is
//    ready; heartbeats every `heartbeat`; a heartbeat answered `known=false` (the master
//    dropped or forgot us) re-registers and re-mounts;
//  - goes down when the connection drops, when registration fails, or when any request goes
//    unanswered for `timeout`: every request in flight fails at once with MASTER_UNAVAILABLE,
//    the socket is discarded (so no stale reply can arrive later), and the link reconnects with
//    exponential backoff (backoff_min doubling up to backoff_max);
//  - while not ready, Call fails at once with MASTER_UNAVAILABLE: nothing ever waits for a
//    master that is not there. CallUntilAnswered (a write's End) instead keeps its request
//    across link failures and sends it again after the next registration, until its retry
//    deadline: a put the master committed is then answered, not failed;
//  - applies the master's fences: the epoch at registration, the fenced writes of every
//    heartbeat reply (acknowledged in the next heartbeat);
//  - with a cluster address (`etcd://HOST:PORT[,HOST:PORT]/CLUSTER`) instead of a master's
//    endpoint, finds the master through etcd: a LeaderWatcher follows the cluster's leader key,
//    the link connects to the leader's endpoint and moves to the new leader as soon as the key
//    changes (no address to move). Epochs are then ordered: the link remembers the highest
//    epoch it has seen (from etcd and from replies) and refuses any reply of an older one — a
//    deposed leader that wakes up can change nothing here; a reply saying the master does not
//    serve (Reply.not_serving) takes the link down as a lost connection does.
// Requests from the service thread reach the link thread through a queue and an eventfd; replies
// go back through the PostFn given to Bind. On the framed transport, while the link is ready, the
// service thread instead writes its calls to the connection itself and, until it sleeps, reads
// their replies itself (TakeReplies): no thread hand-off either way. Never hangs: every request
// has a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvagent/agent/master_port.h"
#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/status.h"
#include "kvagent/coord/cluster_address.h"
#include "kvagent/events/kv_event.h"

namespace kvagent::master_link {

// The fences of one heartbeat reply (see master.fbs Heartbeat).
struct Fences {
  uint64_t master_epoch = 0;
  uint64_t fence_seq = 0;
  uint64_t write_watermark = 0;
  std::vector<uint64_t> fenced_writes;
};

enum class MasterTransport { kZmq, kFramed, kAuto };

struct RemoteMasterOptions {
  // kvmaster's ROUTER, e.g. tcp://10.0.0.1:50051, or a cluster, etcd://10.0.0.1:2379/prod
  std::string endpoint;
  std::string agent_name;    // stable across restarts of this agent (host name + run dir)
  uint64_t incarnation = 0;  // new for every process start (random)
  // The agent key (the run dir's agent.key), never shown: binds this agent to its name at
  // kvmaster (every request carries it; master.fbs RegisterAgent). 0: none (tests).
  uint64_t agent_key = 0;
  uint64_t pool_bytes = 0;    // the node pool, mounted as pool index 0
  std::string data_endpoint;  // where peers reach the pool (TransferEngine::endpoint())
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds timeout{5000};  // a request unanswered this long: link down
  std::chrono::milliseconds backoff_min{100};
  std::chrono::milliseconds backoff_max{5000};
  // Runs on the link thread when a registration finds a new kvmaster (another master epoch: it
  // restarted, its event stream started over): e.g. ask the event relay to re-announce. Not
  // after a reconnect to the same master. Must not block.
  std::function<void()> on_master_restarted;
  // Runs on the link thread after every registration reply, before the pool is mounted, with
  // the master's epoch (its incarnation): the pool must refuse ops placed by any other master
  // from when it returns (PoolFence::SetEpoch, then the data plane's Refence). May block briefly.
  std::function<void(uint64_t master_epoch)> set_master_epoch;
  // Runs on the link thread with each heartbeat reply's fences (master.fbs HeartbeatReply):
  // once it returns, no write the master fenced may land in the pool any more (PoolFence::Apply,
  // then Refence), and the next heartbeat acknowledges `fence_seq`. May block briefly.
  std::function<void(const Fences&)> apply_fences;
  // With a cluster address: runs on the link thread when it moves to a new leader (before it
  // registers there), with the leader's event endpoints, so the event relay follows it. Must
  // not block.
  std::function<void(const std::string& events, const std::string& replay)> on_leader_changed;
  // kvmaster's master-rpc keys when the cluster has a secret: the link is a CURVE client and
  // reaches only a kvmaster that holds the same secret (curve_auth.h).
  std::optional<CurvePlaneKeys> curve;
  // With a cluster address: `endpoint` parsed, with etcd's TLS files and user
  // (EtcdAccessFlags::Apply), as the caller checked it. Unset: `endpoint` is parsed here, and
  // an etcds:// address then verifies etcd against the system's CAs, without a user.
  std::optional<coord::ClusterAddress> cluster;
  // How the link speaks to kvmaster (docs/protocol.md "Framed RPC"):
  //   kZmq     its ROUTER at `endpoint` (with `curve`, CurveZMQ);
  //   kFramed  the framed RPC transport (kvmaster --framed-listen) at `endpoint` (tcp://HOST:PORT;
  //            with a cluster address, the framed endpoint the leader publishes): no I/O thread
  //            between the link and the socket. Not with `curve` (a ZMQ option);
  //   kAuto    the framed transport wherever kvmaster serves it, else ZMQ: each connection
  //            registers on the ROUTER at `endpoint` and, when the reply names a framed endpoint,
  //            moves to that port on the same host (with a cluster address: the leader's framed
  //            endpoint when it publishes one). A framed connection that fails before it is
  //            ready sends the link back to ZMQ for `framed_retry_after`, with one log line. Takes
  //            both `curve` and `framed_key` when the cluster has a secret.
  MasterTransport transport = MasterTransport::kZmq;
  // kAuto: how long the link stays on ZMQ after a framed connection failed before it was ready
  // (a firewall, a port not forwarded), before it tries the framed one again.
  std::chrono::milliseconds framed_retry_after{60000};
  // With kFramed or kAuto in a cluster with a secret: the framed plane's key (FramedRpcKey). The
  // link then reaches only a kvmaster that holds the same secret, and every frame is encrypted.
  std::optional<SymmetricKey> framed_key;
};

// One page of the master's ListKeys, for callers off the service thread (the event relay).
struct KeyPage {
  struct Key {
    std::string key;
    uint64_t size = 0;
    std::string session_id;  // "" when untagged
    // The writer's block metadata (block_hashes, parent, token_ids, block_size, lora_name);
    // empty block_hashes when none was given. See events::StoredEventFor.
    events::BlockStored block;
  };
  std::vector<Key> keys;
  uint64_t next_cursor = 0;
  bool restarted = false;
};

// OK when `endpoint` can name a kvmaster (tcp://HOST:PORT or ipc://PATH) or a cluster of them
// (etcd://HOST:PORT[,HOST:PORT]/CLUSTER); else INVALID_PARAMS with an example. For flag
// checking before anything starts.
Status CheckMasterEndpoint(std::string_view endpoint);

class RemoteMaster final : public agent::MasterPort {
 public:
  // Checks the options and starts the link thread, which connects and registers in the
  // background. INVALID_PARAMS when the endpoint is not tcp://HOST:PORT or ipc://PATH or an
  // option is out of range.
  static Result<std::unique_ptr<RemoteMaster>> Start(RemoteMasterOptions options);
  ~RemoteMaster() override;  // Stop()
  RemoteMaster(const RemoteMaster&) = delete;
  RemoteMaster& operator=(const RemoteMaster&) = delete;

  // Blocks until the link is ready or `limit` passes; true when ready. Any thread.
  bool WaitReady(std::chrono::milliseconds limit);

  // ListKeys through the link, blocking until the reply or the link's timeout. For threads other
  // than the service thread and the link thread (the event relay's content source).
  // MASTER_UNAVAILABLE when the link is down or the master does not answer.
  Result<KeyPage> ListKeys(uint64_t cursor, uint32_t limit);

  // The master's KV-event PUB and replay endpoints as its last registration reply told them
  // (host as the master bound it: a wildcard means the master's own address); nullopt until
  // registered with a master that tells them. Any thread.
  std::optional<std::pair<std::string, std::string>> EventEndpoints() const;

  // MasterPort (service thread, except ready/identity/Describe/AppendStats: any thread).
  void Bind(agent::PostFn post) override;
  void Call(flatbuffers::DetachedBuffer request, agent::MasterReplyFn done) override;
  void CallUntilAnswered(flatbuffers::DetachedBuffer request, agent::MasterReplyFn done,
                         Clock::time_point retry_until) override;
  bool ready() const override;
  agent::MasterIdentity identity() const override;
  std::string Describe() const override;
  void AppendStats(std::vector<std::pair<std::string, uint64_t>>* out) const override;
  // On the framed transport, while the service thread has calls out: reads the connection
  // there and runs the callbacks of the calls it answers (the rest goes to the link thread,
  // which meanwhile does not poll for input). StopTakingReplies hands reading back.
  bool TakeReplies() override;
  void StopTakingReplies() override;
  void Stop() override;

  class Shared;  // state shared with the link thread; private to the library

 private:
  explicit RemoteMaster(std::shared_ptr<Shared> shared);
  // Call or CallUntilAnswered (`retry_until`, else min()) on the framed transport while the
  // link is ready: written here, on the caller's thread (false: not now; the caller queues it
  // for the link thread as usual).
  bool CallDirect(flatbuffers::DetachedBuffer& request, agent::MasterReplyFn& done,
                  Clock::time_point retry_until);
  std::shared_ptr<Shared> shared_;
  // TakeReplies' scratch (service thread): the calls answered, their replies in taken_bytes_.
  struct Taken {
    agent::MasterReplyFn done;
    size_t at = 0;
    size_t size = 0;
  };
  std::vector<Taken> taken_;
  std::vector<uint8_t> taken_bytes_;
};

}  // namespace kvagent::master_link

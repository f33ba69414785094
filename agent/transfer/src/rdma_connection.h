// The pieces of the RDMA transport (see rdma_transport.h): the transport's state, and the two
// kinds of rdma_cm connection it owns, all living on the transport's EventLoop thread.
//
// NOTE: NEVER RUN. The machine this was written on has no RDMA device and no rdma kernel
// modules; this code is compiled (always) and reviewed, but no work request has gone through it.
//
// Lifetimes (the order verbs demands): a QP is destroyed before its CQ, both before the
// rdma_cm_id, all before the device's MRs and PD. Every CM event and CQ event is acknowledged
// as soon as it is read, so rdma_destroy_id / ibv_destroy_cq never wait. An op is finished only
// once no NIC can still touch its local memory: after its last work completion, or after its QP
// has been destroyed (timeout, shutdown).
#pragma once

#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "batch.h"
#include "event_loop.h"
#include "kvagent/common/errno_text.h"
#include "kvagent/transfer/node_pool.h"
#include "rdma_device.h"
#include "rdma_transport.h"

namespace kvagent::transfer {

// Connection private data, little-endian. Client -> server (rdma_connect): "KVRC" u32 |
// version u16 | 0 u16. Server -> client (rdma_accept): "KVRS" u32 | version u16 | 0 u16 |
// pool addr u64 | pool size u64 | rkey u32 | 0 u32 | pool incarnation u64.
struct PoolInfo {
  uint64_t addr = 0;
  uint64_t size = 0;
  uint32_t rkey = 0;
  uint64_t incarnation = 0;  // the client fails an op placed in another (pool_fence.h)
};
inline constexpr size_t kRdmaHelloBytes = 8;
inline constexpr size_t kPoolInfoBytes = 40;
void EncodeRdmaHello(uint8_t out[kRdmaHelloBytes]);
bool IsRdmaHello(const std::vector<uint8_t>& data);
void EncodePoolInfo(const PoolInfo& info, uint8_t out[kPoolInfoBytes]);
bool DecodePoolInfo(const std::vector<uint8_t>& data, PoolInfo* info);

// What we keep of a CM event; copied before the event is acknowledged.
struct CmEvent {
  rdma_cm_event_type type{};
  int status = 0;
  rdma_cm_id* id = nullptr;
  std::vector<uint8_t> private_data;
  uint8_t initiator_depth = 0;
  uint8_t responder_resources = 0;
};

// Receives the CM events of one rdma_cm_id (its `context`).
class CmTarget {
 public:
  virtual ~CmTarget() = default;
  virtual void OnCmEvent(const CmEvent& event) = 0;
};

// The verbs objects hanging off one rdma_cm_id, destroyed in the order verbs requires.
struct CmResources {
  rdma_cm_id* id = nullptr;
  ibv_cq* cq = nullptr;
  CmResources() = default;
  CmResources(const CmResources&) = delete;
  CmResources& operator=(const CmResources&) = delete;
  ~CmResources() { Release(); }
  void Release();
};

class ClientConnection;
class ServerConnection;

class RdmaTransport::State {
 public:
  State(NodePool* pool, const PoolFence* fence, std::chrono::milliseconds timeout,
        EngineCounters* counters)
      : pool_(pool), fence_(fence), timeout_(timeout), counters_(counters) {}
  ~State();
  Status Init(const ListenAddress& listen);
  // Fails every outstanding op, closes every connection, joins the thread.
  void Stop();

  RdmaDevice* FindDevice(ibv_context* verbs) const;
  void Start(std::vector<PendingOp> ops);
  // Discards a connection: fails its ops (client), disconnects, frees verbs objects now and
  // the C++ object after the current wake-up.
  void DropClient(ClientConnection* client, ErrorCode code, const std::string& reason);
  void DropServer(ServerConnection* server);
  void DrainCmEvents();
  int Tick();

  NodePool* pool_;
  const PoolFence* fence_;  // may be null
  std::chrono::milliseconds timeout_;
  EngineCounters* counters_;
  ibv_context** device_list_ = nullptr;  // rdma_get_devices; owns nothing we free ourselves
  std::vector<std::unique_ptr<RdmaDevice>> devices_;
  rdma_event_channel* cm_channel_ = nullptr;
  rdma_cm_id* listen_id_ = nullptr;
  uint16_t port_ = 0;
  bool stopped_ = false;
  std::unique_ptr<EventLoop> loop_;
  std::vector<std::unique_ptr<EventLoop::Handler>> watches_;
  std::unordered_map<std::string, std::unique_ptr<ClientConnection>> clients_;  // by endpoint
  std::unordered_map<ServerConnection*, std::unique_ptr<ServerConnection>> servers_;
  std::vector<std::unique_ptr<CmTarget>> graveyard_;

 private:
  void OnConnectRequest(const CmEvent& event);
};

// A peer's passive end: holds the QP that the peer's one-sided ops target. No CPU work per op.
class ServerConnection final : public CmTarget {
 public:
  ServerConnection(RdmaTransport::State* state, rdma_cm_id* id);
  // Creates the QP and accepts with the pool's address, size and rkey as private data. On an
  // error the caller rejects and destroys the connection.
  [[nodiscard]] Status Accept(const CmEvent& request);
  void Reject(const std::string& why);
  void OnCmEvent(const CmEvent& event) override;
  void Close();

 private:
  RdmaTransport::State* state_;
  CmResources res_;
  std::string peer_;
};

// Our active end towards one peer: resolve address -> resolve route -> connect -> ready, then
// ops become signaled RDMA WRITE/READ work requests (split at the port's max message size).
class ClientConnection final : public CmTarget {
 public:
  ClientConnection(RdmaTransport::State* state, Endpoint peer, std::string key);

  const std::string& key() const { return key_; }
  bool has_work() const { return phase_ != Phase::kReady || !ops_.empty(); }
  std::chrono::steady_clock::time_point last_progress() const { return last_progress_; }
  const char* PhaseName() const;

  // Starts address resolution.
  [[nodiscard]] Status Open();
  void Enqueue(PendingOp op);
  void Kick() { PostMore(); }
  void OnCmEvent(const CmEvent& event) override;
  // Polls the CQ after a completion event (re-arming first, so no completion goes unnoticed).
  void OnCompletions();
  // Destroys the QP first (after that no NIC touches local memory), then finishes every op:
  // with its own completion error if it has one, else with `code` / `reason`.
  void Abort(ErrorCode code, const std::string& reason);

 private:
  enum class Phase { kAddress, kRoute, kConnecting, kReady, kBroken };
  struct Op {
    PendingOp op;
    uint32_t lkey = 0;
    uint64_t chunks = 0;  // work requests this op needs
    uint64_t posted = 0;
    uint64_t done = 0;
    Status error;  // first failed completion
  };

  int TimeoutMs() const;
  void Fail(const std::string& reason);
  // The QP is unusable: stop posting; rdma_disconnect moves it to the error state, so every
  // posted work request completes (flushed) and OnCompletions finishes the drop. MarkBroken
  // never drops the connection (safe while iterating over ops_); Break also drops it when
  // nothing is left to flush.
  void MarkBroken(const std::string& reason);
  void Break(const std::string& reason);
  void Connect();
  void Established(const CmEvent& event);
  // Checks an op against the peer's pool and our registrations; finishes it when it fails.
  bool Admit(uint64_t slot);
  void PostMore();
  void Complete(const ibv_wc& wc);

  RdmaTransport::State* state_;
  Endpoint peer_;
  std::string key_;
  CmResources res_;
  RdmaDevice* device_ = nullptr;
  Phase phase_ = Phase::kAddress;
  bool dead_ = false;
  std::chrono::steady_clock::time_point last_progress_;
  PoolInfo remote_;
  uint64_t max_message_ = 0;
  uint32_t depth_ = 1;
  uint32_t outstanding_ = 0;      // posted work requests not yet completed (<= depth_)
  std::map<uint64_t, Op> ops_;    // by slot (submission order)
  std::deque<uint64_t> to_post_;  // slots with work requests still to post
  uint64_t next_slot_ = 1;
  std::string broken_reason_;
};

std::string PeerOf(rdma_cm_id* id);  // "10.0.0.2:7100" for logs

}  // namespace kvagent::transfer

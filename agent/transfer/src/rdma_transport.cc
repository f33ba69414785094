// RDMA data plane: rdma_cm connection setup, RC QPs, one-sided RDMA WRITE / READ.
//
// NOTE: NEVER RUN. The machine this was written on has no RDMA device and no rdma kernel
// modules, so this file is compiled (always) and reviewed line by line, but no test has sent a
// work request through it. The engine only reaches it when ibv_get_device_list finds a device.
//
// Threading: everything below runs on the transport's own EventLoop thread (rdma_cm events and
// completion events are both fds in its epoll set), except Submit (posts to the loop) and
// Register/UnregisterMemory (RdmaDevice guards its MR table).
//
// Lifetimes (the order verbs demands): a QP is destroyed before its CQ, both before the
// rdma_cm_id, all before the device's MRs and PD. Every CM event and CQ event is acknowledged
// as soon as it is read, so rdma_destroy_id / ibv_destroy_cq never wait. An op is finished only
// once no NIC can still touch its local memory: after its last work completion, or after its QP
// has been destroyed (timeout, shutdown).
#include "rdma_transport.h"

#include <endian.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <unordered_map>

#include "event_loop.h"
#include "kvagent/transfer/rdma_probe.h"
#include "rdma_device.h"
#include "socket.h"

namespace kvagent::transfer {
namespace {

using Clock = std::chrono::steady_clock;

// Connection private data. Client -> server (rdma_connect): "KVRC" u32 | version u16 | 0 u16.
// Server -> client (rdma_accept): "KVRS" u32 | version u16 | 0 u16 | pool addr u64 |
// pool size u64 | rkey u32 | 0 u32. Little-endian.
constexpr uint32_t kHelloMagic = 0x4352564B;
constexpr uint32_t kPoolInfoMagic = 0x5352564B;
constexpr uint16_t kRdmaVersion = 1;
constexpr size_t kHelloBytes = 8;
constexpr size_t kPoolInfoBytes = 32;

constexpr uint32_t kSendDepth = 128;  // signaled work requests in flight per QP
constexpr uint8_t kMaxReadsInFlight = 16;
constexpr int kPollBatch = 32;

struct PoolInfo {
  uint64_t addr = 0;
  uint64_t size = 0;
  uint32_t rkey = 0;
};

template <typename T>
void PutLe(uint8_t* out, T value) {
  if constexpr (sizeof(T) == 2) value = htole16(value);
  if constexpr (sizeof(T) == 4) value = htole32(value);
  if constexpr (sizeof(T) == 8) value = htole64(value);
  std::memcpy(out, &value, sizeof(T));
}
template <typename T>
T GetLe(const uint8_t* in) {
  T value;
  std::memcpy(&value, in, sizeof(T));
  if constexpr (sizeof(T) == 2) return le16toh(value);
  if constexpr (sizeof(T) == 4) return le32toh(value);
  if constexpr (sizeof(T) == 8) return le64toh(value);
}

bool IsHello(const std::vector<uint8_t>& data) {
  return data.size() >= kHelloBytes && GetLe<uint32_t>(data.data()) == kHelloMagic &&
         GetLe<uint16_t>(data.data() + 4) == kRdmaVersion;
}

bool DecodePoolInfo(const std::vector<uint8_t>& data, PoolInfo* info) {
  if (data.size() < kPoolInfoBytes || GetLe<uint32_t>(data.data()) != kPoolInfoMagic ||
      GetLe<uint16_t>(data.data() + 4) != kRdmaVersion) {
    return false;
  }
  info->addr = GetLe<uint64_t>(data.data() + 8);
  info->size = GetLe<uint64_t>(data.data() + 16);
  info->rkey = GetLe<uint32_t>(data.data() + 24);
  return true;
}

// What we keep of a CM event; taken before the event is acknowledged.
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
  void Release() {
    if (id != nullptr && id->qp != nullptr) rdma_destroy_qp(id);
    if (cq != nullptr) ibv_destroy_cq(cq);
    cq = nullptr;
    if (id != nullptr) rdma_destroy_id(id);
    id = nullptr;
  }
};

std::string PeerOf(rdma_cm_id* id) {
  SocketAddress address;
  const sockaddr* peer = rdma_get_peer_addr(id);
  if (peer == nullptr) return "unknown peer";
  address.length = peer->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(&address.storage, peer, address.length);
  return FormatAddress(address);
}

std::string Errno(const char* call) { return std::string(call) + " failed: " + strerror(errno); }

}  // namespace

class ClientConnection;
class ServerConnection;

class RdmaTransport::State {
 public:
  State(NodePool* pool, std::chrono::milliseconds timeout, EngineCounters* counters)
      : pool_(pool), timeout_(timeout), counters_(counters) {}
  ~State();
  Status Init(const ListenAddress& listen);
  void Stop();

  RdmaDevice* FindDevice(ibv_context* verbs) {
    for (auto& device : devices_) {
      if (device->verbs() == verbs) return device.get();
    }
    return nullptr;
  }
  void Start(std::vector<PendingOp> ops);
  void DropClient(ClientConnection* client, ErrorCode code, const std::string& reason);
  void DropServer(ServerConnection* server);
  void OnConnectRequest(const CmEvent& event);
  void DrainCmEvents();
  int Tick();

  NodePool* pool_;
  std::chrono::milliseconds timeout_;
  EngineCounters* counters_;
  ibv_context** device_list_ = nullptr;
  std::vector<std::unique_ptr<RdmaDevice>> devices_;
  rdma_event_channel* cm_channel_ = nullptr;
  rdma_cm_id* listen_id_ = nullptr;
  uint16_t port_ = 0;
  bool stopped_ = false;
  std::unique_ptr<EventLoop> loop_;
  std::vector<std::unique_ptr<EventLoop::Handler>> watches_;
  std::unordered_map<std::string, std::unique_ptr<ClientConnection>> clients_;
  std::unordered_map<ServerConnection*, std::unique_ptr<ServerConnection>> servers_;
  std::vector<std::unique_ptr<CmTarget>> graveyard_;
};

// A peer's passive end: holds the QP that peers' one-sided ops target. No CPU work per op.
class ServerConnection final : public CmTarget {
 public:
  ServerConnection(RdmaTransport::State* state, rdma_cm_id* id) : state_(state) {
    res_.id = id;
    id->context = static_cast<CmTarget*>(this);
  }

  Status Accept(const CmEvent& request) {
    peer_ = PeerOf(res_.id);
    if (!IsHello(request.private_data)) return InvalidParams("not a kvagent RDMA client");
    RdmaDevice* device = state_->FindDevice(res_.id->verbs);
    if (device == nullptr) return Internal("connection on a device without the pool");
    res_.cq = ibv_create_cq(res_.id->verbs, 2, nullptr, nullptr, 0);
    if (res_.cq == nullptr) return Internal(Errno("ibv_create_cq"));
    ibv_qp_init_attr init{};
    init.send_cq = res_.cq;
    init.recv_cq = res_.cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 1;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    if (rdma_create_qp(res_.id, device->pd(), &init) != 0) {
      return Internal(Errno("rdma_create_qp"));
    }
    uint8_t info[kPoolInfoBytes] = {};
    PutLe<uint32_t>(info, kPoolInfoMagic);
    PutLe<uint16_t>(info + 4, kRdmaVersion);
    PutLe<uint64_t>(info + 8, reinterpret_cast<uint64_t>(state_->pool_->base()));
    PutLe<uint64_t>(info + 16, state_->pool_->size());
    PutLe<uint32_t>(info + 24, device->pool_rkey());
    rdma_conn_param param{};
    param.private_data = info;
    param.private_data_len = sizeof(info);
    // We answer the peer's RDMA READs (responder) and initiate nothing.
    param.responder_resources =
        static_cast<uint8_t>(std::min<int>(request.initiator_depth, device->attr().max_qp_rd_atom));
    param.initiator_depth = static_cast<uint8_t>(
        std::min<int>(request.responder_resources, device->attr().max_qp_init_rd_atom));
    param.rnr_retry_count = 7;
    if (rdma_accept(res_.id, &param) != 0) return Internal(Errno("rdma_accept"));
    return Status::Ok();
  }

  void Reject(const std::string& why) {
    LOG(WARNING) << "RDMA: refusing connection from " << PeerOf(res_.id) << ": " << why;
    rdma_reject(res_.id, nullptr, 0);
  }

  void OnCmEvent(const CmEvent& event) override {
    if (event.type == RDMA_CM_EVENT_ESTABLISHED) {
      VLOG(1) << "RDMA: peer " << peer_ << " connected";
    } else if (event.type == RDMA_CM_EVENT_DISCONNECTED ||
               event.type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      state_->DropServer(this);
    }
  }

  void Close() {
    if (res_.id != nullptr) rdma_disconnect(res_.id);
    res_.Release();
  }

 private:
  RdmaTransport::State* state_;
  CmResources res_;
  std::string peer_;
};

// Our active end towards one peer: resolve address -> resolve route -> connect -> ready.
class ClientConnection final : public CmTarget {
 public:
  ClientConnection(RdmaTransport::State* state, Endpoint peer, std::string key)
      : state_(state), peer_(std::move(peer)), key_(std::move(key)) {}

  const std::string& key() const { return key_; }
  bool has_work() const { return phase_ != Phase::kReady || !ops_.empty(); }
  Clock::time_point last_progress() const { return last_progress_; }
  const char* PhaseName() const {
    static constexpr const char* kNames[] = {"resolving the address", "resolving the route",
                                             "connecting", "waiting for completions",
                                             "draining after an error"};
    return kNames[static_cast<int>(phase_)];
  }

  Status Open() {
    if (rdma_create_id(state_->cm_channel_, &res_.id, static_cast<CmTarget*>(this), RDMA_PS_TCP) !=
        0) {
      return Status(ErrorCode::kTransferFailed, Errno("rdma_create_id"));
    }
    Result<SocketAddress> address = NumericAddress(peer_.host, peer_.port);
    if (!address.ok()) return address.status();
    if (rdma_resolve_addr(res_.id, nullptr, const_cast<sockaddr*>(address->get()), TimeoutMs()) !=
        0) {
      return Status(ErrorCode::kTransferFailed, Errno("rdma_resolve_addr"));
    }
    EngineCounters::Add(state_->counters_->connections_opened);
    last_progress_ = Clock::now();
    return Status::Ok();
  }

  void Enqueue(PendingOp op) {
    if (!has_work()) last_progress_ = Clock::now();
    const uint64_t slot = next_slot_++;
    Op entry;
    entry.op = std::move(op);
    ops_.emplace(slot, std::move(entry));
    if (phase_ == Phase::kReady && !Admit(slot)) return;
    to_post_.push_back(slot);
  }

  void Kick() { PostMore(); }

  void OnCmEvent(const CmEvent& event) override {
    switch (event.type) {
      case RDMA_CM_EVENT_ADDR_RESOLVED:
        phase_ = Phase::kRoute;
        if (rdma_resolve_route(res_.id, TimeoutMs()) != 0) return Fail(Errno("rdma_resolve_route"));
        return;
      case RDMA_CM_EVENT_ROUTE_RESOLVED:
        return Connect();
      case RDMA_CM_EVENT_ESTABLISHED:
        return Established(event);
      case RDMA_CM_EVENT_DISCONNECTED:
        if (outstanding_ == 0) return Fail("peer disconnected");
        return Break("peer disconnected");
      case RDMA_CM_EVENT_ADDR_ERROR:
      case RDMA_CM_EVENT_ROUTE_ERROR:
      case RDMA_CM_EVENT_CONNECT_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        return Fail(std::string("cannot reach the peer: ") + rdma_event_str(event.type) +
                    " (status " + std::to_string(event.status) + ")");
      default:
        return;
    }
  }

  // Polls the CQ after a completion event; re-arms first so no completion goes unnoticed.
  void OnCompletions() {
    if (dead_) return;
    ibv_req_notify_cq(res_.cq, 0);
    ibv_wc wc[kPollBatch];
    for (;;) {
      const int n = ibv_poll_cq(res_.cq, kPollBatch, wc);
      if (n < 0) return Fail("ibv_poll_cq failed");
      if (n == 0) break;
      last_progress_ = Clock::now();
      for (int i = 0; i < n; ++i) Complete(wc[i]);
    }
    if (phase_ == Phase::kBroken) {
      if (outstanding_ == 0) Fail(broken_reason_);
      return;
    }
    PostMore();
  }

  // Destroys the QP first (after that no NIC touches local memory), then finishes every op:
  // with its own completion error if it has one, else with `code` / `reason`.
  void Abort(ErrorCode code, const std::string& reason) {
    dead_ = true;
    res_.Release();
    for (auto& [slot, op] : ops_) {
      if (!op.error.ok()) {
        op.op.Finish(std::move(op.error));
      } else {
        op.op.Fail(code, reason);
      }
    }
    ops_.clear();
    to_post_.clear();
  }

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

  int TimeoutMs() const {
    return static_cast<int>(std::min<int64_t>(state_->timeout_.count(), 60000));
  }

  void Fail(const std::string& reason) {
    state_->DropClient(this, ErrorCode::kTransferFailed, reason);
  }

  // The QP is unusable: stop posting; rdma_disconnect moves it to the error state, so every
  // posted work request completes (flushed) and OnCompletions finishes the drop.
  // MarkBroken never drops the connection (safe while iterating over ops_); Break also drops
  // it when nothing is left to flush.
  void MarkBroken(const std::string& reason) {
    if (phase_ == Phase::kBroken) return;
    phase_ = Phase::kBroken;
    broken_reason_ = reason;
    rdma_disconnect(res_.id);
  }
  void Break(const std::string& reason) {
    MarkBroken(reason);
    if (outstanding_ == 0) Fail(broken_reason_);
  }

  void Connect() {
    device_ = state_->FindDevice(res_.id->verbs);
    if (device_ == nullptr) return Fail("the route uses a device without the node pool");
    ibv_port_attr port{};
    if (ibv_query_port(res_.id->verbs, res_.id->port_num, &port) != 0) {
      return Fail(Errno("ibv_query_port"));
    }
    max_message_ = port.max_msg_sz;
    depth_ = std::min<uint32_t>(kSendDepth, static_cast<uint32_t>(device_->attr().max_qp_wr));
    res_.cq =
        ibv_create_cq(res_.id->verbs, static_cast<int>(depth_) + 1, this, device_->channel(), 0);
    if (res_.cq == nullptr) return Fail(Errno("ibv_create_cq"));
    if (ibv_req_notify_cq(res_.cq, 0) != 0) return Fail(Errno("ibv_req_notify_cq"));
    ibv_qp_init_attr init{};
    init.send_cq = res_.cq;
    init.recv_cq = res_.cq;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = depth_;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    if (rdma_create_qp(res_.id, device_->pd(), &init) != 0) return Fail(Errno("rdma_create_qp"));
    uint8_t hello[kHelloBytes] = {};
    PutLe<uint32_t>(hello, kHelloMagic);
    PutLe<uint16_t>(hello + 4, kRdmaVersion);
    const auto& attr = device_->attr();
    rdma_conn_param param{};
    param.private_data = hello;
    param.private_data_len = sizeof(hello);
    param.initiator_depth =
        static_cast<uint8_t>(std::min<int>(kMaxReadsInFlight, attr.max_qp_init_rd_atom));
    param.responder_resources =
        static_cast<uint8_t>(std::min<int>(kMaxReadsInFlight, attr.max_qp_rd_atom));
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    phase_ = Phase::kConnecting;
    if (rdma_connect(res_.id, &param) != 0) return Fail(Errno("rdma_connect"));
  }

  void Established(const CmEvent& event) {
    if (!DecodePoolInfo(event.private_data, &remote_)) {
      return Fail("peer sent no pool description (is this a kvagent rdma:// endpoint?)");
    }
    phase_ = Phase::kReady;
    last_progress_ = Clock::now();
    std::deque<uint64_t> queued;
    queued.swap(to_post_);
    for (uint64_t slot : queued) {
      if (Admit(slot)) to_post_.push_back(slot);
    }
    PostMore();
  }

  // Checks an op against the peer's pool and our registrations; finishes it when it fails.
  bool Admit(uint64_t slot) {
    Op& op = ops_.at(slot);
    Status range =
        CheckPoolRange(op.op.remote_offset, op.op.length, remote_.size, "pool of " + key_);
    if (!range.ok()) {
      op.op.Finish(Status(range.code(), op.op.Describe() + ": " + range.message()));
      ops_.erase(slot);
      return false;
    }
    if (!device_->FindLkey(op.op.local, op.op.length, &op.lkey)) {
      op.op.Fail(ErrorCode::kInvalidParams,
                 "local memory is not registered with RDMA device " + device_->name() +
                     "; call TransferEngine::RegisterMemory for the arena at attach");
      ops_.erase(slot);
      return false;
    }
    op.chunks = WorkRequestCount(op.op.length, max_message_);
    return true;
  }

  void PostMore() {
    while (phase_ == Phase::kReady && outstanding_ < depth_ && !to_post_.empty()) {
      const uint64_t slot = to_post_.front();
      Op& op = ops_.at(slot);
      const uint64_t chunk = WorkRequestLength(op.op.length, max_message_, 0);
      const uint64_t offset = op.posted * chunk;
      ibv_sge sge{};
      sge.addr = reinterpret_cast<uint64_t>(op.op.local + offset);
      sge.length = static_cast<uint32_t>(WorkRequestLength(op.op.length, max_message_, op.posted));
      sge.lkey = op.lkey;
      ibv_send_wr wr{};
      wr.wr_id = slot;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = op.op.kind == TransferKind::kWrite ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = remote_.addr + op.op.remote_offset + offset;
      wr.wr.rdma.rkey = remote_.rkey;
      ibv_send_wr* bad = nullptr;
      const int rc = ibv_post_send(res_.id->qp, &wr, &bad);
      if (rc != 0) return Break(std::string("ibv_post_send failed: ") + strerror(rc));
      ++outstanding_;
      if (++op.posted == op.chunks) to_post_.pop_front();
    }
  }

  void Complete(const ibv_wc& wc) {
    --outstanding_;
    auto it = ops_.find(wc.wr_id);
    if (it == ops_.end()) return;
    Op& op = it->second;
    ++op.done;
    if (wc.status != IBV_WC_SUCCESS) {
      const std::string what = std::string("RDMA completion error: ") +
                               ibv_wc_status_str(wc.status) + " (vendor error " +
                               std::to_string(wc.vendor_err) + ")";
      if (op.error.ok()) {
        op.error = Status(ErrorCode::kTransferFailed, op.op.Describe() + ": " + what);
      }
      MarkBroken(what);
    }
    if (op.done == op.chunks) {
      op.op.Finish(op.error.ok() ? Status::Ok() : std::move(op.error));
      ops_.erase(it);
    }
  }

  RdmaTransport::State* state_;
  Endpoint peer_;
  std::string key_;
  CmResources res_;
  RdmaDevice* device_ = nullptr;
  Phase phase_ = Phase::kAddress;
  bool dead_ = false;
  Clock::time_point last_progress_;
  PoolInfo remote_;
  uint64_t max_message_ = 0;
  uint32_t depth_ = 1;
  uint32_t outstanding_ = 0;    // posted work requests not yet completed
  std::map<uint64_t, Op> ops_;  // by slot (submission order)
  std::deque<uint64_t> to_post_;
  uint64_t next_slot_ = 1;
  std::string broken_reason_;
};

namespace {

// Reads rdma_cm events until EAGAIN.
class CmWatch final : public EventLoop::Handler {
 public:
  explicit CmWatch(RdmaTransport::State* state) : state_(state) {}
  void OnEvents(uint32_t) override { state_->DrainCmEvents(); }

 private:
  RdmaTransport::State* state_;
};

// Reads completion events of one device's channel until EAGAIN; each names a client's CQ.
class CompletionWatch final : public EventLoop::Handler {
 public:
  explicit CompletionWatch(ibv_comp_channel* channel) : channel_(channel) {}
  void OnEvents(uint32_t) override {
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    while (ibv_get_cq_event(channel_, &cq, &context) == 0) {
      ibv_ack_cq_events(cq, 1);
      static_cast<ClientConnection*>(context)->OnCompletions();
    }
  }

 private:
  ibv_comp_channel* channel_;
};

}  // namespace

void RdmaTransport::State::DrainCmEvents() {
  rdma_cm_event* raw = nullptr;
  while (rdma_get_cm_event(cm_channel_, &raw) == 0) {
    CmEvent event;
    event.type = raw->event;
    event.status = raw->status;
    event.id = raw->id;
    const auto& conn = raw->param.conn;
    if (conn.private_data != nullptr && conn.private_data_len > 0) {
      const auto* bytes = static_cast<const uint8_t*>(conn.private_data);
      event.private_data.assign(bytes, bytes + conn.private_data_len);
    }
    event.initiator_depth = conn.initiator_depth;
    event.responder_resources = conn.responder_resources;
    rdma_ack_cm_event(raw);
    if (event.type == RDMA_CM_EVENT_CONNECT_REQUEST) {
      OnConnectRequest(event);
    } else if (event.id == listen_id_) {
      LOG(ERROR) << "RDMA: listener event " << rdma_event_str(event.type);
    } else if (event.id->context != nullptr) {
      static_cast<CmTarget*>(event.id->context)->OnCmEvent(event);
    }
  }
}

void RdmaTransport::State::OnConnectRequest(const CmEvent& event) {
  auto server = std::make_unique<ServerConnection>(this, event.id);
  Status accepted = server->Accept(event);
  if (!accepted.ok()) {
    server->Reject(accepted.message());
    return;  // ~ServerConnection releases the QP, the CQ and the id
  }
  ServerConnection* raw = server.get();
  servers_.emplace(raw, std::move(server));
}

void RdmaTransport::State::DropServer(ServerConnection* server) {
  auto it = servers_.find(server);
  if (it == servers_.end()) return;
  it->second->Close();
  graveyard_.push_back(std::move(it->second));
  servers_.erase(it);
  if (graveyard_.size() == 1) loop_->Post([this] { graveyard_.clear(); });
}

void RdmaTransport::State::DropClient(ClientConnection* client, ErrorCode code,
                                      const std::string& reason) {
  auto it = clients_.find(client->key());
  if (it == clients_.end() || it->second.get() != client) return;
  std::unique_ptr<ClientConnection> owned = std::move(it->second);
  clients_.erase(it);
  if (owned->has_work()) LOG(WARNING) << "RDMA: connection to " << owned->key() << ": " << reason;
  owned->Abort(code, reason);
  graveyard_.push_back(std::move(owned));
  if (graveyard_.size() == 1) loop_->Post([this] { graveyard_.clear(); });
}

void RdmaTransport::State::Start(std::vector<PendingOp> ops) {
  DispatchToPeers(
      std::move(ops), clients_,
      [this](PendingOp& op, const std::string& key) {
        auto client = std::make_unique<ClientConnection>(this, op.peer, key);
        Status opened = client->Open();
        if (opened.ok()) return client;
        op.Fail(ErrorCode::kTransferFailed, "cannot reach the peer: " + opened.message());
        return std::unique_ptr<ClientConnection>();
      },
      [](ClientConnection* client, PendingOp op) { client->Enqueue(std::move(op)); },
      [](ClientConnection* client) { client->Kick(); });
}

int RdmaTransport::State::Tick() {
  return ExpireStalledPeers(clients_, timeout_, [this](ClientConnection* client) {
    DropClient(client, ErrorCode::kTimeout,
               "peer made no progress for " + std::to_string(timeout_.count()) + " ms (" +
                   client->PhaseName() + "); connection closed");
  });
}

Status RdmaTransport::State::Init(const ListenAddress& listen) {
  int count = 0;
  device_list_ = rdma_get_devices(&count);
  if (device_list_ == nullptr || count == 0) {
    return Internal("rdma_get_devices found no RDMA device; use --data-transport=tcp");
  }
  KVAGENT_RETURN_IF_ERROR(CheckMemlockForRegistration(pool_->size() * static_cast<uint64_t>(count),
                                                      CurrentMemlockLimit(), HasCapIpcLock()));
  for (int i = 0; i < count; ++i) {
    Result<std::unique_ptr<RdmaDevice>> device = RdmaDevice::Open(device_list_[i]);
    if (!device.ok()) return device.status();
    KVAGENT_RETURN_IF_ERROR((*device)->RegisterPool(pool_->base(), pool_->size()));
    devices_.push_back(std::move(*device));
  }
  cm_channel_ = rdma_create_event_channel();
  if (cm_channel_ == nullptr) return Internal(Errno("rdma_create_event_channel"));
  const int flags = fcntl(cm_channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(cm_channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return Internal(Errno("fcntl(O_NONBLOCK) on the rdma_cm channel"));
  }
  if (rdma_create_id(cm_channel_, &listen_id_, nullptr, RDMA_PS_TCP) != 0) {
    return Internal(Errno("rdma_create_id"));
  }
  Result<SocketAddress> address = NumericAddress(listen.host, listen.port);
  if (!address.ok()) return address.status();
  if (rdma_bind_addr(listen_id_, const_cast<sockaddr*>(address->get())) != 0) {
    return Internal(Errno("rdma_bind_addr") + " for " + FormatAddress(*address));
  }
  if (rdma_listen(listen_id_, 128) != 0) return Internal(Errno("rdma_listen"));
  port_ = ntohs(rdma_get_src_port(listen_id_));

  Result<std::unique_ptr<EventLoop>> loop = EventLoop::Create("kvagent-rdma");
  if (!loop.ok()) return loop.status();
  loop_ = std::move(*loop);
  watches_.push_back(std::make_unique<CmWatch>(this));
  KVAGENT_RETURN_IF_ERROR(loop_->Add(cm_channel_->fd, EPOLLIN, watches_.back().get()));
  for (auto& device : devices_) {
    watches_.push_back(std::make_unique<CompletionWatch>(device->channel()));
    KVAGENT_RETURN_IF_ERROR(loop_->Add(device->channel()->fd, EPOLLIN, watches_.back().get()));
  }
  loop_->Start([this] { return Tick(); });
  return Status::Ok();
}

void RdmaTransport::State::Stop() {
  if (!loop_ || stopped_) return;
  stopped_ = true;
  loop_->Post([this] {
    std::vector<ClientConnection*> clients;
    for (auto& [key, client] : clients_) clients.push_back(client.get());
    for (ClientConnection* client : clients) {
      DropClient(client, ErrorCode::kTransferFailed, "transfer engine shutting down");
    }
    std::vector<ServerConnection*> servers;
    for (auto& [raw, server] : servers_) servers.push_back(raw);
    for (ServerConnection* server : servers) DropServer(server);
  });
  loop_->Stop();
}

RdmaTransport::State::~State() {
  Stop();
  graveyard_.clear();
  clients_.clear();
  servers_.clear();
  loop_.reset();
  if (listen_id_ != nullptr) rdma_destroy_id(listen_id_);
  if (cm_channel_ != nullptr) rdma_destroy_event_channel(cm_channel_);
  devices_.clear();  // MRs, channels, PDs: after every QP and CQ is gone
  if (device_list_ != nullptr) rdma_free_devices(device_list_);
}

Result<std::unique_ptr<RdmaTransport>> RdmaTransport::Start(NodePool* pool,
                                                            const ListenAddress& listen,
                                                            std::chrono::milliseconds timeout,
                                                            EngineCounters* counters) {
  auto state = std::make_unique<State>(pool, timeout, counters);
  KVAGENT_RETURN_IF_ERROR(state->Init(listen));
  return std::unique_ptr<RdmaTransport>(new RdmaTransport(std::move(state)));
}

RdmaTransport::RdmaTransport(std::unique_ptr<State> state) : state_(std::move(state)) {}
RdmaTransport::~RdmaTransport() = default;

uint16_t RdmaTransport::port() const { return state_->port_; }

void RdmaTransport::Submit(std::vector<PendingOp> ops) {
  state_->loop_->Post(
      [state = state_.get(), ops = std::move(ops)]() mutable { state->Start(std::move(ops)); });
}

Status RdmaTransport::RegisterMemory(void* addr, uint64_t length) {
  for (size_t i = 0; i < state_->devices_.size(); ++i) {
    Status registered = state_->devices_[i]->RegisterLocal(addr, length);
    if (!registered.ok()) {
      for (size_t j = 0; j < i; ++j) state_->devices_[j]->DeregisterLocal(addr);
      return registered;
    }
  }
  return Status::Ok();
}

void RdmaTransport::UnregisterMemory(void* addr) {
  for (auto& device : state_->devices_) device->DeregisterLocal(addr);
}

}  // namespace kvagent::transfer

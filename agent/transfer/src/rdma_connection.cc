// NOTE: NEVER RUN - compiled and reviewed only; the build machine has no RDMA device. See
// rdma_connection.h for the lifetime rules this file follows.
#include "rdma_connection.h"

#include <endian.h>
#include <glog/logging.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kvagent/common/errno_text.h"
#include "kvagent/transfer/rdma_probe.h"
#include "socket.h"

namespace kvagent::transfer {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kHelloMagic = 0x4352564B;     // "KVRC"
constexpr uint32_t kPoolInfoMagic = 0x5352564B;  // "KVRS"
constexpr uint16_t kRdmaVersion = 2;
constexpr uint32_t kSendDepth = 128;  // signaled work requests in flight per QP
constexpr uint8_t kMaxReadsInFlight = 16;
constexpr int kPollBatch = 32;

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

}  // namespace

void EncodeRdmaHello(uint8_t out[kRdmaHelloBytes]) {
  std::memset(out, 0, kRdmaHelloBytes);
  PutLe<uint32_t>(out, kHelloMagic);
  PutLe<uint16_t>(out + 4, kRdmaVersion);
}

bool IsRdmaHello(const std::vector<uint8_t>& data) {
  return data.size() >= kRdmaHelloBytes && GetLe<uint32_t>(data.data()) == kHelloMagic &&
         GetLe<uint16_t>(data.data() + 4) == kRdmaVersion;
}

void EncodePoolInfo(const PoolInfo& info, uint8_t out[kPoolInfoBytes]) {
  std::memset(out, 0, kPoolInfoBytes);
  PutLe<uint32_t>(out, kPoolInfoMagic);
  PutLe<uint16_t>(out + 4, kRdmaVersion);
  PutLe<uint64_t>(out + 8, info.addr);
  PutLe<uint64_t>(out + 16, info.size);
  PutLe<uint32_t>(out + 24, info.rkey);
  PutLe<uint64_t>(out + 32, info.incarnation);
}

bool DecodePoolInfo(const std::vector<uint8_t>& data, PoolInfo* info) {
  // IB pads the REP private data to its full size: accept anything at least this long.
  if (data.size() < kPoolInfoBytes || GetLe<uint32_t>(data.data()) != kPoolInfoMagic ||
      GetLe<uint16_t>(data.data() + 4) != kRdmaVersion) {
    return false;
  }
  info->addr = GetLe<uint64_t>(data.data() + 8);
  info->size = GetLe<uint64_t>(data.data() + 16);
  info->rkey = GetLe<uint32_t>(data.data() + 24);
  info->incarnation = GetLe<uint64_t>(data.data() + 32);
  return true;
}

void CmResources::Release() {
  if (id != nullptr && id->qp != nullptr) rdma_destroy_qp(id);
  if (cq != nullptr) ibv_destroy_cq(cq);
  cq = nullptr;
  if (id != nullptr) rdma_destroy_id(id);
  id = nullptr;
}

std::string PeerOf(rdma_cm_id* id) {
  const sockaddr* peer = rdma_get_peer_addr(id);
  if (peer == nullptr) return "unknown peer";
  SocketAddress address;
  address.length = peer->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(&address.storage, peer, address.length);
  return FormatAddress(address);
}

// ---- ServerConnection -----------------------------------------------------------------------

ServerConnection::ServerConnection(RdmaTransport::State* state, rdma_cm_id* id) : state_(state) {
  res_.id = id;
  id->context = static_cast<CmTarget*>(this);
}

Status ServerConnection::Accept(const CmEvent& request) {
  peer_ = PeerOf(res_.id);
  if (!IsRdmaHello(request.private_data)) return InvalidParams("not a kvagent RDMA client");
  RdmaDevice* device = state_->FindDevice(res_.id->verbs);
  if (device == nullptr) return Internal("connection on a device without the pool");
  // The QP must exist for the peer's one-sided ops to target it; it posts nothing itself.
  res_.cq = ibv_create_cq(res_.id->verbs, 2, nullptr, nullptr, 0);
  if (res_.cq == nullptr) return Internal(WithErrno("ibv_create_cq failed"));
  ibv_qp_init_attr init{};
  init.send_cq = res_.cq;
  init.recv_cq = res_.cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 1;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  if (rdma_create_qp(res_.id, device->pd(), &init) != 0)
    return Internal(WithErrno("rdma_create_qp failed"));
  uint8_t info[kPoolInfoBytes];
  EncodePoolInfo({.addr = reinterpret_cast<uint64_t>(state_->pool_->base()),
                  .size = state_->pool_->size(),
                  .rkey = device->pool_rkey(),
                  .incarnation = state_->fence_ ? state_->fence_->pool_incarnation() : 0},
                 info);
  rdma_conn_param param{};
  param.private_data = info;
  param.private_data_len = sizeof(info);
  // The request event reports both values from our side's perspective (rdma_accept(3)): its
  // responder_resources is how many RDMA READs the peer wants in flight against us.
  param.responder_resources = static_cast<uint8_t>(
      std::min<int>(request.responder_resources, device->attr().max_qp_rd_atom));
  // We initiate nothing, but the value must not exceed what the peer reported.
  param.initiator_depth = static_cast<uint8_t>(
      std::min<int>(request.initiator_depth, device->attr().max_qp_init_rd_atom));
  param.rnr_retry_count = 7;
  if (rdma_accept(res_.id, &param) != 0) return Internal(WithErrno("rdma_accept failed"));
  return Status::Ok();
}

void ServerConnection::Reject(const std::string& why) {
  LOG(WARNING) << "RDMA: refusing connection from " << PeerOf(res_.id) << ": " << why;
  rdma_reject(res_.id, nullptr, 0);
}

void ServerConnection::OnCmEvent(const CmEvent& event) {
  if (event.type == RDMA_CM_EVENT_ESTABLISHED) {
    VLOG(1) << "RDMA: peer " << peer_ << " connected";
  } else if (event.type == RDMA_CM_EVENT_DISCONNECTED ||
             event.type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
    state_->DropServer(this);
  }
}

void ServerConnection::Close() {
  if (res_.id != nullptr) rdma_disconnect(res_.id);
  res_.Release();
}

// ---- ClientConnection -----------------------------------------------------------------------

ClientConnection::ClientConnection(RdmaTransport::State* state, Endpoint peer, std::string key)
    : state_(state), peer_(std::move(peer)), key_(std::move(key)) {}

const char* ClientConnection::PhaseName() const {
  static constexpr const char* kNames[] = {"resolving the address", "resolving the route",
                                           "connecting", "waiting for completions",
                                           "draining after an error"};
  return kNames[static_cast<int>(phase_)];
}

int ClientConnection::TimeoutMs() const {
  return static_cast<int>(std::min<int64_t>(state_->timeout_.count(), 60000));
}

Status ClientConnection::Open() {
  if (rdma_create_id(state_->cm_channel_, &res_.id, static_cast<CmTarget*>(this), RDMA_PS_TCP) !=
      0) {
    return Status(ErrorCode::kTransferFailed, WithErrno("rdma_create_id failed"));
  }
  Result<SocketAddress> address = NumericAddress(peer_.host, peer_.port);
  if (!address.ok()) return address.status();
  if (rdma_resolve_addr(res_.id, nullptr, const_cast<sockaddr*>(address->get()), TimeoutMs()) !=
      0) {
    return Status(ErrorCode::kTransferFailed, WithErrno("rdma_resolve_addr failed"));
  }
  EngineCounters::Add(state_->counters_->connections_opened);
  last_progress_ = Clock::now();
  return Status::Ok();
}

void ClientConnection::Enqueue(PendingOp op) {
  if (!has_work()) last_progress_ = Clock::now();  // the idle time is not the peer's fault
  const uint64_t slot = next_slot_++;
  Op entry;
  entry.op = std::move(op);
  ops_.emplace(slot, std::move(entry));
  if (phase_ == Phase::kReady && !Admit(slot)) return;
  to_post_.push_back(slot);
}

void ClientConnection::OnCmEvent(const CmEvent& event) {
  switch (event.type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      phase_ = Phase::kRoute;
      if (rdma_resolve_route(res_.id, TimeoutMs()) != 0)
        return Fail(WithErrno("rdma_resolve_route failed"));
      return;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      return Connect();
    case RDMA_CM_EVENT_ESTABLISHED:
      return Established(event);
    case RDMA_CM_EVENT_DISCONNECTED:
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

void ClientConnection::OnCompletions() {
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

void ClientConnection::Abort(ErrorCode code, const std::string& reason) {
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

void ClientConnection::Fail(const std::string& reason) {
  state_->DropClient(this, ErrorCode::kTransferFailed, reason);
}

void ClientConnection::MarkBroken(const std::string& reason) {
  if (phase_ == Phase::kBroken) return;
  phase_ = Phase::kBroken;
  broken_reason_ = reason;
  rdma_disconnect(res_.id);
}

void ClientConnection::Break(const std::string& reason) {
  MarkBroken(reason);
  if (outstanding_ == 0) Fail(broken_reason_);
}

void ClientConnection::Connect() {
  device_ = state_->FindDevice(res_.id->verbs);
  if (device_ == nullptr) return Fail("the route uses a device without the node pool");
  ibv_port_attr port{};
  if (ibv_query_port(res_.id->verbs, res_.id->port_num, &port) != 0) {
    return Fail(WithErrno("ibv_query_port failed"));
  }
  max_message_ = port.max_msg_sz;
  depth_ = std::min<uint32_t>(kSendDepth, static_cast<uint32_t>(device_->attr().max_qp_wr));
  // One CQ per QP, sized so that the signaled work requests in flight can never overflow it;
  // its context is this connection, which the completion channel's reader dispatches to.
  res_.cq =
      ibv_create_cq(res_.id->verbs, static_cast<int>(depth_) + 1, this, device_->channel(), 0);
  if (res_.cq == nullptr) return Fail(WithErrno("ibv_create_cq failed"));
  if (ibv_req_notify_cq(res_.cq, 0) != 0) return Fail(WithErrno("ibv_req_notify_cq failed"));
  ibv_qp_init_attr init{};
  init.send_cq = res_.cq;
  init.recv_cq = res_.cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = depth_;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  if (rdma_create_qp(res_.id, device_->pd(), &init) != 0)
    return Fail(WithErrno("rdma_create_qp failed"));
  uint8_t hello[kRdmaHelloBytes];
  EncodeRdmaHello(hello);
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
  if (rdma_connect(res_.id, &param) != 0) return Fail(WithErrno("rdma_connect failed"));
}

void ClientConnection::Established(const CmEvent& event) {
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

bool ClientConnection::Admit(uint64_t slot) {
  Op& op = ops_.at(slot);
  // One-sided ops cannot be refused by the target's CPU: the pool incarnation is checked here,
  // against what the peer announced when the connection was made.
  if (op.op.pool_incarnation != 0 && remote_.incarnation != 0 &&
      op.op.pool_incarnation != remote_.incarnation) {
    op.op.Fail(ErrorCode::kTransferFailed,
               "the peer restarted: its pool is incarnation " +
                   std::to_string(remote_.incarnation) + ", the placement was made in " +
                   std::to_string(op.op.pool_incarnation) + " (the value there is gone)");
    ops_.erase(slot);
    return false;
  }
  Status range = CheckPoolRange(op.op.remote_offset, op.op.length, remote_.size, "pool of " + key_);
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

void ClientConnection::PostMore() {
  while (phase_ == Phase::kReady && outstanding_ < depth_ && !to_post_.empty()) {
    const uint64_t slot = to_post_.front();
    Op& op = ops_.at(slot);
    // Every work request but the last carries exactly the first one's length.
    const uint64_t offset = op.posted * WorkRequestLength(op.op.length, max_message_, 0);
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
    if (rc != 0) return Break(std::string("ibv_post_send failed: ") + ErrnoText(rc));
    ++outstanding_;
    if (++op.posted == op.chunks) to_post_.pop_front();
  }
}

void ClientConnection::Complete(const ibv_wc& wc) {
  // Only wr_id, status and vendor_err are defined for a failed completion.
  --outstanding_;
  auto it = ops_.find(wc.wr_id);
  if (it == ops_.end()) return;
  Op& op = it->second;
  ++op.done;
  if (wc.status != IBV_WC_SUCCESS) {
    // After the first error the QP flushes everything else; name the root cause for those.
    std::string what = wc.status == IBV_WC_WR_FLUSH_ERR && !broken_reason_.empty()
                           ? broken_reason_ + " (work request flushed)"
                           : std::string("RDMA completion error: ") + ibv_wc_status_str(wc.status) +
                                 " (vendor error " + std::to_string(wc.vendor_err) + ")";
    if (op.error.ok())
      op.error = Status(ErrorCode::kTransferFailed, op.op.Describe() + ": " + what);
    MarkBroken(what);
  }
  if (op.done == op.chunks) {
    op.op.Finish(op.error.ok() ? Status::Ok() : std::move(op.error));
    ops_.erase(it);
  }
}

}  // namespace kvagent::transfer

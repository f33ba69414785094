// RDMA data plane: rdma_cm connection setup, RC QPs, one-sided RDMA WRITE / READ.
//
// NOTE: NEVER RUN. The machine this was written on has no RDMA device and no rdma kernel
// modules, so this file is compiled (always) and reviewed line by line, but no test has sent a
// work request through it. The engine only reaches it when ibv_get_device_list finds a device.
//
// Threading: everything here runs on the transport's own EventLoop thread (rdma_cm events and
// completion events are both fds in its epoll set), except Submit (posts to the loop) and
// Register/UnregisterMemory (RdmaDevice guards its MR table). Lifetime rules: rdma_connection.h.
#include "rdma_transport.h"

#include <fcntl.h>
#include <glog/logging.h>

#include <cerrno>
#include <cstring>

#include "kvagent/transfer/rdma_probe.h"
#include "rdma_connection.h"
#include "socket.h"

namespace kvagent::transfer {
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

RdmaDevice* RdmaTransport::State::FindDevice(ibv_context* verbs) const {
  for (const auto& device : devices_) {
    if (device->verbs() == verbs) return device.get();
  }
  return nullptr;
}

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
  if (cm_channel_ == nullptr) return Internal(WithErrno("rdma_create_event_channel failed"));
  const int flags = fcntl(cm_channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(cm_channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return Internal(WithErrno("fcntl(O_NONBLOCK) on the rdma_cm channel failed"));
  }
  if (rdma_create_id(cm_channel_, &listen_id_, nullptr, RDMA_PS_TCP) != 0) {
    return Internal(WithErrno("rdma_create_id failed"));
  }
  Result<SocketAddress> address = NumericAddress(listen.host, listen.port);
  if (!address.ok()) return address.status();
  if (rdma_bind_addr(listen_id_, const_cast<sockaddr*>(address->get())) != 0) {
    return Internal(WithErrno("rdma_bind_addr failed") + " for " + FormatAddress(*address));
  }
  if (rdma_listen(listen_id_, 128) != 0) return Internal(WithErrno("rdma_listen failed"));
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

Result<std::unique_ptr<RdmaTransport>> RdmaTransport::Start(NodePool* pool, const PoolFence* fence,
                                                            const ListenAddress& listen,
                                                            std::chrono::milliseconds timeout,
                                                            EngineCounters* counters) {
  auto state = std::make_unique<State>(pool, fence, timeout, counters);
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

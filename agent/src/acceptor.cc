#include "acceptor.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <glog/logging.h>

#include <algorithm>

#include "kvagent/schemas/agent_generated.h"

namespace kvagent::agent {
namespace {

constexpr auto kSendTimeout = std::chrono::milliseconds(1000);

template <typename T>
const T* VerifiedRoot(std::span<const uint8_t> message) {
  flatbuffers::Verifier verifier(message.data(), message.size(), 8, 64);
  if (message.size() < sizeof(flatbuffers::uoffset_t) || !verifier.VerifyBuffer<T>(nullptr)) {
    return nullptr;
  }
  return flatbuffers::GetRoot<T>(message.data());
}

bool IsPowerOfTwo(uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

std::string Describe(const ipc::PeerCredentials& peer) {
  return "pid " + std::to_string(peer.pid) + ", uid " + std::to_string(peer.uid) + ", gid " +
         std::to_string(peer.gid);
}

}  // namespace

Acceptor::Acceptor(const AgentConfig& config, uint64_t epoch, RingService* service)
    : config_(config), epoch_(epoch), service_(service) {
  allow_uids_ = config.allow_uids;
  allow_gids_ = config.allow_gids;
  if (allow_uids_.empty() && allow_gids_.empty()) allow_uids_ = {getuid(), 0};
}

Acceptor::~Acceptor() { Stop(); }

Status Acceptor::Start() {
  // Everything but the socket first: once agent.sock appears the agent's fd set is complete
  // (tests take it as the baseline).
  epoll_fd_ = ipc::UniqueFd(epoll_create1(EPOLL_CLOEXEC));
  wake_fd_ = ipc::UniqueFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_fd_.valid() || !wake_fd_.valid()) return Internal("epoll/eventfd creation failed");
  auto listener = ipc::ListenUnix(config_.SocketPath());
  if (!listener.ok()) return listener.status();
  listen_fd_ = std::move(*listener);
  for (int fd : {listen_fd_.get(), wake_fd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return Internal("epoll_ctl failed");
    }
  }
  started_ = true;
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void Acceptor::Stop() {
  if (!started_) return;
  started_ = false;
  {
    std::lock_guard<std::mutex> lock(commands_mu_);
    stop_requested_ = true;
  }
  uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof(one));
  thread_.join();
}

void Acceptor::StopAccepting() {
  if (!started_) return;
  std::unique_lock<std::mutex> lock(commands_mu_);
  stop_accepting_ = true;
  uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof(one));
  commands_cv_.wait(lock, [&] { return listener_closed_; });
}

void Acceptor::CloseListener() {
  if (listen_fd_.valid()) {
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, listen_fd_.get(), nullptr);
    listen_fd_.Reset();
    ::unlink(config_.SocketPath().c_str());
  }
  std::lock_guard<std::mutex> lock(commands_mu_);
  listener_closed_ = true;
  commands_cv_.notify_all();
}

void Acceptor::Disconnect(ClientId client) {
  {
    std::lock_guard<std::mutex> lock(commands_mu_);
    to_disconnect_.push_back(client);
  }
  uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof(one));
}

void Acceptor::Run() {
  epoll_event events[64];
  while (true) {
    const int n = epoll_wait(epoll_fd_.get(), events, 64, -1);
    if (n < 0 && errno != EINTR) {
      PLOG(ERROR) << "epoll_wait failed; the agent stops accepting clients";
      break;
    }
    bool stop = false;
    bool stop_accepting = false;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (listen_fd_.valid() && fd == listen_fd_.get()) {
        AcceptAll();
      } else if (fd == wake_fd_.get()) {
        uint64_t count;
        (void)!read(wake_fd_.get(), &count, sizeof(count));
        std::lock_guard<std::mutex> lock(commands_mu_);
        stop = stop_requested_;
        stop_accepting = stop_accepting_;
      } else if (auto it = connections_.find(fd); it != connections_.end()) {
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) OnReadable(it->second);
      }
    }
    ProcessCommands();
    if (stop_accepting) CloseListener();
    if (stop) break;
  }
  // Shutdown: no new clients, then every connection goes.
  CloseListener();
  std::vector<int> fds;
  for (const auto& [fd, conn] : connections_) fds.push_back(fd);
  for (int fd : fds) Close(fd, "the agent is shutting down");
}

void Acceptor::ProcessCommands() {
  std::vector<ClientId> ids;
  {
    std::lock_guard<std::mutex> lock(commands_mu_);
    ids.swap(to_disconnect_);
  }
  for (ClientId id : ids) {
    auto it = fd_of_client_.find(id);
    if (it != fd_of_client_.end()) Close(it->second, "its ring was corrupt");
  }
}

void Acceptor::AcceptAll() {
  while (true) {
    ipc::UniqueFd fd = ipc::AcceptUnix(listen_fd_.get());
    if (!fd.valid()) return;
    auto peer = ipc::GetPeerCredentials(fd.get());
    if (!peer.ok()) continue;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd.get();
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) continue;
    Connection conn;
    conn.peer = *peer;
    const int raw = fd.get();
    conn.fd = std::move(fd);
    connections_.emplace(raw, std::move(conn));
  }
}

void Acceptor::OnReadable(Connection& conn) {
  const int fd = conn.fd.get();
  while (true) {
    const ipc::MessageReader::State state = conn.reader.Read(fd);
    if (state == ipc::MessageReader::State::kNeedMore) return;
    if (state == ipc::MessageReader::State::kEof) {
      Close(fd, conn.phase == Phase::kLive ? "disconnected" : "hung up during the handshake");
      return;
    }
    if (state == ipc::MessageReader::State::kError) {
      Close(fd, "sent a malformed handshake message");
      return;
    }
    bool keep = false;
    const std::vector<uint8_t> message = conn.reader.message();
    switch (conn.phase) {
      case Phase::kAwaitHello:
        keep = OnHello(conn, message);
        break;
      case Phase::kAwaitAttached:
        keep = OnAttached(conn, message);
        break;
      case Phase::kLive:
        keep = false;
        break;  // nothing may follow Attached
    }
    if (!keep) {
      Close(fd, "broke the handshake protocol");
      return;
    }
  }
}

bool Acceptor::Allowed(const ipc::PeerCredentials& peer) const {
  return std::find(allow_uids_.begin(), allow_uids_.end(), peer.uid) != allow_uids_.end() ||
         std::find(allow_gids_.begin(), allow_gids_.end(), peer.gid) != allow_gids_.end();
}

size_t Acceptor::CountClients() const {
  size_t n = 0;
  for (const auto& [fd, conn] : connections_) n += conn.phase != Phase::kAwaitHello;
  return n;
}

void Acceptor::Refuse(Connection& conn, const Status& why) {
  LOG(WARNING) << "refused a client (" << Describe(conn.peer) << "): " << why.ToString();
  flatbuffers::FlatBufferBuilder fbb;
  auto message = fbb.CreateString(why.message());
  proto::WelcomeBuilder b(fbb);
  b.add_status(static_cast<uint16_t>(why.code()));
  b.add_message(message);
  b.add_protocol_version(static_cast<uint32_t>(proto::ProtocolVersion::Current));
  fbb.Finish(b.Finish());
  (void)ipc::SendMessage(conn.fd.get(), {fbb.GetBufferPointer(), fbb.GetSize()}, kSendTimeout);
}

bool Acceptor::OnHello(Connection& conn, std::span<const uint8_t> message) {
  const proto::Hello* hello = VerifiedRoot<proto::Hello>(message);
  if (hello == nullptr) {
    Refuse(conn, InvalidParams("the Hello message is not a valid FlatBuffer"));
    return false;
  }
  const uint32_t ours = static_cast<uint32_t>(proto::ProtocolVersion::Current);
  if (hello->protocol_version() != ours) {
    Refuse(conn,
           InvalidParams("the client speaks protocol version " +
                         std::to_string(hello->protocol_version()) + " and this agent speaks " +
                         std::to_string(ours) + "; upgrade the older of the two"));
    return false;
  }
  if (!Allowed(conn.peer)) {
    Refuse(conn, Status(ErrorCode::kAgentUnavailable,
                        "uid " + std::to_string(conn.peer.uid) + " / gid " +
                            std::to_string(conn.peer.gid) +
                            " may not attach to this agent; start it with --allow-uid " +
                            std::to_string(conn.peer.uid) + " or --allow-gid " +
                            std::to_string(conn.peer.gid)));
    return false;
  }
  if (CountClients() >= static_cast<size_t>(config_.max_clients)) {
    Refuse(conn, Status(ErrorCode::kAgentUnavailable,
                        "the agent already serves " + std::to_string(config_.max_clients) +
                            " clients (--max-clients, at most " + std::to_string(kMaxClientsLimit) +
                            "); close a client or run another agent with its own --run-dir"));
    return false;
  }
  const uint64_t ring = hello->ring_bytes() == 0
                            ? config_.ring_bytes
                            : std::min(hello->ring_bytes(), config_.max_ring_bytes);
  if (!IsPowerOfTwo(ring)) {
    Refuse(conn, InvalidParams("ring_bytes " + std::to_string(ring) +
                               " is not a power of two; ask for e.g. 1 MiB"));
    return false;
  }
  const uint64_t arena = std::min(hello->arena_bytes(), config_.max_arena_bytes);
  auto layout = ipc::SegmentLayout::Compute(ring, ring, arena);
  if (!layout.ok()) {
    Refuse(conn, layout.status());
    return false;
  }
  const ClientId id = next_client_id_++;
  ipc::SegmentOwner owner;
  if (geteuid() == 0 && conn.peer.uid != 0) owner = {true, conn.peer.uid, conn.peer.gid};
  const std::string name = ipc::SegmentName(getpid(), epoch_, id);
  auto segment = ipc::Segment::Create(name, *layout, epoch_, id, owner);
  if (!segment.ok()) {
    Refuse(conn, segment.status());
    return false;
  }
  conn.client_id = id;
  conn.client_name = hello->client_name() ? hello->client_name()->str() : "";
  Status memory_refused;
  if (hello->memory_probe_address() != 0) {
    auto memory = ProcessMemory::Grant(conn.peer.pid, hello->memory_probe_address(),
                                       hello->memory_probe_value());
    if (memory.ok()) {
      conn.memory = std::move(*memory);
    } else {
      memory_refused = memory.status();
      LOG(INFO) << "client " << id << " (" << conn.client_name << ", " << Describe(conn.peer)
                << ") asked for process memory; not granted: " << memory_refused.message();
    }
  }
  conn.segment_name = name;
  conn.segment = std::make_shared<ipc::Segment>(std::move(*segment));
  conn.phase = Phase::kAwaitAttached;
  fd_of_client_[id] = conn.fd.get();

  flatbuffers::FlatBufferBuilder fbb;
  auto name_off = fbb.CreateString(name);
  flatbuffers::Offset<flatbuffers::String> refused_off;
  if (!memory_refused.ok()) refused_off = fbb.CreateString(memory_refused.message());
  proto::WelcomeBuilder b(fbb);
  b.add_status(static_cast<uint16_t>(ErrorCode::kOk));
  b.add_protocol_version(ours);
  b.add_client_id(id);
  b.add_agent_epoch(epoch_);
  b.add_segment_name(name_off);
  b.add_segment_bytes(layout->total_bytes);
  b.add_arena_bytes(layout->arena_bytes);
  b.add_ring_bytes(ring);
  b.add_process_memory(conn.memory != nullptr);
  if (!refused_off.IsNull()) b.add_process_memory_message(refused_off);
  fbb.Finish(b.Finish());
  return ipc::SendMessage(conn.fd.get(), {fbb.GetBufferPointer(), fbb.GetSize()}, kSendTimeout)
      .ok();
}

bool Acceptor::OnAttached(Connection& conn, std::span<const uint8_t> message) {
  const proto::Attached* attached = VerifiedRoot<proto::Attached>(message);
  if (attached == nullptr || attached->client_id() != conn.client_id) return false;
  if (conn.memory != nullptr && attached->peer_scratch() != nullptr) {
    const proto::BufferRef* scratch = attached->peer_scratch();
    Status set = conn.memory->SetPeerScratch(scratch->offset(), scratch->length(),
                                             conn.segment->layout().arena_bytes);
    if (!set.ok()) {
      LOG(WARNING) << "client " << conn.client_id << ": " << set.message();
      return false;
    }
  }
  // Both sides have mapped it: from now on nothing in /dev/shm outlives either process.
  ipc::Segment::Unlink(conn.segment_name);
  conn.segment_name.clear();
  conn.phase = Phase::kLive;
  LOG(INFO) << "client " << conn.client_id << " (" << conn.client_name << ", "
            << Describe(conn.peer) << ") attached: arena " << conn.segment->layout().arena_bytes
            << " bytes, rings " << conn.segment->layout().request_ring_bytes << " bytes"
            << (conn.memory ? ", process memory" : "");
  service_->AddClient(std::make_unique<ClientSession>(conn.client_id, conn.client_name, conn.peer,
                                                      std::move(conn.segment),
                                                      std::move(conn.memory)));
  return true;
}

void Acceptor::Close(int fd, const std::string& why) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  Connection& conn = it->second;
  if (conn.phase == Phase::kLive) {
    LOG(INFO) << "client " << conn.client_id << " (" << conn.client_name << ", "
              << Describe(conn.peer) << ") " << why << "; reclaiming its segment";
    service_->DropClient(conn.client_id);
  }
  if (!conn.segment_name.empty()) ipc::Segment::Unlink(conn.segment_name);
  if (conn.client_id != 0) fd_of_client_.erase(conn.client_id);
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  connections_.erase(it);  // closes the fd and unmaps a segment never handed over
}

}  // namespace kvagent::agent

// The acceptor's connection lifecycle: the epoll loop, accepting (with its limits), timeouts and
// closing. The handshake messages themselves are in acceptor_handshake.cc.
#include "acceptor.h"
#include "kvagent/common/errno_text.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glog/logging.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvagent::agent {
namespace {

constexpr auto kWarningInterval = std::chrono::seconds(10);
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

}  // namespace

std::string DescribePeer(const ipc::PeerCredentials& peer) {
  return "pid " + std::to_string(peer.pid) + ", uid " + std::to_string(peer.uid) + ", gid " +
         std::to_string(peer.gid);
}

Acceptor::Acceptor(const AgentConfig& config, uint64_t incarnation, RingService* service)
    : config_(config), incarnation_(incarnation), service_(service) {
  // The agent's own uid and root may always attach; the flags add to them.
  allow_uids_ = config.allow_uids;
  allow_uids_.push_back(getuid());
  allow_uids_.push_back(0);
  allow_gids_ = config.allow_gids;
}

Acceptor::~Acceptor() { Stop(); }

Status Acceptor::Start() {
  // Everything but the socket first: once agent.sock appears the agent's fd set is complete
  // (tests take it as the baseline).
  epoll_fd_ = ipc::UniqueFd(epoll_create1(EPOLL_CLOEXEC));
  wake_fd_ = ipc::UniqueFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  spare_fd_ = ipc::UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!epoll_fd_.valid() || !wake_fd_.valid() || !spare_fd_.valid()) {
    return Internal(std::string("epoll/eventfd creation failed: ") + ErrnoText(errno) +
                    "; raise the agent's open-file limit");
  }
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
    if (!accept_paused_) epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, listen_fd_.get(), nullptr);
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

int Acceptor::NextTimeoutMs(Clock::time_point now) const {
  Clock::time_point next = Clock::time_point::max();
  if (accept_paused_) next = resume_accept_at_;
  for (const auto& [fd, conn] : connections_) {
    if (conn.phase != Phase::kLive) {
      next = std::min(next, conn.accepted_at + config_.handshake_timeout);
    }
  }
  if (next == Clock::time_point::max()) return -1;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
  return static_cast<int>(std::clamp<int64_t>(ms + 1, 0, 60'000));
}

void Acceptor::Run() {
  // Named by the thread itself (prctl): naming another thread opens /proc/self/task/N/comm, a
  // descriptor that tests counting the agent's fds could see.
  pthread_setname_np(pthread_self(), "kvagent-accept");  // tests and `top -H` find it
  epoll_event events[64];
  while (true) {
    const int n = epoll_wait(epoll_fd_.get(), events, 64, NextTimeoutMs(Clock::now()));
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
    const Clock::time_point now = Clock::now();
    CloseStaleHandshakes(now);
    if (accept_paused_ && now >= resume_accept_at_ && listen_fd_.valid()) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = listen_fd_.get();
      accept_paused_ = epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev) != 0;
      if (accept_paused_) resume_accept_at_ = now + kAcceptPause;
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
  while (listen_fd_.valid() && !accept_paused_) {
    const int raw = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (raw < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) OnAcceptFailure(errno);
      return;
    }
    ipc::UniqueFd fd(raw);
    auto peer = ipc::GetPeerCredentials(fd.get());
    if (!peer.ok()) continue;
    MakeRoomForIdle(peer->uid);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd.get();
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) continue;
    Connection conn;
    conn.peer = *peer;
    conn.accepted_at = Clock::now();
    conn.fd = std::move(fd);
    connections_.emplace(raw, std::move(conn));
  }
}

void Acceptor::OnAcceptFailure(int err) {
  const Clock::time_point now = Clock::now();
  ++accept_failures_;
  if (now >= next_accept_warning_) {
    LOG(WARNING) << "accepting a client failed " << accept_failures_ << " time(s) in the last "
                 << std::chrono::duration_cast<std::chrono::seconds>(kWarningInterval).count()
                 << " s (last: " << ErrnoText(err) << ")"
                 << (err == EMFILE || err == ENFILE
                         ? "; the agent is out of file descriptors: raise LimitNOFILE, or find "
                           "who holds connections open (ls -l /proc/<pid>/fd)"
                         : "; pausing accepts briefly");
    next_accept_warning_ = now + kWarningInterval;
    accept_failures_ = 0;
  }
  if ((err == EMFILE || err == ENFILE) && spare_fd_.valid()) {
    // Release the reserve, take the pending connection off the queue and close it (the peer
    // sees EOF), then reserve again: the listener is drained instead of staying readable.
    spare_fd_.Reset();
    const int raw = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (raw >= 0) ::close(raw);
    spare_fd_ = ipc::UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (raw >= 0 && spare_fd_.valid()) return;
  }
  PauseAccepting(now + kAcceptPause);
}

void Acceptor::PauseAccepting(Clock::time_point until) {
  if (accept_paused_ || !listen_fd_.valid()) return;
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, listen_fd_.get(), nullptr);
  accept_paused_ = true;
  resume_accept_at_ = until;
}

void Acceptor::MakeRoomForIdle(uid_t uid) {
  // The oldest connection without a Hello, of this uid and in all.
  int oldest_of_uid = -1, oldest = -1;
  size_t of_uid = 0, idle = 0;
  Clock::time_point uid_time = Clock::time_point::max(), any_time = Clock::time_point::max();
  for (const auto& [fd, conn] : connections_) {
    if (conn.phase != Phase::kAwaitHello) continue;
    ++idle;
    if (conn.accepted_at < any_time) any_time = conn.accepted_at, oldest = fd;
    if (conn.peer.uid == uid) {
      ++of_uid;
      if (conn.accepted_at < uid_time) uid_time = conn.accepted_at, oldest_of_uid = fd;
    }
  }
  int victim = -1;
  if (of_uid >= kMaxIdlePerUid) {
    victim = oldest_of_uid;
  } else if (idle >= kMaxIdle) {
    victim = oldest;
  }
  if (victim < 0) return;
  ++evictions_;
  const Clock::time_point now = Clock::now();
  if (now >= next_eviction_warning_) {
    LOG(WARNING) << "too many connections without a Hello (uid " << uid << " has " << of_uid
                 << ", all uids " << idle << "; limits " << kMaxIdlePerUid << " and " << kMaxIdle
                 << "): closed the oldest; " << evictions_ << " closed in the last "
                 << std::chrono::duration_cast<std::chrono::seconds>(kWarningInterval).count()
                 << " s";
    next_eviction_warning_ = now + kWarningInterval;
    evictions_ = 0;
  }
  Close(victim, "made room for a newer connection");
}

void Acceptor::CloseStaleHandshakes(Clock::time_point now) {
  std::vector<int> stale;
  for (const auto& [fd, conn] : connections_) {
    if (conn.phase != Phase::kLive && now >= conn.accepted_at + config_.handshake_timeout) {
      stale.push_back(fd);
    }
  }
  for (int fd : stale) {
    Close(fd, "did not complete the handshake within " +
                  std::to_string(config_.handshake_timeout.count()) +
                  " ms (--handshake-timeout-ms)");
  }
}

void Acceptor::OnReadable(Connection& conn) {
  const int fd = conn.fd.get();
  if (conn.phase == Phase::kLive) {
    // Nothing may follow Attached (protocol.md): EOF is the client leaving, a byte is a
    // protocol violation. Either way the client goes.
    uint8_t byte;
    const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    Close(fd,
          n > 0 ? "sent data after the handshake; nothing may follow Attached" : "disconnected");
    return;
  }
  while (true) {
    const ipc::MessageReader::State state = conn.reader.Read(fd);
    if (state == ipc::MessageReader::State::kNeedMore) return;
    if (state == ipc::MessageReader::State::kEof) {
      Close(fd, "hung up during the handshake");
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
        break;
    }
    if (!keep) {
      Close(fd, "broke the handshake protocol");
      return;
    }
    if (conn.phase == Phase::kLive) {
      // Bytes that arrived with Attached, past it, break the protocol as well.
      if (conn.reader.pending_bytes() != 0) {
        Close(fd, "sent data after the handshake; nothing may follow Attached");
      }
      return;
    }
  }
}

bool Acceptor::Allowed(const ipc::PeerCredentials& peer) const {
  return std::find(allow_uids_.begin(), allow_uids_.end(), peer.uid) != allow_uids_.end() ||
         std::find(allow_gids_.begin(), allow_gids_.end(), peer.gid) != allow_gids_.end();
}

size_t Acceptor::CountClients(std::optional<uid_t> uid) const {
  size_t n = 0;
  for (const auto& [fd, conn] : connections_) {
    n += conn.phase != Phase::kAwaitHello && (!uid || conn.peer.uid == *uid);
  }
  return n;
}

void Acceptor::Close(int fd, const std::string& why) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  Connection& conn = it->second;
  if (conn.phase == Phase::kLive) {
    LOG(INFO) << "client " << conn.client_id << " (" << conn.client_name << ", "
              << DescribePeer(conn.peer) << ") " << why << "; reclaiming its segment";
    service_->DropClient(conn.client_id);
  } else if (conn.phase == Phase::kAwaitAttached) {
    LOG(INFO) << "client " << conn.client_id << " (" << conn.client_name << ", "
              << DescribePeer(conn.peer) << ") " << why << "; its segment is freed";
  } else {
    VLOG(1) << "connection (" << DescribePeer(conn.peer) << ") " << why;
  }
  if (conn.client_id != 0) fd_of_client_.erase(conn.client_id);
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  connections_.erase(it);  // closes the fd and unmaps a segment never handed over
}

}  // namespace kvagent::agent

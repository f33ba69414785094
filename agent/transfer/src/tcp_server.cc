#include "tcp_server.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>

#include "input_buffer.h"
#include "kvagent/common/checksum.h"
#include "kvagent/common/errno_text.h"
#include "tcp_wire.h"

namespace kvagent::transfer {
namespace {

// Work one connection may do per wake-up before yielding to the others.
constexpr int kServeStepsPerWake = 256;
// The most payload bytes received at once when their CRC is taken after: they stay in the L2.
constexpr uint64_t kCrcStep = 256 << 10;

}  // namespace

// One peer connection. Requests are parsed from an InputBuffer (many small ones per recv); a
// WRITE's payload goes into the pool (straight from the socket once it is large). Replies are
// queued as chunks - reply headers and error texts owned here, READ data pointing into the
// pool - and sent together when input runs dry, so a burst of small requests costs a few
// syscalls, not three each. While the queue holds more than kMaxQueuedBytes (one large READ is
// enough) the connection stops reading: that back-pressure bounds what a peer can make us hold
// to the socket buffers plus pool pointers.
class TcpDataServer::Connection final : public EventLoop::Handler {
 public:
  Connection(TcpDataServer* server, UniqueFd fd, std::string peer)
      : server_(server),
        fd_(std::move(fd)),
        peer_(std::move(peer)),
        accepted_at_(std::chrono::steady_clock::now()) {}

  int fd() const { return fd_.get(); }
  void MarkClosed() { closed_ = true; }
  const std::string& peer() const { return peer_; }
  bool authenticated() const { return phase_ != Phase::kAuth; }
  std::chrono::steady_clock::time_point accepted_at() const { return accepted_at_; }

  // Queues the hello and registers with the loop. False when the connection is already gone.
  bool Start() {
    uint8_t* head = NewHead(wire::kHelloBytes);
    wire::Hello hello{
        .version = wire::kVersion,
        .flags = 0,
        .pool_size = server_->pool_->size(),
        .pool_incarnation = server_->fence_ ? server_->fence_->pool_incarnation() : 0};
    if (server_->key_ != nullptr) {
      hello.flags = wire::kHelloAuthRequired;
      RandomBytes(hello.nonce);
      phase_ = Phase::kAuth;  // nothing but the peer's proof is read until it checks out
    }
    wire::EncodeHello(hello, head);
    std::memcpy(hello_.data(), head, wire::kHelloBytes);
    if (Flush() == Step::kClosed) return false;
    mask_ = WantedMask();
    Status added = server_->loop_->Add(fd_.get(), mask_, this);
    if (!added.ok()) {
      LOG(WARNING) << "data server: cannot watch connection from " << peer_ << ": "
                   << added.message();
      return false;
    }
    return true;
  }

  // The fence changed: a WRITE whose payload is still arriving is checked again; the rest of a
  // refused one is discarded (read and dropped) and it is answered with the refusal.
  void Refence() {
    if (closed_ || phase_ != Phase::kPayload || payload_dst_ == nullptr) return;
    const PoolFence* fence = server_->fence_;
    Status verdict =
        fence->CheckWrite(request_.pool_incarnation, request_.master_epoch, request_.write_id);
    if (verdict.ok()) return;
    EngineCounters::Add(server_->counters_->served_fenced);
    verdict_ = std::move(verdict);
    payload_dst_ = nullptr;
  }

  void OnEvents(uint32_t events) override {
    if (closed_) return;
    if ((events & EPOLLERR) != 0 && (events & EPOLLIN) == 0) {
      Close("socket error", false);
      return;
    }
    // Read while requests flow; send the queued replies when input runs dry or the queue is
    // full. Stop when both directions would block, or when the step budget (fairness to other
    // peers) is spent and nothing complete is buffered: buffered requests raise no epoll
    // event, unread socket data does.
    for (int i = 0;; ++i) {
      bool progressed = false;
      if (!OutputFull()) {
        Step in = ReadStep();
        if (in == Step::kClosed) return;
        progressed = in == Step::kProgress;
      }
      if (!progressed && !chunks_.empty()) {
        Step out = Flush();
        if (out == Step::kClosed) return;
        progressed = out == Step::kProgress;
      }
      if (!progressed) break;
      if (i >= kServeStepsPerWake && !HasBufferedWork()) break;
    }
    Watch(WantedMask());
  }

 private:
  static constexpr uint64_t kMaxQueuedBytes = 1 << 20;
  static constexpr size_t kMaxQueuedChunks = 256;
  static constexpr int kMaxIov = 64;

  // A piece of output: bytes owned by heads_/messages_ (in queue order) or pool bytes.
  struct Chunk {
    enum Owner { kHead, kMessage, kPool } owner;
    const uint8_t* data;
    uint64_t length;
  };

  bool HasBufferedWork() const {
    if (phase_ == Phase::kAuth) return in_.size() >= wire::kAuthBytes;
    return phase_ == Phase::kPayload ? in_.size() > 0 : in_.size() >= wire::kRequestBytes;
  }
  bool OutputFull() const {
    return queued_bytes_ >= kMaxQueuedBytes || chunks_.size() >= kMaxQueuedChunks;
  }
  uint32_t WantedMask() const {
    uint32_t mask = 0;
    if (!OutputFull()) mask |= EPOLLIN;
    if (!chunks_.empty()) mask |= EPOLLOUT;
    return mask;
  }

  void Watch(uint32_t mask) {
    if (mask == mask_) return;
    mask_ = mask;
    Status changed = server_->loop_->Modify(fd_.get(), mask_, this);
    if (!changed.ok()) Close(changed.message(), true);
  }

  void Close(const std::string& why, bool warn) {
    if (warn) {
      LOG(WARNING) << "data server: closing connection from " << peer_ << ": " << why;
    } else {
      VLOG(1) << "data server: connection from " << peer_ << " closed: " << why;
    }
    server_->Drop(this);
  }

  // Folds an IoResult into a Step; `eof_what` says what an end of stream means here and
  // `eof_warns` whether it deserves a warning.
  Step Outcome(const IoResult& io, const char* eof_what, bool eof_warns) {
    switch (io.kind) {
      case IoResult::kData:
        return Step::kProgress;
      case IoResult::kBlocked:
        return Step::kBlocked;
      case IoResult::kEof:
        Close(eof_what, eof_warns);
        return Step::kClosed;
      case IoResult::kError:
        Close(std::string("recv failed: ") + ErrnoText(io.error), false);
    }
    return Step::kClosed;
  }

  Step ReadStep() {
    if (phase_ == Phase::kAuth) {
      if (in_.size() < wire::kAuthBytes) {
        return Outcome(in_.Fill(fd_.get()), "peer closed before proving membership", false);
      }
      Step step = CheckProof(in_.data());
      if (step != Step::kClosed) in_.Consume(wire::kAuthBytes);
      return step;
    }
    if (phase_ == Phase::kHeader) {
      if (in_.size() < wire::kRequestBytes) {
        const bool clean = in_.size() == 0;
        return Outcome(in_.Fill(fd_.get()),
                       clean ? "peer closed" : "peer closed in the middle of a request", !clean);
      }
      Step step = StartRequest(in_.data());
      if (step != Step::kClosed) in_.Consume(wire::kRequestBytes);
      return step;
    }
    uint64_t moved = 0;
    uint8_t* at = payload_dst_ ? payload_dst_ + payload_got_ : nullptr;
    const bool summing = at != nullptr && request_.has_payload_crc;
    // The CRC of what arrived, taken while it is still in the cache: at most kCrcStep at a time.
    const uint64_t want =
        std::min(request_.length - payload_got_, summing ? kCrcStep : ~uint64_t{0});
    IoResult io = in_.ReadPayload(fd_.get(), at, want, &moved, summing ? &payload_crc_ : nullptr);
    payload_got_ += moved;
    if (payload_got_ == request_.length) {
      CheckPayload();
      QueueReply();
    }
    return Outcome(io, "peer closed in the middle of a WRITE payload", true);
  }

  // The peer's proof of membership: on success ours goes back and requests are read.
  Step CheckProof(const uint8_t* bytes) {
    wire::Auth auth;
    Status decoded = wire::DecodeAuth(bytes, &auth);
    const bool member =
        decoded.ok() &&
        ConstantTimeEqual(auth.proof, wire::AuthProof(*server_->key_, /*server=*/false,
                                                      hello_.data(), auth.nonce));
    if (!member) {
      EngineCounters::Add(server_->counters_->served_unauthenticated);
      LOG_EVERY_N(WARNING, 100) << "data server: " << peer_
                                << " did not prove it holds the cluster secret ("
                                << (decoded.ok() ? "wrong proof" : decoded.message())
                                << "); connection closed (every 100th refusal is logged)";
      server_->Drop(this);
      return Step::kClosed;
    }
    wire::EncodeAuthOk(wire::AuthProof(*server_->key_, /*server=*/true, hello_.data(), auth.nonce),
                       NewHead(wire::kAuthOkBytes));
    phase_ = Phase::kHeader;
    return Step::kProgress;
  }

  Step StartRequest(const uint8_t* header) {
    Status decoded = wire::DecodeRequest(header, &request_);
    if (!decoded.ok()) {
      EngineCounters::Add(server_->counters_->served_dropped_connections);
      Close("not a data-plane request (" + decoded.message() + "); dropping the connection", true);
      return Step::kClosed;
    }
    verdict_ = CheckPoolRange(request_.offset, request_.length, server_->pool_->size(),
                              "node pool of this agent");
    if (verdict_.ok() && server_->fence_ != nullptr) {
      const PoolFence& fence = *server_->fence_;
      verdict_ = request_.opcode == wire::Opcode::kWrite
                     ? fence.CheckWrite(request_.pool_incarnation, request_.master_epoch,
                                        request_.write_id)
                     : fence.CheckRead(request_.pool_incarnation, request_.master_epoch);
      if (!verdict_.ok()) EngineCounters::Add(server_->counters_->served_fenced);
    }
    payload_got_ = 0;
    payload_crc_ = 0;
    if (request_.opcode == wire::Opcode::kWrite && request_.length > 0) {
      // A refused WRITE's payload is read and dropped so the stream stays in step.
      payload_dst_ = verdict_.ok() ? server_->pool_->base() + request_.offset : nullptr;
      phase_ = Phase::kPayload;
    } else {
      QueueReply();
    }
    return Step::kProgress;
  }

  // A WRITE that carried its payload's CRC and whose bytes arrived different failed: they were
  // damaged on the way (the master never makes a failed replica readable).
  void CheckPayload() {
    if (!request_.has_payload_crc || payload_dst_ == nullptr || !verdict_.ok()) return;
    if (payload_crc_ == request_.payload_crc) return;
    EngineCounters::Add(server_->counters_->served_corrupted);
    char text[160];
    std::snprintf(text, sizeof(text),
                  "the WRITE's %llu bytes arrived with CRC32C 0x%08x, the writer sent 0x%08x: "
                  "damaged on the way",
                  static_cast<unsigned long long>(request_.length), payload_crc_,
                  request_.payload_crc);
    verdict_ = Status(ErrorCode::kDataCorrupted, text);
  }

  uint8_t* NewHead(size_t length) {
    heads_.emplace_back();
    Push({Chunk::kHead, heads_.back().data(), length});
    return heads_.back().data();
  }
  void Push(Chunk chunk) {
    queued_bytes_ += chunk.length;
    chunks_.push_back(chunk);
  }

  void QueueReply() {
    phase_ = Phase::kHeader;
    wire::Reply reply{.status = 0, .id = request_.id, .length = 0};
    Chunk body{Chunk::kPool, nullptr, 0};
    if (verdict_.ok()) {
      if (request_.opcode == wire::Opcode::kRead) {
        body = {Chunk::kPool, server_->pool_->base() + request_.offset, request_.length};
        reply.length = request_.length;
        EngineCounters::Add(server_->counters_->served_reads);
      } else {
        EngineCounters::Add(server_->counters_->served_writes);
      }
    } else {
      EngineCounters::Add(server_->counters_->served_rejected);
      LOG_EVERY_N(WARNING, 100) << "data server: refused a request from " << peer_ << ": "
                                << verdict_.message() << " (every 100th refusal is logged)";
      messages_.push_back(verdict_.message().substr(0, wire::kMaxErrorMessage));
      reply.status = static_cast<uint16_t>(verdict_.code());
      reply.length = messages_.back().size();
      body = {Chunk::kMessage, reinterpret_cast<const uint8_t*>(messages_.back().data()),
              reply.length};
    }
    wire::EncodeReply(reply, NewHead(wire::kReplyBytes));
    if (body.length > 0) Push(body);
  }

  Step Flush() {
    iovec iov[kMaxIov];
    int count = 0;
    uint64_t skip = first_sent_;
    for (const Chunk& chunk : chunks_) {
      if (count == kMaxIov) break;
      iov[count++] = {const_cast<uint8_t*>(chunk.data + skip), chunk.length - skip};
      skip = 0;
    }
    IoResult io = SendSome(fd_.get(), iov, count);
    if (io.kind == IoResult::kBlocked) return Step::kBlocked;
    if (io.kind != IoResult::kData) {
      Close(std::string("send failed: ") + ErrnoText(io.error), false);
      return Step::kClosed;
    }
    uint64_t sent = io.bytes;
    queued_bytes_ -= sent;
    while (sent > 0) {
      Chunk& front = chunks_.front();
      const uint64_t take = std::min(sent, front.length - first_sent_);
      first_sent_ += take;
      sent -= take;
      if (first_sent_ < front.length) break;
      if (front.owner == Chunk::kHead) heads_.pop_front();
      if (front.owner == Chunk::kMessage) messages_.pop_front();
      chunks_.pop_front();
      first_sent_ = 0;
    }
    return Step::kProgress;
  }

  enum class Phase { kAuth, kHeader, kPayload };

  TcpDataServer* server_;
  UniqueFd fd_;
  std::string peer_;
  std::chrono::steady_clock::time_point accepted_at_;
  std::array<uint8_t, wire::kHelloBytes> hello_{};  // as sent: both proofs cover it
  uint32_t mask_ = 0;
  bool closed_ = false;

  // Input: the request being read.
  InputBuffer in_;
  Phase phase_ = Phase::kHeader;
  wire::Request request_;
  Status verdict_;                  // the request's bounds check
  uint8_t* payload_dst_ = nullptr;  // in the pool, or nullptr: discard (refused WRITE)
  uint64_t payload_got_ = 0;
  uint32_t payload_crc_ = 0;  // of the payload so far (a WRITE with a payload CRC)

  // Output, in send order. deque: push_back/pop_front keep the other elements in place, so
  // chunks may point into heads_ and messages_.
  std::deque<Chunk> chunks_;
  static constexpr size_t kHeadBytes =
      std::max({wire::kReplyBytes, wire::kHelloBytes, wire::kAuthOkBytes});
  std::deque<std::array<uint8_t, kHeadBytes>> heads_;
  std::deque<std::string> messages_;
  uint64_t first_sent_ = 0;  // bytes of chunks_.front() already sent
  uint64_t queued_bytes_ = 0;
};

Result<std::unique_ptr<TcpDataServer>> TcpDataServer::Listen(EventLoop* loop, const NodePool* pool,
                                                             const PoolFence* fence,
                                                             const SymmetricKey* key,
                                                             const ListenAddress& address,
                                                             EngineCounters* counters) {
  Result<SocketAddress> wanted = NumericAddress(address.host, address.port);
  if (!wanted.ok()) return wanted.status();
  Result<UniqueFd> listener = ListenTcp(*wanted);
  if (!listener.ok()) return listener.status();
  Result<SocketAddress> bound = LocalAddress(listener->get());
  if (!bound.ok()) return bound.status();
  std::unique_ptr<TcpDataServer> server(
      new TcpDataServer(loop, pool, fence, key, std::move(*listener), *bound, counters));
  KVAGENT_RETURN_IF_ERROR(loop->Add(server->listener_.get(), EPOLLIN, server.get()));
  return server;
}

TcpDataServer::TcpDataServer(EventLoop* loop, const NodePool* pool, const PoolFence* fence,
                             const SymmetricKey* key, UniqueFd listener, SocketAddress bound,
                             EngineCounters* counters)
    : loop_(loop),
      pool_(pool),
      fence_(fence),
      key_(key),
      listener_(std::move(listener)),
      spare_(::open("/dev/null", O_RDONLY | O_CLOEXEC)),
      bound_(bound),
      counters_(counters) {}

TcpDataServer::~TcpDataServer() = default;

void TcpDataServer::ShedConnection(int error) {
  static std::chrono::steady_clock::time_point last_said;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_said > std::chrono::minutes(1)) {
    last_said = now;
    LOG(ERROR) << "data server: cannot accept: " << ErrnoText(error)
               << "; connections are closed at once until descriptors are free (raise "
                  "LimitNOFILE for kvagent)";
  }
  EngineCounters::Add(counters_->served_shed_connections);
  spare_ = UniqueFd();  // frees one descriptor
  UniqueFd shed(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  const bool took_it = shed.valid();
  shed = UniqueFd();
  spare_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (took_it) return;
  // No spare descriptor (another thread took the one just freed, or none could be opened): the
  // pending connection keeps the listener readable and every wake-up would come straight back
  // here. Stop listening for a moment instead (Tick listens again).
  if (loop_->Modify(listener_.get(), 0, this).ok()) {
    listen_again_at_ = std::chrono::steady_clock::now() + kListenPause;
  }
}

size_t TcpDataServer::MaxConnections() {
  rlimit limit{};
  size_t cap = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    cap = std::min<size_t>(cap, std::max<size_t>(8, limit.rlim_cur / 4));
  }
  return cap;
}

int TcpDataServer::Tick() {
  const auto now = std::chrono::steady_clock::now();
  int wait = -1;
  if (listen_again_at_) {
    if (now >= *listen_again_at_ && loop_->Modify(listener_.get(), EPOLLIN, this).ok()) {
      listen_again_at_.reset();
    } else {
      wait = static_cast<int>(kListenPause.count());
    }
  }
  if (key_ == nullptr) return wait;
  std::vector<Connection*> late;
  bool waiting = false;
  for (auto& [raw, connection] : connections_) {
    if (connection->authenticated()) continue;
    if (now - connection->accepted_at() >= kHandshakeTimeout) {
      late.push_back(raw);
    } else {
      waiting = true;
    }
  }
  for (Connection* c : late) {
    EngineCounters::Add(counters_->served_unauthenticated);
    VLOG(1) << "data server: " << c->peer() << " did not authenticate in time; closed";
    Drop(c);
  }
  if (!waiting) return wait;
  return wait < 0 ? 500 : std::min(wait, 500);
}

void TcpDataServer::OnEvents(uint32_t /*events*/) {
  for (;;) {
    SocketAddress peer;
    UniqueFd fd = AcceptConnection(listener_.get(), &peer);
    if (!fd.valid()) {
      if (errno == EMFILE || errno == ENFILE) ShedConnection(errno);
      return;
    }
    if (connections_.size() >= max_connections_ && !DropOldestUnauthenticated()) {
      EngineCounters::Add(counters_->served_shed_connections);
      LOG_EVERY_N(WARNING, 1000) << "data server: " << max_connections_
                                 << " connections already open; closing one from "
                                 << FormatAddress(peer) << " (every 1000th is logged)";
      continue;  // fd closes here
    }
    auto connection = std::make_unique<Connection>(this, std::move(fd), FormatAddress(peer));
    Connection* raw = connection.get();
    connections_.emplace(raw, std::move(connection));
    if (key_ != nullptr) {
      accepted_.emplace_back(raw, raw->accepted_at());
      // Entries of connections that authenticated or closed go when they reach the front; keep
      // the rest from outgrowing the open connections.
      if (accepted_.size() > 2 * connections_.size() + 64) {
        std::erase_if(accepted_, [&](const auto& entry) {
          auto it = connections_.find(entry.first);
          return it == connections_.end() || it->second->accepted_at() != entry.second ||
                 it->second->authenticated();
        });
      }
    }
    if (!raw->Start()) Drop(raw);
  }
}

bool TcpDataServer::DropOldestUnauthenticated() {
  while (!accepted_.empty()) {
    const auto [raw, accepted_at] = accepted_.front();
    accepted_.pop_front();
    auto it = connections_.find(raw);
    if (it == connections_.end() || it->second->accepted_at() != accepted_at ||
        it->second->authenticated()) {
      continue;
    }
    EngineCounters::Add(counters_->served_unauthenticated);
    VLOG(1) << "data server: " << raw->peer()
            << " had not authenticated when the connections were all taken; closed";
    Drop(raw);
    return true;
  }
  return false;
}

void TcpDataServer::Refence() {
  if (fence_ == nullptr) return;
  for (auto& [raw, connection] : connections_) connection->Refence();
}

void TcpDataServer::Drop(Connection* connection) {
  auto it = connections_.find(connection);
  if (it == connections_.end()) return;
  connection->MarkClosed();
  loop_->Remove(connection->fd());
  graveyard_.push_back(std::move(it->second));
  connections_.erase(it);
  // Destroy after the current wake-up: the loop may still hold an event for this connection.
  if (graveyard_.size() == 1) loop_->Post([this] { graveyard_.clear(); });
}

}  // namespace kvagent::transfer

#include "tcp_server.h"

#include <glog/logging.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "tcp_wire.h"

namespace kvagent::transfer {
namespace {

constexpr size_t kDiscardBytes = 64 * 1024;
// Work one connection may do per wake-up before yielding to the others.
constexpr int kStepsPerWake = 64;

}  // namespace

// One peer connection. Strictly alternates: read a request (header, then a WRITE's payload
// straight into the pool), then write its reply (header, then a READ's data straight from the
// pool or an error message). While a reply is unsent the connection does not read, which is
// the back-pressure that bounds what a peer can make us buffer: nothing beyond the socket.
class TcpDataServer::Connection final : public EventLoop::Handler {
 public:
  Connection(TcpDataServer* server, Fd fd, std::string peer)
      : server_(server), fd_(std::move(fd)), peer_(std::move(peer)) {}

  int fd() const { return fd_.get(); }
  void MarkClosed() { closed_ = true; }

  // Queues the hello and registers with the loop. False when the connection is already gone.
  bool Start() {
    wire::EncodeHello({.version = wire::kVersion, .pool_size = server_->pool_->size()}, head_);
    head_len_ = wire::kHelloBytes;
    if (Flush() == Step::kClosed) return false;
    mask_ = OutputPending() ? EPOLLOUT : EPOLLIN;
    Status added = server_->loop_->Add(fd_.get(), mask_, this);
    if (!added.ok()) {
      LOG(WARNING) << "data server: cannot watch connection from " << peer_ << ": "
                   << added.message();
      return false;
    }
    return true;
  }

  void OnEvents(uint32_t events) override {
    if (closed_) return;
    if ((events & EPOLLERR) != 0 && (events & EPOLLIN) == 0) {
      Close("socket error", false);
      return;
    }
    for (int i = 0; i < kStepsPerWake; ++i) {
      Step step = OutputPending() ? Flush() : ReadStep();
      if (step == Step::kClosed) return;
      if (step == Step::kBlocked) break;
    }
    Watch(OutputPending() ? EPOLLOUT : EPOLLIN);
  }

 private:
  bool OutputPending() const { return head_len_ != 0; }

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

  // Receives into [dst, dst + len); `eof_what` says what an end of stream means here and
  // `eof_warns` whether it is worth a warning.
  Step Receive(void* dst, size_t len, size_t* got, const char* eof_what, bool eof_warns) {
    IoResult io = ReceiveSome(fd_.get(), dst, len);
    *got = io.bytes;
    switch (io.kind) {
      case IoResult::kData:
        return Step::kProgress;
      case IoResult::kBlocked:
        return Step::kBlocked;
      case IoResult::kEof:
        Close(eof_what, eof_warns);
        return Step::kClosed;
      case IoResult::kError:
        Close(std::string("recv failed: ") + std::strerror(io.error), false);
    }
    return Step::kClosed;
  }

  Step ReadStep() {
    size_t got = 0;
    if (phase_ == Phase::kHeader) {
      const bool clean = header_got_ == 0;
      Step step = Receive(header_ + header_got_, wire::kRequestBytes - header_got_, &got,
                          clean ? "peer closed" : "peer closed in the middle of a request", !clean);
      if (step != Step::kProgress) return step;
      header_got_ += got;
      if (header_got_ < wire::kRequestBytes) return Step::kProgress;
      header_got_ = 0;
      return StartRequest();
    }
    const uint64_t left = request_.length - payload_got_;
    uint8_t* dst = payload_dst_ != nullptr ? payload_dst_ + payload_got_ : server_->discard_.data();
    const size_t want = payload_dst_ != nullptr
                            ? static_cast<size_t>(std::min<uint64_t>(left, SIZE_MAX))
                            : static_cast<size_t>(std::min<uint64_t>(left, kDiscardBytes));
    Step step = Receive(dst, want, &got, "peer closed in the middle of a WRITE payload", true);
    if (step != Step::kProgress) return step;
    payload_got_ += got;
    if (payload_got_ == request_.length) QueueReply();
    return Step::kProgress;
  }

  Step StartRequest() {
    Status decoded = wire::DecodeRequest(header_, &request_);
    if (!decoded.ok()) {
      EngineCounters::Add(server_->counters_->served_dropped_connections);
      Close("not a data-plane request (" + decoded.message() + "); dropping the connection", true);
      return Step::kClosed;
    }
    verdict_ = CheckPoolRange(request_.offset, request_.length, server_->pool_->size(),
                              "node pool of this agent");
    payload_got_ = 0;
    if (request_.opcode == wire::Opcode::kWrite && request_.length > 0) {
      payload_dst_ = verdict_.ok() ? server_->pool_->base() + request_.offset : nullptr;
      phase_ = Phase::kPayload;
    } else {
      QueueReply();
    }
    return Step::kProgress;
  }

  void QueueReply() {
    phase_ = Phase::kHeader;
    wire::Reply reply{.status = 0, .id = request_.id, .length = 0};
    body_ = nullptr;
    body_len_ = 0;
    if (verdict_.ok()) {
      if (request_.opcode == wire::Opcode::kRead) {
        body_ = server_->pool_->base() + request_.offset;
        body_len_ = request_.length;
        reply.length = request_.length;
        EngineCounters::Add(server_->counters_->served_reads);
      } else {
        EngineCounters::Add(server_->counters_->served_writes);
      }
    } else {
      EngineCounters::Add(server_->counters_->served_rejected);
      LOG_EVERY_N(WARNING, 100) << "data server: refused a request from " << peer_ << ": "
                                << verdict_.message() << " (every 100th refusal is logged)";
      message_ = verdict_.message().substr(0, wire::kMaxErrorMessage);
      reply.status = static_cast<uint16_t>(verdict_.code());
      reply.length = message_.size();
      body_ = reinterpret_cast<const uint8_t*>(message_.data());
      body_len_ = message_.size();
    }
    wire::EncodeReply(reply, head_);
    head_len_ = wire::kReplyBytes;
    sent_ = 0;
  }

  Step Flush() {
    iovec iov[2];
    int count = 0;
    if (sent_ < head_len_) iov[count++] = {head_ + sent_, head_len_ - sent_};
    const uint64_t body_done = sent_ > head_len_ ? sent_ - head_len_ : 0;
    if (body_len_ > body_done) {
      iov[count++] = {const_cast<uint8_t*>(body_ + body_done), body_len_ - body_done};
    }
    IoResult io = SendSome(fd_.get(), iov, count);
    if (io.kind == IoResult::kBlocked) return Step::kBlocked;
    if (io.kind != IoResult::kData) {
      Close(std::string("send failed: ") + std::strerror(io.error), false);
      return Step::kClosed;
    }
    sent_ += io.bytes;
    if (sent_ == head_len_ + body_len_) {
      head_len_ = 0;
      body_len_ = 0;
      sent_ = 0;
    }
    return Step::kProgress;
  }

  enum class Phase { kHeader, kPayload };

  TcpDataServer* server_;
  Fd fd_;
  std::string peer_;
  uint32_t mask_ = 0;
  bool closed_ = false;

  // Input: the request being read.
  Phase phase_ = Phase::kHeader;
  uint8_t header_[wire::kRequestBytes];
  size_t header_got_ = 0;
  wire::Request request_;
  Status verdict_;                  // the request's bounds check
  uint8_t* payload_dst_ = nullptr;  // in the pool, or nullptr: discard (rejected WRITE)
  uint64_t payload_got_ = 0;

  // Output: hello or reply header, then an optional body (pool bytes or message_).
  uint8_t head_[std::max(wire::kHelloBytes, wire::kReplyBytes)];
  size_t head_len_ = 0;  // 0: nothing to send
  const uint8_t* body_ = nullptr;
  uint64_t body_len_ = 0;
  uint64_t sent_ = 0;  // bytes of head + body already sent
  std::string message_;
};

Result<std::unique_ptr<TcpDataServer>> TcpDataServer::Listen(EventLoop* loop, const NodePool* pool,
                                                             const ListenAddress& address,
                                                             EngineCounters* counters) {
  Result<SocketAddress> wanted = NumericAddress(address.host, address.port);
  if (!wanted.ok()) return wanted.status();
  Result<Fd> listener = ListenTcp(*wanted);
  if (!listener.ok()) return listener.status();
  Result<SocketAddress> bound = LocalAddress(listener->get());
  if (!bound.ok()) return bound.status();
  std::unique_ptr<TcpDataServer> server(
      new TcpDataServer(loop, pool, std::move(*listener), *bound, counters));
  KVAGENT_RETURN_IF_ERROR(loop->Add(server->listener_.get(), EPOLLIN, server.get()));
  return server;
}

TcpDataServer::TcpDataServer(EventLoop* loop, const NodePool* pool, Fd listener,
                             SocketAddress bound, EngineCounters* counters)
    : loop_(loop),
      pool_(pool),
      listener_(std::move(listener)),
      bound_(bound),
      counters_(counters),
      discard_(kDiscardBytes) {}

TcpDataServer::~TcpDataServer() = default;

void TcpDataServer::OnEvents(uint32_t /*events*/) {
  for (;;) {
    SocketAddress peer;
    Fd fd = AcceptConnection(listener_.get(), &peer);
    if (!fd.valid()) {
      if (errno == EMFILE || errno == ENFILE) {
        LOG_EVERY_N(ERROR, 1000) << "data server: cannot accept: " << std::strerror(errno)
                                 << "; raise LimitNOFILE for kvagent";
      }
      return;
    }
    auto connection = std::make_unique<Connection>(this, std::move(fd), FormatAddress(peer));
    Connection* raw = connection.get();
    connections_.emplace(raw, std::move(connection));
    if (!raw->Start()) Drop(raw);
  }
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

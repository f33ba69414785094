#include "tcp_client.h"

#include <glog/logging.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "input_buffer.h"
#include "kvagent/common/checksum.h"
#include "kvagent/common/errno_text.h"
#include "socket.h"
#include "tcp_wire.h"

namespace kvagent::transfer {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSendStepsPerWake = 64;
constexpr int kMaxIov = 64;  // iovecs gathered into one sendmsg (2 per op at most)

}  // namespace

// One connection to one peer. States: connecting -> waiting for the hello (which carries the
// peer's pool size and incarnation) -> with a cluster secret, waiting for the peer's proof of
// membership (after sending ours) -> ready. Ops wait in `to_send_` until ready; an op moves to
// `awaiting_` once its request (and payload) is fully sent, and leaves it when its reply has
// arrived. The peer answers in order, so the reply on the wire always belongs to awaiting_.front().
class TcpDataClient::Connection final : public EventLoop::Handler {
 public:
  Connection(TcpDataClient* owner, Endpoint peer, std::string key)
      : owner_(owner), peer_(std::move(peer)), key_(std::move(key)) {}

  const std::string& key() const { return key_; }
  int fd() const { return fd_.get(); }
  bool has_work() const {
    return state_ != State::kReady || !to_send_.empty() || !awaiting_.empty() || !preamble_.empty();
  }
  Clock::time_point last_progress() const { return last_progress_; }

  // Ready and idle, but its peer's hello named another pool than `op` was placed in: either the
  // op is stale or this connection is (its peer restarted and no FIN reached us, as after a
  // partition). Only a new connection's hello can tell which.
  bool IdleWithAnotherPoolThan(const PendingOp& op) const {
    return state_ == State::kReady && !has_work() && op.pool_incarnation != 0 &&
           pool_incarnation_ != 0 && op.pool_incarnation != pool_incarnation_;
  }

  // Starts the non-blocking connect.
  Status Open() {
    Result<SocketAddress> address = NumericAddress(peer_.host, peer_.port);
    if (!address.ok()) return address.status();
    Result<UniqueFd> fd = StartConnect(*address);
    if (!fd.ok()) return fd.status();
    fd_ = std::move(*fd);
    mask_ = EPOLLOUT;
    KVAGENT_RETURN_IF_ERROR(owner_->loop_->Add(fd_.get(), mask_, this));
    EngineCounters::Add(owner_->counters_->connections_opened);
    Touch();
    return Status::Ok();
  }

  void Enqueue(PendingOp op, uint64_t id) {
    if (state_ == State::kReady && !Acceptable(op)) return;
    if (!has_work()) Touch();  // the silence before this op is not the peer's fault
    Outgoing out;
    out.op = std::move(op);
    out.id = id;
    wire::EncodeRequest(
        {.opcode = out.op.kind == TransferKind::kWrite ? wire::Opcode::kWrite : wire::Opcode::kRead,
         .id = id,
         .offset = out.op.remote_offset,
         .length = out.op.length,
         .pool_incarnation = out.op.pool_incarnation,
         .master_epoch = out.op.master_epoch,
         .write_id = out.op.kind == TransferKind::kWrite ? out.op.write_id : 0,
         .has_payload_crc = out.op.payload_crc.has_value(),
         .payload_crc = out.op.payload_crc.value_or(0)},
        out.header);
    to_send_.push_back(std::move(out));
  }

  // Sends what it can now, then watches for what it still needs.
  void Kick() {
    if (dead_) return;
    if (!preamble_.empty()) {
      Step step = SendPreamble();
      if (step == Step::kClosed) return;
    }
    if (state_ != State::kReady) return UpdateWatch();
    for (int i = 0; i < kSendStepsPerWake && !to_send_.empty(); ++i) {
      Step step = SendStep();
      if (step == Step::kClosed) return;
      if (step == Step::kBlocked) break;
    }
    UpdateWatch();
  }

  void OnEvents(uint32_t events) override {
    if (dead_) return;
    if (state_ == State::kConnecting) {
      Status connected = ConnectResult(fd_.get());
      if (!connected.ok()) {
        owner_->Drop(this, ErrorCode::kTransferFailed,
                     "cannot reach the peer: " + connected.message());
        return;
      }
      state_ = State::kHello;
      Touch();
      UpdateWatch();
      return;
    }
    if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0) {
      // The budget may only end the wake-up when nothing complete is buffered: buffered
      // replies raise no epoll event.
      for (int i = 0; i < kSendStepsPerWake || HasBufferedReply(); ++i) {
        Step step = ReadStep();
        if (step == Step::kClosed) return;
        if (step == Step::kBlocked) break;
      }
    }
    Kick();
  }

  // Finishes every op with `code`: "<op>: <reason>".
  void FailAll(ErrorCode code, const std::string& reason) {
    dead_ = true;
    for (auto* queue : {&awaiting_, &to_send_}) {
      for (Outgoing& out : *queue) {
        std::string why = reason;
        if (out.sent > 0 && out.op.kind == TransferKind::kWrite && out.sent < out.total()) {
          why += " (" +
                 std::to_string(out.sent - std::min<uint64_t>(out.sent, wire::kRequestBytes)) +
                 " of " + std::to_string(out.op.length) + " bytes had been sent)";
        }
        out.op.Fail(code, why);
      }
      queue->clear();
    }
  }

  const char* Phase() const {
    switch (state_) {
      case State::kConnecting:
        return "connecting";
      case State::kHello:
        return "waiting for the peer's hello";
      case State::kAuth:
        return "waiting for the peer's proof of membership";
      case State::kReady:
        return to_send_.empty() ? "waiting for replies" : "sending requests";
    }
    return "";
  }

 private:
  struct Outgoing {
    PendingOp op;
    uint64_t id = 0;
    uint8_t header[wire::kRequestBytes] = {};
    uint64_t sent = 0;  // bytes of header + payload already sent
    uint64_t total() const {
      return wire::kRequestBytes + (op.kind == TransferKind::kWrite ? op.length : 0);
    }
  };
  enum class State { kConnecting, kHello, kAuth, kReady };

  void Touch() { last_progress_ = Clock::now(); }
  // Bytes moved count as progress once the connection is ready. The handshake (connect, the
  // peer's hello, under a secret its proof: 80 bytes) must be done within one peer timeout of
  // the connect: a peer sending a byte now and then, each just inside the timeout, held an op
  // ~80 timeouts before it had proved anything.
  void Progress() {
    if (state_ == State::kReady) Touch();
  }

  bool HasBufferedReply() const {
    if (state_ == State::kHello) return in_.size() >= wire::kHelloBytes;
    if (state_ == State::kAuth) return in_.size() >= wire::kAuthOkBytes;
    return in_body_ ? in_.size() > 0 : in_.size() >= wire::kReplyBytes;
  }

  // The op fits the peer's pool as its hello described it: the range lies inside, and the pool
  // is the one the placement was made in (a restarted peer has a new, empty pool).
  bool Acceptable(PendingOp& op) {
    if (op.pool_incarnation != 0 && pool_incarnation_ != 0 &&
        op.pool_incarnation != pool_incarnation_) {
      op.Fail(ErrorCode::kTransferFailed,
              "the peer restarted: its pool is incarnation " + std::to_string(pool_incarnation_) +
                  ", the placement was made in incarnation " + std::to_string(op.pool_incarnation) +
                  " (the value there is gone)");
      return false;
    }
    Status range = CheckPoolRange(op.remote_offset, op.length, pool_size_, "pool of " + key_);
    if (range.ok()) return true;
    op.Finish(Status(range.code(), op.Describe() + ": " + range.message()));
    return false;
  }

  void UpdateWatch() {
    uint32_t mask = EPOLLIN;
    if ((state_ == State::kReady && !to_send_.empty()) || !preamble_.empty() ||
        state_ == State::kConnecting) {
      mask |= EPOLLOUT;
    }
    if (mask == mask_) return;
    mask_ = mask;
    Status changed = owner_->loop_->Modify(fd_.get(), mask_, this);
    if (!changed.ok()) owner_->Drop(this, ErrorCode::kTransferFailed, changed.message());
  }

  Step Fail(const std::string& reason) {
    owner_->Drop(this, ErrorCode::kTransferFailed, reason);
    return Step::kClosed;
  }

  // Folds an IoResult into a Step; an end of stream fails the connection's ops unless it had
  // none (an idle pooled connection the peer closed: restart, idle reaping).
  Step Outcome(const IoResult& io) {
    switch (io.kind) {
      case IoResult::kData:
        if (io.bytes > 0) Progress();
        return Step::kProgress;
      case IoResult::kBlocked:
        return Step::kBlocked;
      case IoResult::kError:
        return Fail(std::string("receive failed: ") + ErrnoText(io.error));
      case IoResult::kEof:
        break;
    }
    if (!has_work()) {
      owner_->Drop(this, ErrorCode::kTransferFailed, "peer closed an idle connection");
      return Step::kClosed;
    }
    if (state_ == State::kAuth) {
      return Fail(
          "the peer closed the connection during authentication: it does not accept this "
          "agent's cluster secret (check that every node has the same "
          "--cluster-secret-file)");
    }
    return Fail(state_ == State::kHello ? "peer closed the connection before its hello (is this "
                                          "a kvagent data endpoint?)"
                                        : "peer closed the connection mid-transfer");
  }

  Step ReadStep() {
    if (state_ == State::kAuth) {
      if (in_.size() < wire::kAuthOkBytes) return Outcome(in_.Fill(fd_.get()));
      Step step = CheckServerProof(in_.data());
      if (step != Step::kClosed) in_.Consume(wire::kAuthOkBytes);
      return step;
    }
    if (state_ == State::kHello || !in_body_) {
      const size_t need = state_ == State::kHello ? wire::kHelloBytes : wire::kReplyBytes;
      if (in_.size() < need) return Outcome(in_.Fill(fd_.get()));
      Step step = state_ == State::kHello ? StartHello(in_.data()) : StartReply(in_.data());
      if (step != Step::kClosed) in_.Consume(need);
      return step;
    }
    if (reply_.status == 0 && awaiting_.front().op.received != nullptr) return ReadChecksummed();
    uint8_t* dst =
        reply_.status == 0 ? awaiting_.front().op.local : reinterpret_cast<uint8_t*>(error_.data());
    uint64_t moved = 0;
    IoResult io = in_.ReadPayload(fd_.get(), dst + body_got_, body_len_ - body_got_, &moved);
    body_got_ += moved;
    if (body_got_ == body_len_) FinishHead();
    return Outcome(io);
  }

  // A read's body that asked for its CRC: always through our own buffer, copied into `local`
  // with the CRC taken from the buffer on the way (TransferOp::received), so that what the
  // client may write into `local` meanwhile cannot change it.
  Step ReadChecksummed() {
    if (in_.size() == 0) {
      IoResult io = in_.Fill(fd_.get());
      if (io.kind != IoResult::kData || in_.size() == 0) return Outcome(io);
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>(body_len_ - body_got_, in_.size()));
    body_crc_ = CopyWithCrc32c(awaiting_.front().op.local + body_got_, in_.data(), n,
                               CopyStores::kCached, body_crc_);
    in_.Consume(n);
    body_got_ += n;
    Touch();
    if (body_got_ == body_len_) FinishHead();
    return Step::kProgress;
  }

  Step StartHello(const uint8_t* bytes) {
    wire::Hello hello;
    Status decoded = wire::DecodeHello(bytes, &hello);
    if (!decoded.ok()) return Fail("bad hello: " + decoded.message());
    pool_size_ = hello.pool_size;
    pool_incarnation_ = hello.pool_incarnation;
    const bool required = (hello.flags & wire::kHelloAuthRequired) != 0;
    const SymmetricKey* key = owner_->key_;
    if (required && key == nullptr) {
      return Fail(
          "the peer requires authentication: start this agent with the cluster's "
          "--cluster-secret-file");
    }
    if (!required && key != nullptr) {
      return Fail(
          "the peer does not authenticate itself, so it cannot be a member of this "
          "cluster (an agent without --cluster-secret-file, or not a kvagent): refused");
    }
    if (required) {
      std::memcpy(hello_.data(), bytes, wire::kHelloBytes);
      wire::Auth auth;
      RandomBytes(auth.nonce);
      client_nonce_ = auth.nonce;
      auth.proof = wire::AuthProof(*key, /*server=*/false, hello_.data(), auth.nonce);
      preamble_.assign(wire::kAuthBytes, '\0');
      wire::EncodeAuth(auth, reinterpret_cast<uint8_t*>(preamble_.data()));
      state_ = State::kAuth;
      return SendPreamble() == Step::kClosed ? Step::kClosed : Step::kProgress;
    }
    return Ready();
  }

  // The peer proved membership: the connection is ready.
  Step CheckServerProof(const uint8_t* bytes) {
    std::array<uint8_t, wire::kProofBytes> proof;
    Status decoded = wire::DecodeAuthOk(bytes, &proof);
    if (!decoded.ok()) return Fail("bad authentication answer: " + decoded.message());
    const auto expected =
        wire::AuthProof(*owner_->key_, /*server=*/true, hello_.data(), client_nonce_);
    if (!ConstantTimeEqual(proof, expected)) {
      return Fail(
          "the peer failed to prove it holds the cluster secret: not a member of this "
          "cluster (check that every node has the same --cluster-secret-file)");
    }
    return Ready();
  }

  Step SendPreamble() {
    const ssize_t n = ::send(fd_.get(), preamble_.data(), preamble_.size(), MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Step::kBlocked;
    if (n < 0) return Fail(std::string("send failed: ") + ErrnoText(errno));
    preamble_.erase(0, static_cast<size_t>(n));
    Progress();
    return Step::kProgress;
  }

  Step Ready() {
    state_ = State::kReady;
    Touch();  // the handshake is done
    // Ops queued while connecting are checked now that the peer's pool is known.
    std::deque<Outgoing> queued = std::move(to_send_);
    to_send_.clear();
    for (Outgoing& out : queued) {
      if (Acceptable(out.op)) to_send_.push_back(std::move(out));
    }
    return Step::kProgress;
  }

  Step StartReply(const uint8_t* bytes) {
    Status decoded = wire::DecodeReply(bytes, &reply_);
    if (!decoded.ok()) return Fail("protocol error: " + decoded.message());
    if (awaiting_.empty() || awaiting_.front().id != reply_.id) {
      return Fail("protocol error: reply for request " + std::to_string(reply_.id) +
                  " does not match the oldest outstanding request");
    }
    const PendingOp& op = awaiting_.front().op;
    uint64_t expected = op.kind == TransferKind::kRead ? op.length : 0;
    if (reply_.status == 0 && reply_.length != expected) {
      return Fail("protocol error: reply carries " + std::to_string(reply_.length) +
                  " bytes, expected " + std::to_string(expected));
    }
    body_len_ = reply_.length;
    body_got_ = 0;
    body_crc_ = 0;
    if (reply_.status != 0) error_.assign(body_len_, '\0');
    in_body_ = body_len_ > 0;
    if (!in_body_) FinishHead();
    return Step::kProgress;
  }

  void FinishHead() {
    in_body_ = false;
    Outgoing head = std::move(awaiting_.front());
    awaiting_.pop_front();
    if (reply_.status == 0) {
      if (head.op.received != nullptr) *head.op.received = ReceivedChecksum{body_crc_, true};
      head.op.Finish(Status::Ok());
    } else {
      head.op.Fail(ErrorCodeFromWire(reply_.status), "peer refused: " + error_);
    }
  }

  Step SendStep() {
    iovec iov[kMaxIov];
    int count = 0;
    for (const Outgoing& out : to_send_) {
      if (count + 2 > kMaxIov) break;
      if (out.sent < wire::kRequestBytes) {
        iov[count++] = {const_cast<uint8_t*>(out.header) + out.sent,
                        wire::kRequestBytes - out.sent};
      }
      if (out.op.kind == TransferKind::kWrite) {
        const uint64_t done = out.sent > wire::kRequestBytes ? out.sent - wire::kRequestBytes : 0;
        iov[count++] = {out.op.local + done, out.op.length - done};
      }
    }
    IoResult io = SendSome(fd_.get(), iov, count);
    if (io.kind == IoResult::kBlocked) return Step::kBlocked;
    if (io.kind != IoResult::kData) {
      return Fail(std::string("send failed: ") + ErrnoText(io.error));
    }
    if (io.bytes > 0) Progress();
    uint64_t left = io.bytes;
    while (left > 0) {
      Outgoing& front = to_send_.front();
      const uint64_t take = std::min(left, front.total() - front.sent);
      front.sent += take;
      left -= take;
      if (front.sent == front.total()) {
        awaiting_.push_back(std::move(front));
        to_send_.pop_front();
      }
    }
    return Step::kProgress;
  }

  TcpDataClient* owner_;
  Endpoint peer_;
  std::string key_;
  UniqueFd fd_;
  uint32_t mask_ = 0;
  bool dead_ = false;
  State state_ = State::kConnecting;
  Clock::time_point last_progress_;
  uint64_t pool_size_ = 0;
  uint64_t pool_incarnation_ = 0;
  // Authentication: the hello as received, our nonce, and our proof while it is being sent.
  std::array<uint8_t, wire::kHelloBytes> hello_{};
  std::array<uint8_t, wire::kNonceBytes> client_nonce_{};
  std::string preamble_;

  InputBuffer in_;  // hello, reply headers, small bodies

  std::deque<Outgoing> to_send_;
  std::deque<Outgoing> awaiting_;

  // The reply being read; its body goes into awaiting_.front().op.local (READ) or error_.
  wire::Reply reply_;
  bool in_body_ = false;
  uint64_t body_len_ = 0;
  uint64_t body_got_ = 0;
  uint32_t body_crc_ = 0;  // of the body so far (ReadChecksummed)
  std::string error_;
};

TcpDataClient::TcpDataClient(EventLoop* loop, std::chrono::milliseconds peer_timeout,
                             EngineCounters* counters, const SymmetricKey* key)
    : loop_(loop), peer_timeout_(peer_timeout), counters_(counters), key_(key) {}

TcpDataClient::~TcpDataClient() = default;

void TcpDataClient::Submit(std::vector<PendingOp> ops) {
  loop_->Post([this, ops = std::move(ops)]() mutable { Start(std::move(ops)); });
}

void TcpDataClient::Start(std::vector<PendingOp> ops) {
  // An idle connection whose peer named another pool is replaced before its first op of this
  // batch, so that an op for a restarted peer is not failed on a connection to its last life
  // (a busy one is left to finish or time out). Its hello then decides whether the op is stale.
  for (const PendingOp& op : ops) {
    auto it = peers_.find(op.peer.ToString());
    if (it != peers_.end() && it->second->IdleWithAnotherPoolThan(op)) {
      Drop(it->second.get(), ErrorCode::kTransferFailed, "replaced: the peer named another pool");
    }
  }
  DispatchToPeers(
      std::move(ops), peers_,
      [this](PendingOp& op, const std::string& key) {
        auto connection = std::make_unique<Connection>(this, op.peer, key);
        Status opened = connection->Open();
        if (opened.ok()) return connection;
        op.Fail(ErrorCode::kTransferFailed, "cannot reach the peer: " + opened.message());
        return std::unique_ptr<Connection>();
      },
      [this](Connection* connection, PendingOp op) {
        connection->Enqueue(std::move(op), next_request_id_++);
      },
      [](Connection* connection) { connection->Kick(); });
}

int TcpDataClient::Tick() {
  return ExpireStalledPeers(peers_, peer_timeout_, [this](Connection* connection) {
    Drop(connection, ErrorCode::kTimeout,
         "peer made no progress for " + std::to_string(peer_timeout_.count()) + " ms (" +
             connection->Phase() + "); connection closed");
  });
}

void TcpDataClient::FailAll(const std::string& reason) {
  std::vector<Connection*> all;
  for (auto& [key, connection] : peers_) all.push_back(connection.get());
  for (Connection* connection : all) Drop(connection, ErrorCode::kTransferFailed, reason);
}

void TcpDataClient::Drop(Connection* connection, ErrorCode code, const std::string& reason) {
  auto it = peers_.find(connection->key());
  if (it == peers_.end() || it->second.get() != connection) return;
  std::unique_ptr<Connection> owned = std::move(it->second);
  peers_.erase(it);
  loop_->Remove(owned->fd());
  if (owned->has_work()) {
    LOG(WARNING) << "data plane: connection to " << owned->key() << " failed: " << reason;
  }
  owned->FailAll(code, reason);
  graveyard_.push_back(std::move(owned));
  // Destroy after the current wake-up: the loop may still hold an event for this connection.
  if (graveyard_.size() == 1) loop_->Post([this] { graveyard_.clear(); });
}

}  // namespace kvagent::transfer

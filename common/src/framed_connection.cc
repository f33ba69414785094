#include "kvagent/common/framed_connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "kvagent/common/errno_text.h"
#include "kvagent/common/tcp_socket.h"

namespace kvagent {
namespace {
constexpr size_t kReadChunk = 256 * 1024;
}  // namespace

Result<FramedConnection> FramedConnection::Connect(const std::string& endpoint, size_t max_reply,
                                                   const std::optional<SymmetricKey>& key) {
  auto fd = ConnectTcp(endpoint);
  if (!fd.ok()) return fd.status();
  return FramedConnection(std::move(*fd), endpoint, max_reply, key);
}

FramedConnection::FramedConnection(UniqueFd fd, std::string endpoint, size_t max_reply,
                                   const std::optional<SymmetricKey>& key)
    : fd_(std::move(fd)),
      endpoint_(std::move(endpoint)),
      in_(key ? FrameReader(max_reply + kFrameTagBytes, kFramedSecureVersion,
                            kSecureServerHelloRest)
              : FrameReader(max_reply, /*hello=*/true)) {
  if (key) {
    handshake_ = std::make_unique<FramedClientHandshake>(*key);
    out_.Append(handshake_->Hello());  // ours goes first
  } else {
    out_.Append(kFrameHello);
  }
}

short FramedConnection::events() const {
  return static_cast<short>(POLLIN | (connecting_ || !out_.empty() ? POLLOUT : 0));
}

void FramedConnection::Send(std::span<const uint8_t> request) {
  if (sealer_) {
    out_.AppendSealedFrame(*sealer_, request);
  } else if (handshake_) {
    unsealed_.emplace_back(request.begin(), request.end());
    unsealed_bytes_ += request.size();
  } else {
    out_.AppendFrame(request);
  }
}

Status FramedConnection::FinishHandshake() {
  auto keys = handshake_->Finish(in_.hello_rest());
  if (!keys.ok()) {
    return Status(ErrorCode::kMasterUnavailable,
                  endpoint_ + ": " + keys.status().message() +
                      "; every member needs the same --cluster-secret-file");
  }
  handshake_.reset();
  sealer_.emplace(keys->send);
  opener_.emplace(keys->receive);
  // The requests that waited, sealed in the order they were sent.
  for (const auto& request : unsealed_) out_.AppendSealedFrame(*sealer_, request);
  unsealed_.clear();
  unsealed_bytes_ = 0;
  return Status::Ok();
}

Status FramedConnection::Write() {
  Status sent = out_.FlushTo(fd_.get(), endpoint_);
  if (!sent.ok()) return Status(ErrorCode::kMasterUnavailable, sent.message());
  return Status::Ok();
}

Status FramedConnection::Flush() {
  if (connecting_) return Status::Ok();
  return Write();
}

Status FramedConnection::OnReady(short revents, const ReplyFn& on_reply) {
  if (connecting_) {
    if ((revents & (POLLOUT | POLLERR | POLLHUP)) == 0) return Status::Ok();
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      return Status(ErrorCode::kMasterUnavailable,
                    "cannot connect to " + endpoint_ + ": " + ErrnoText(err));
    }
    connecting_ = false;
  }
  if ((revents & POLLOUT) != 0 || !out_.empty()) KVAGENT_RETURN_IF_ERROR(Write());
  if ((revents & (POLLIN | POLLHUP | POLLERR)) == 0) return Status::Ok();
  const std::span<uint8_t> space = in_.Space(kReadChunk);
  const ssize_t n = ::read(fd_.get(), space.data(), space.size());
  if (n == 0) return Status(ErrorCode::kMasterUnavailable, endpoint_ + " closed the connection");
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
    return Status(ErrorCode::kMasterUnavailable,
                  "reading from " + endpoint_ + " failed: " + ErrnoText(errno));
  }
  in_.Commit(static_cast<size_t>(n));
  while (true) {
    auto frame = in_.Next();
    if (!frame.ok()) {
      return Status(ErrorCode::kMasterUnavailable,
                    endpoint_ +
                        " does not speak the framed RPC (is it kvmaster's --framed-listen "
                        "endpoint?): " +
                        frame.status().message());
    }
    if (handshake_ && in_.hello_done()) KVAGENT_RETURN_IF_ERROR(FinishHandshake());
    established_ = in_.hello_done() && !handshake_;
    if (!frame->has_value()) break;
    if (opener_) {
      auto plain = opener_->Open(**frame);
      if (!plain.ok()) {
        return Status(ErrorCode::kMasterUnavailable,
                      endpoint_ + ": a reply did not open: " + plain.status().message());
      }
      on_reply(*plain);
    } else {
      on_reply(**frame);
    }
  }
  // Requests sealed when the handshake ended go now.
  if (!out_.empty()) KVAGENT_RETURN_IF_ERROR(Write());
  in_.Compact();
  return Status::Ok();
}

Result<std::vector<uint8_t>> FramedConnection::Call(std::span<const uint8_t> request,
                                                    std::chrono::milliseconds timeout) {
  Send(request);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<uint8_t> reply;
  bool got = false;
  while (!got) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return Status(ErrorCode::kTimeout, "no reply from " + endpoint_ + " within " +
                                             std::to_string(timeout.count()) + " ms");
    }
    pollfd p{fd_.get(), events(), 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
    KVAGENT_RETURN_IF_ERROR(OnReady(p.revents, [&](std::span<const uint8_t> r) {
      reply.assign(r.begin(), r.end());
      got = true;
    }));
  }
  return reply;
}

}  // namespace kvagent

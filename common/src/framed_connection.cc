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

Result<FramedConnection> FramedConnection::Connect(const std::string& endpoint, size_t max_reply) {
  auto fd = ConnectTcp(endpoint);
  if (!fd.ok()) return fd.status();
  return FramedConnection(std::move(*fd), endpoint, max_reply);
}

FramedConnection::FramedConnection(UniqueFd fd, std::string endpoint, size_t max_reply)
    : fd_(std::move(fd)), endpoint_(std::move(endpoint)), in_(max_reply, /*hello=*/true) {
  out_.assign(kFrameHello.begin(), kFrameHello.end());  // ours goes first
}

short FramedConnection::events() const {
  return static_cast<short>(POLLIN | (connecting_ || out_sent_ < out_.size() ? POLLOUT : 0));
}

void FramedConnection::Send(std::span<const uint8_t> request) { AppendFrame(&out_, request); }

Status FramedConnection::Write() {
  while (out_sent_ < out_.size()) {
    const ssize_t n =
        ::send(fd_.get(), out_.data() + out_sent_, out_.size() - out_sent_, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
      return Status(ErrorCode::kMasterUnavailable,
                    "sending to " + endpoint_ + " failed: " + ErrnoText(errno));
    }
    out_sent_ += static_cast<size_t>(n);
  }
  out_.clear();
  out_sent_ = 0;
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
  if ((revents & POLLOUT) != 0 || out_sent_ < out_.size()) KVAGENT_RETURN_IF_ERROR(Write());
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
    established_ = in_.hello_done();
    if (!frame->has_value()) break;
    on_reply(**frame);
  }
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

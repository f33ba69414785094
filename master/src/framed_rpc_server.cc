#include "framed_rpc_server.h"

#include <glog/logging.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "kvagent/common/errno_text.h"
#include "kvagent/common/tcp_socket.h"
#include "kvagent/zmq/zmq_limits.h"

namespace kvagent::master {
namespace {

constexpr size_t kReadChunk = 256 * 1024;  // what one read() may bring

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<std::unique_ptr<FramedRpcServer>> FramedRpcServer::Listen(
    const FramedRpcServerOptions& options) {
  std::unique_ptr<FramedRpcServer> s(new FramedRpcServer(options));
  if (s->options_.max_request_bytes == 0) {
    s->options_.max_request_bytes = static_cast<size_t>(kMaxMasterRequestBytes);
  }
  s->options_.max_connections = std::max<size_t>(s->options_.max_connections, 1);
  auto fd = ListenTcp(options.listen, &s->endpoint_);
  if (!fd.ok()) {
    return Status(fd.status().code(),
                  fd.status().message() + "; pick a free address with --framed-listen");
  }
  s->listener_ = std::move(*fd);
  return s;
}

void FramedRpcServer::AppendPollFds(std::vector<pollfd>* fds) {
  fds->push_back(pollfd{listener_.get(), POLLIN, 0});
  polled_.clear();
  for (auto& [id, c] : connections_) {
    const bool writing = !c.out.empty();
    fds->push_back(pollfd{c.fd.get(), static_cast<short>(POLLIN | (writing ? POLLOUT : 0)), 0});
    polled_.push_back(id);
  }
}

size_t FramedRpcServer::Serve(std::span<const pollfd> ready, const RequestFn& on_request,
                              size_t budget) {
  size_t handled = 0;
  if (!ready.empty() && (ready[0].revents & POLLIN) != 0) Accept();
  for (size_t i = 0; i < polled_.size() && i + 1 < ready.size(); ++i) {
    auto it = connections_.find(polled_[i]);
    if (it == connections_.end()) continue;
    Connection& c = it->second;
    const short ev = ready[i + 1].revents;
    bool keep = true;
    if ((ev & (POLLIN | POLLHUP | POLLERR)) != 0) {
      keep = ReadFrom(it->first, c, on_request, budget, &handled);
    } else if (c.frames_waiting) {
      keep = Drain(it->first, c, on_request, budget, &handled);
    }
    if (keep && (ev & POLLOUT) != 0) keep = WriteTo(c);
    if (!keep) closing_.push_back(it->first);
  }
  // Frames left over from an earlier Serve, on connections this poll did not list as ready.
  if (buffered_ > 0) {
    for (auto& [id, c] : connections_) {
      if (c.frames_waiting && handled < budget && !Drain(id, c, on_request, budget, &handled)) {
        closing_.push_back(id);
      }
    }
  }
  for (ConnectionId id : closing_) Close(id);
  closing_.clear();
  return handled;
}

void FramedRpcServer::Accept() {
  while (true) {
    UniqueFd fd = AcceptTcp(listener_.get());
    if (!fd.valid()) return;  // none pending (or an error the next poll shows again)
    if (connections_.size() >= options_.max_connections) {
      ++stats_.refused;
      LOG_EVERY_N(WARNING, 100) << "framed RPC: " << connections_.size()
                                << " connections already; a new one is closed";
      continue;
    }
    // Our hello goes first, before any reply (encrypted: its prefix, the rest once the
    // client's is in).
    const auto prefix = FrameHelloPrefix(options_.key ? kFramedSecureVersion : kFramedPlainVersion);
    // Until the client holds the secret, its first frame may be small only.
    const size_t first_frame =
        std::min(options_.max_request_bytes, options_.max_unproven_frame_bytes) + kFrameTagBytes;
    Connection c{std::move(fd),
                 options_.key
                     ? FrameReader(first_frame, kFramedSecureVersion, kSecureClientHelloRest)
                     : FrameReader(options_.max_request_bytes, /*hello=*/true),
                 {},
                 false,
                 std::nullopt,
                 std::nullopt};
    c.out.Append(prefix);
    const ConnectionId id = next_id_++;
    auto [it, inserted] = connections_.emplace(id, std::move(c));
    unproven_.emplace_back(SteadyMs() + options_.handshake_timeout_ms, id);
    ++stats_.accepted;
    if (!WriteTo(it->second)) Close(id);
  }
}

bool FramedRpcServer::ReadFrom(ConnectionId id, Connection& c, const RequestFn& on_request,
                               size_t budget, size_t* handled) {
  if (c.frames_waiting) {  // the frames already read go first
    if (!Drain(id, c, on_request, budget, handled)) return false;
    if (c.frames_waiting) return true;  // the budget ran out: read more next time
  }
  const std::span<uint8_t> space = c.in.Space(kReadChunk);
  const ssize_t n = ::read(c.fd.get(), space.data(), space.size());
  if (n == 0) return false;  // the peer closed
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  c.in.Commit(static_cast<size_t>(n));
  c.frames_waiting = true;
  ++buffered_;
  return Drain(id, c, on_request, budget, handled);
}

bool FramedRpcServer::Drain(ConnectionId id, Connection& c, const RequestFn& on_request,
                            size_t budget, size_t* handled) {
  while (*handled < budget) {
    auto frame = c.in.Next();
    if (!frame.ok()) {
      c.frames_waiting = false;  // nothing more is read from it: it is closed
      --buffered_;
      ++stats_.bad_streams;
      LOG_EVERY_N(WARNING, 100) << "framed RPC: closing a connection: " << frame.status().message();
      return false;
    }
    if (!options_.key && !c.proven && c.in.hello_done()) c.proven = true;  // nothing to prove
    if (options_.key && !c.opener && c.in.hello_done() && !Answer(c)) {
      c.frames_waiting = false;
      --buffered_;
      ++stats_.bad_streams;
      return false;
    }
    if (!frame->has_value()) {  // every complete frame handled
      c.in.Compact();
      c.frames_waiting = false;
      --buffered_;
      return true;
    }
    std::span<const uint8_t> request = **frame;
    if (c.opener) {
      auto plain = c.opener->Open(**frame);
      if (!plain.ok()) {
        c.frames_waiting = false;
        --buffered_;
        ++stats_.unauthenticated;
        LOG_EVERY_N(WARNING, 100)
            << "framed RPC: closing a connection whose request did not open (does its agent "
               "hold this kvmaster's cluster secret?): "
            << plain.status().message();
        return false;
      }
      request = *plain;
      if (!c.proven) {  // it holds the secret: its requests may be as large as any
        c.proven = true;
        c.in.set_max_frame(options_.max_request_bytes + kFrameTagBytes);
      }
    }
    ++*handled;
    on_request(id, request);
  }
  return true;  // frames may be left: the next Serve goes on
}

bool FramedRpcServer::Answer(Connection& c) {
  auto h = AnswerFramedClient(*options_.key, c.in.hello_rest());
  if (!h.ok()) {
    LOG_EVERY_N(WARNING, 100) << "framed RPC: closing a connection: " << h.status().message();
    return false;
  }
  c.out.Append(h->reply);
  c.sealer.emplace(h->keys.send);
  c.opener.emplace(h->keys.receive);
  return WriteTo(c);
}

void FramedRpcServer::Reply(ConnectionId conn, std::span<const uint8_t> reply) {
  auto it = connections_.find(conn);
  if (it == connections_.end()) return;  // gone: its caller hears nothing (as on the ROUTER)
  Connection& c = it->second;
  if (c.out.queued() + reply.size() > options_.max_queued_bytes) {
    ++stats_.slow_readers;
    LOG_EVERY_N(WARNING, 10) << "framed RPC: a client does not read its replies (" << c.out.queued()
                             << " bytes waiting); closing it";
    closing_.push_back(conn);
    c.out.Clear();
    return;
  }
  if (c.sealer) {
    c.out.AppendSealedFrame(*c.sealer, reply);
  } else {
    c.out.AppendFrame(reply);
  }
}

void FramedRpcServer::Flush() {
  for (auto& [id, c] : connections_) {
    if (!c.out.empty() && !WriteTo(c)) closing_.push_back(id);
  }
  for (ConnectionId id : closing_) Close(id);
  closing_.clear();
}

bool FramedRpcServer::WriteTo(Connection& c) {
  return c.out.FlushTo(c.fd.get(), "a framed RPC client").ok();  // a failed send closes it
}

void FramedRpcServer::ExpireUnproven() {
  const int64_t now = SteadyMs();
  while (!unproven_.empty() && unproven_.front().first <= now) {
    const ConnectionId id = unproven_.front().second;
    unproven_.pop_front();
    auto it = connections_.find(id);
    if (it == connections_.end() || it->second.proven) continue;
    ++stats_.handshake_timeouts;
    LOG_EVERY_N(WARNING, 100) << "framed RPC: closing a connection that did not complete its "
                              << "handshake (or, under a cluster secret, send a request that "
                              << "opens) within " << options_.handshake_timeout_ms << " ms";
    Close(id);
  }
}

void FramedRpcServer::Close(ConnectionId id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  if (it->second.frames_waiting) --buffered_;
  connections_.erase(it);
}

std::string FramedRpcServer::PeerAddress(ConnectionId conn) const {
  auto it = connections_.find(conn);
  return it == connections_.end() ? "" : PeerAddressOf(it->second.fd.get());
}

FramedRpcStats FramedRpcServer::stats() const {
  FramedRpcStats s = stats_;
  s.connections = connections_.size();
  return s;
}

}  // namespace kvagent::master

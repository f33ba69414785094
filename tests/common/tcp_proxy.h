// TcpProxy: a TCP proxy for fault tests, standing for the network path between two processes.
//
// Listens on `listen_host`:`port` (port 0: one the OS picks) and forwards the n-th connection it
// accepts to 127.0.0.1:targets[n] (the last target for any later one). What it can do to the
// traffic, as a network would:
//   - Hold(): bytes from clients are read and kept (the client sees its sends succeed, as a path
//     that buffers them would) instead of forwarded; Release() delivers what was kept and
//     forwards again. A client that goes away while held does not take its kept bytes with it:
//     they are still delivered at Release, as TCP retransmissions after a partition heals would
//     be. Replies flow back unchanged.
//   - Cut(): the connections open so far stop forwarding either way without being closed, as a
//     partition does: their clients never hear that the peer behind them went away.
//   - Retarget(port): every later connection goes to `port` (a virtual IP moving to another
//     host); open connections are closed.
//   - FlipToServer(n) damages one byte (the middle one) in each of the next n pieces of at least
//     1 KiB it forwards to the server, as a bad NIC or switch would, at least `apart` from each
//     other; FlipToClient(n) the same on the way back.
// Every socket is close-on-exec: a process a test starts after the proxy must not inherit them
// (a copy in a child keeps a connection open after the proxy closed it).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "write_all.h"

namespace kvagent::testing {

class TcpProxy {
 public:
  TcpProxy(const std::string& listen_host, uint16_t port, std::vector<uint16_t> targets)
      : targets_(std::move(targets)) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, listen_host.c_str(), &a.sin_addr);
    ok_ = !targets_.empty() && bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
          listen(listener_, 16) == 0;
    socklen_t len = sizeof(a);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    host_ = listen_host;
    thread_ = std::thread([this] { Run(); });
  }
  TcpProxy(const std::string& listen_host, uint16_t port, uint16_t target)
      : TcpProxy(listen_host, port, std::vector<uint16_t>{target}) {}
  ~TcpProxy() {
    stop_ = true;
    thread_.join();
    close(listener_);
    for (Pair& p : pairs_) Close(&p);
  }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  bool ok() const { return ok_; }
  uint16_t port() const { return port_; }
  std::string endpoint() const { return "tcp://" + host_ + ":" + std::to_string(port_); }
  int accepted() const { return accepted_.load(); }

  void Hold() { held_ = true; }
  void Release() { held_ = false; }
  void Cut() {
    std::lock_guard<std::mutex> lock(mu_);
    for (Pair& p : pairs_) p.cut = true;
  }
  void Retarget(uint16_t target) {
    std::lock_guard<std::mutex> lock(mu_);
    targets_ = {target};
    for (Pair& p : pairs_) Close(&p);
    pairs_.clear();
  }
  void FlipToServer(int n, std::chrono::milliseconds apart = {}) {
    flips_apart_ms_ = apart.count();
    flips_ = n;
  }
  void FlipToClient(int n, std::chrono::milliseconds apart = {}) {
    flips_apart_ms_ = apart.count();
    flips_back_ = n;
  }
  int flipped() const { return flipped_.load(); }
  // Bytes kept so far (all connections), and forwarded to servers so far.
  size_t kept() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const Pair& p : pairs_) n += p.kept.size();
    return n;
  }
  size_t forwarded() const { return forwarded_.load(); }

 private:
  struct Pair {
    int client = -1;
    int server = -1;
    std::string kept;  // from the client, not yet written to the server
    bool cut = false;
  };

  static void Close(Pair* p) {
    if (p->client >= 0) close(p->client);
    if (p->server >= 0) close(p->server);
    p->client = p->server = -1;
  }

  void Run() {
    while (!stop_) {
      std::vector<pollfd> fds = {{listener_, POLLIN, 0}};
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const Pair& p : pairs_) {
          // A cut pair is not polled (-1: ignored); its bytes stay in the kernel's buffers.
          fds.push_back({p.cut ? -1 : p.client, POLLIN, 0});
          fds.push_back({p.cut ? -1 : p.server, POLLIN, 0});
        }
      }
      poll(fds.data(), fds.size(), 20);
      if (fds[0].revents & POLLIN) Accept();
      std::lock_guard<std::mutex> lock(mu_);
      // Pairs polled above are the first fds.size() / 2 ones (Retarget may have cleared them).
      for (size_t i = 0; i < pairs_.size(); ++i) {
        Pair& p = pairs_[i];
        if (p.cut) continue;
        const size_t at = 1 + 2 * i;
        char buf[65536];
        if (at < fds.size() && p.client >= 0 && (fds[at].revents & (POLLIN | POLLHUP))) {
          // Not blocking: after a Retarget a polled slot may belong to a newer connection.
          const ssize_t n = recv(p.client, buf, sizeof(buf), MSG_DONTWAIT);
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            // nothing to read
          } else if (n <= 0) {
            close(p.client);
            p.client = -1;
          } else {
            p.kept.append(buf, static_cast<size_t>(n));
          }
        }
        if (at + 1 < fds.size() && p.server >= 0 && (fds[at + 1].revents & (POLLIN | POLLHUP))) {
          const ssize_t n = recv(p.server, buf, sizeof(buf), MSG_DONTWAIT);
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            // nothing to read
          } else if (n <= 0) {
            // A server that closed (or died) closes the client's side too, as its FIN or RST
            // would reach the client; what the client sent after that has nowhere to go.
            Close(&p);
            p.kept.clear();
          } else {
            if (n >= 1024 && flips_back_ > 0 && Due(&last_flip_back_)) {
              buf[n / 2] ^= 0x20;
              --flips_back_;
              ++flipped_;
            }
            if (p.client >= 0) WriteAll(p.client, buf, static_cast<size_t>(n));
          }
        }
        if (!held_ && p.server >= 0 && !p.kept.empty()) {
          if (flips_ > 0 && p.kept.size() >= 1024 && Due(&last_flip_)) {
            p.kept[p.kept.size() / 2] ^= 0x20;
            --flips_;
            ++flipped_;
          }
          const ssize_t n = send(p.server, p.kept.data(), p.kept.size(), MSG_NOSIGNAL);
          if (n > 0) {
            p.kept.erase(0, static_cast<size_t>(n));
            forwarded_ += static_cast<size_t>(n);
          }
        }
      }
    }
  }

  // Whether the next flip of a direction (its last one at *last) may happen now.
  bool Due(std::chrono::steady_clock::time_point* last) {
    const auto now = std::chrono::steady_clock::now();
    if (now - *last < std::chrono::milliseconds(flips_apart_ms_.load())) return false;
    *last = now;
    return true;
  }

  void Accept() {
    const int client = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) return;
    uint16_t target;
    {
      std::lock_guard<std::mutex> lock(mu_);
      target = targets_[std::min(static_cast<size_t>(accepted_.load()), targets_.size() - 1)];
    }
    const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(target);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ++accepted_;
    if (connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(client);
      close(server);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    pairs_.push_back(Pair{client, server, {}, false});
  }

  std::vector<uint16_t> targets_;  // under mu_
  std::string host_;
  int listener_ = -1;
  uint16_t port_ = 0;
  bool ok_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<bool> held_{false};
  std::atomic<int> accepted_{0};
  std::atomic<size_t> forwarded_{0};
  std::atomic<int> flips_{0};
  std::atomic<int> flips_back_{0};
  std::atomic<int> flipped_{0};
  std::atomic<int64_t> flips_apart_ms_{0};
  std::chrono::steady_clock::time_point last_flip_, last_flip_back_;  // the proxy thread's
  std::mutex mu_;
  std::vector<Pair> pairs_;
  std::thread thread_;
};

}  // namespace kvagent::testing

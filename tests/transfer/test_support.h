// Shared by the transfer tests: log capture, a raw TCP peer for protocol-level tests, a pool +
// engine pair, and a child-process guard that always kills and reaps.
#pragma once

#include <arpa/inet.h>
#include <glog/logging.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "kvagent/transfer/node_pool.h"
#include "kvagent/transfer/transfer_engine.h"
#include "write_all.h"

namespace kvagent::transfer::testing {

// Collects every glog line while alive.
class LogCapture : public google::LogSink {
 public:
  LogCapture() { google::AddLogSink(this); }
  ~LogCapture() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity, const char*, const char*, int, const google::LogMessageTime&,
            const char* message, size_t length) override {
    std::lock_guard<std::mutex> lock(mutex_);
    lines_.emplace_back(message, length);
  }
  // Lines that contain `needle`.
  std::vector<std::string> Matching(const std::string& needle) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    for (const auto& line : lines_) {
      if (line.find(needle) != std::string::npos) out.push_back(line);
    }
    return out;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

// A pool and an engine serving it on 127.0.0.1 with an OS-picked port.
struct Node {
  std::unique_ptr<NodePool> pool;
  std::unique_ptr<TransferEngine> engine;
};

inline Node MakeNode(uint64_t pool_bytes,
                     std::chrono::milliseconds timeout = std::chrono::seconds(10),
                     std::string listen = "127.0.0.1:0", const PoolFence* fence = nullptr) {
  Node node;
  auto pool = NodePool::Create({.size_bytes = pool_bytes, .huge_pages = false});
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  node.pool = std::move(*pool);
  TransferEngineOptions options;
  options.listen_address = std::move(listen);
  options.transport = TransportMode::kTcp;
  options.peer_timeout = timeout;
  options.fence = fence;
  auto engine = TransferEngine::Create(*node.pool, options);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  node.engine = std::move(*engine);
  return node;
}

// Deterministic pseudo-random bytes.
inline std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> bytes(n);
  std::mt19937 gen(seed);
  for (auto& b : bytes) b = static_cast<uint8_t>(gen());
  return bytes;
}

// Blocking helpers for raw-socket peers. Each waits at most `timeout_ms` per call so a broken
// server fails the test instead of hanging it.
inline bool WaitReadable(int fd, int timeout_ms = 10000) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) == 1;
}
inline bool ReadExactly(int fd, void* dst, size_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    if (!WaitReadable(fd)) return false;
    ssize_t got = recv(fd, out, n, 0);
    if (got <= 0) return false;
    out += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}
// A listening TCP socket on 127.0.0.1 with an OS-picked port (in *port), or -1.
inline int ListenOnLoopback(uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 8) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

using kvagent::testing::WriteAll;

// Owns a child process: SIGKILL + waitpid on destruction, whatever the test's outcome.
class ChildProcess {
 public:
  ChildProcess() = default;
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  ChildProcess(ChildProcess&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}
  ChildProcess& operator=(ChildProcess&& other) noexcept {
    if (this != &other) {
      Kill();
      pid_ = std::exchange(other.pid_, -1);
    }
    return *this;
  }
  ~ChildProcess() { Kill(); }
  pid_t pid() const { return pid_; }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  // Waits for the exit (the caller bounds the time by making the child bounded); returns the
  // exit status, or -1 when the child was killed by a signal.
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace kvagent::transfer::testing

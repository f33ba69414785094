// UniqueFd: the one owner of a file descriptor (ipc's sockets and segments, the data plane's
// sockets and epoll, the publisher's eventfd).
#pragma once

namespace kvagent {

// Owns a file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release();  // gives up ownership and returns the fd
  void Reset();   // closes now

 private:
  int fd_ = -1;
};

}  // namespace kvagent

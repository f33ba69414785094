// EventLoop: one thread, one epoll set, level-triggered. Handlers run on the loop thread only;
// other threads reach the loop through Post (a mutex-protected task queue plus an eventfd wake).
//
// Invariants: Add/Modify/Remove and every Handler callback happen on the loop thread (or before
// Start / after the thread has joined). A Handler must stay alive while its fd is registered;
// a handler that wants to destroy itself from inside OnEvents removes its fd and defers the
// destruction with Post.
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvagent/common/status.h"
#include "socket.h"

namespace kvagent::transfer {

class EventLoop {
 public:
  class Handler {
   public:
    virtual ~Handler() = default;
    // `events` is the epoll mask (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP, EPOLLRDHUP).
    virtual void OnEvents(uint32_t events) = 0;
  };

  // Creates the epoll set and the wake eventfd. INTERNAL with errno on failure.
  [[nodiscard]] static Result<std::unique_ptr<EventLoop>> Create(std::string name);

  // Stops the thread if it is still running (see Stop).
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Starts the thread. After every wake-up the loop calls `tick` (if set), which returns how
  // many milliseconds the loop may sleep next (-1: until an event or a Post).
  void Start(std::function<int()> tick);

  // Runs every task posted so far, then ends the thread and joins it. Tasks posted after Stop
  // returns are run by the destructor's caller thread never: do not post after Stop.
  void Stop();

  // Thread-safe: queues `task` to run on the loop thread, in posting order.
  void Post(std::function<void()> task);

  // Loop thread only.
  [[nodiscard]] Status Add(int fd, uint32_t events, Handler* handler);
  [[nodiscard]] Status Modify(int fd, uint32_t events, Handler* handler);
  void Remove(int fd);

 private:
  explicit EventLoop(std::string name, UniqueFd epoll, UniqueFd wake);
  Status Control(int op, int fd, uint32_t events, Handler* handler);
  void Run();
  void RunPosted();

  std::string name_;
  UniqueFd epoll_;
  UniqueFd wake_;  // eventfd; its handler is nullptr in the epoll set
  std::function<int()> tick_;
  std::thread thread_;

  std::mutex mutex_;  // guards posted_ and stopping_
  std::vector<std::function<void()>> posted_;
  bool stopping_ = false;
};

}  // namespace kvagent::transfer

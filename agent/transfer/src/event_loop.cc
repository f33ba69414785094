#include "event_loop.h"
#include "kvagent/common/errno_text.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvagent::transfer {

Result<std::unique_ptr<EventLoop>> EventLoop::Create(std::string name) {
  UniqueFd epoll(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return Internal(std::string("epoll_create1 failed: ") + ErrnoText(errno));
  UniqueFd wake(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) return Internal(std::string("eventfd failed: ") + ErrnoText(errno));
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.ptr = nullptr;
  if (epoll_ctl(epoll.get(), EPOLL_CTL_ADD, wake.get(), &event) != 0) {
    return Internal(std::string("epoll_ctl(eventfd) failed: ") + ErrnoText(errno));
  }
  return std::unique_ptr<EventLoop>(
      new EventLoop(std::move(name), std::move(epoll), std::move(wake)));
}

EventLoop::EventLoop(std::string name, UniqueFd epoll, UniqueFd wake)
    : name_(std::move(name)), epoll_(std::move(epoll)), wake_(std::move(wake)) {}

EventLoop::~EventLoop() { Stop(); }

void EventLoop::Start(std::function<int()> tick) {
  tick_ = std::move(tick);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
    Run();
  });
}

void EventLoop::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_.get(), &one, sizeof(one));
  thread_.join();
}

void EventLoop::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    posted_.push_back(std::move(task));
  }
  uint64_t one = 1;
  // The eventfd counter only saturates after 2^64-2 wakes; EAGAIN cannot happen in practice and
  // a pending wake is enough either way.
  [[maybe_unused]] ssize_t n = write(wake_.get(), &one, sizeof(one));
}

Status EventLoop::Add(int fd, uint32_t events, Handler* handler) {
  return Control(EPOLL_CTL_ADD, fd, events, handler);
}

Status EventLoop::Modify(int fd, uint32_t events, Handler* handler) {
  return Control(EPOLL_CTL_MOD, fd, events, handler);
}

Status EventLoop::Control(int op, int fd, uint32_t events, Handler* handler) {
  epoll_event event{};
  event.events = events;
  event.data.ptr = handler;
  if (epoll_ctl(epoll_.get(), op, fd, &event) != 0) {
    return Internal(std::string("epoll_ctl(") + (op == EPOLL_CTL_ADD ? "ADD" : "MOD") +
                    ") failed: " + ErrnoText(errno));
  }
  return Status::Ok();
}

void EventLoop::Remove(int fd) { epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }

void EventLoop::RunPosted() {
  // Tasks may post more tasks; run until the queue is empty so Stop's "everything posted so far
  // has run" holds.
  for (;;) {
    std::vector<std::function<void()>> tasks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks.swap(posted_);
    }
    if (tasks.empty()) return;
    for (auto& task : tasks) task();
  }
}

void EventLoop::Run() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  int timeout_ms = -1;
  for (;;) {
    const int n = epoll_wait(epoll_.get(), events, kMaxEvents, timeout_ms);
    bool woken = false;
    for (int i = 0; i < n; ++i) {
      auto* handler = static_cast<Handler*>(events[i].data.ptr);
      if (handler == nullptr) {
        woken = true;
        continue;
      }
      handler->OnEvents(events[i].events);
    }
    if (woken) {
      uint64_t count = 0;
      [[maybe_unused]] ssize_t r = read(wake_.get(), &count, sizeof(count));
    }
    RunPosted();
    timeout_ms = tick_ ? tick_() : -1;
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping = stopping_;
    }
    if (stopping) {
      RunPosted();
      return;
    }
  }
}

}  // namespace kvagent::transfer

#include "kvagent/common/metrics_http.h"

#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <list>
#include <thread>

#include "http_request_head.h"
#include "kvagent/common/errno_text.h"
#include "kvagent/common/host_port.h"
#include "kvagent/common/unique_fd.h"

namespace kvagent::metrics {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

// HOST:PORT, "[V6]:PORT" (or V6:PORT, the port after the last colon), port 0 for any free one.
Result<HostPort> ParseListen(const std::string& listen, const std::string& what) {
  HostPortRules rules;
  rules.port_zero = true;
  rules.unbracketed_ipv6 = true;
  auto parsed = ParseHostPort(listen, what, rules);
  if (!parsed.ok()) {
    return InvalidParams(parsed.status().message() +
                         " (e.g. 127.0.0.1:9478, or 0.0.0.0:9478 for every interface)");
  }
  return parsed;
}

std::string Answer(int code, const char* reason, const char* content_type, size_t length,
                   const char* extra_header = "") {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(length) + "\r\n" + extra_header +
         "Connection: close\r\n\r\n";
}

std::string ErrorAnswer(int code, const char* reason, const std::string& text,
                        const char* extra_header = "") {
  return Answer(code, reason, "text/plain; charset=utf-8", text.size(), extra_header) + text;
}

struct Connection {
  enum class Phase {
    kRequest,  // reading the request head
    kAnswer,   // sending the answer
    kDrain,    // answer sent and the write side shut: reading until the client closes, so that
               // closing with its unread bytes (a body, pipelined requests) sends no RST that
               // could discard the answer before the client read it
  };
  UniqueFd fd;
  Phase phase = Phase::kRequest;
  Clock::time_point accepted;
  Clock::time_point deadline;
  std::string received;
  size_t searched = 0;  // how far FindRequestHeadEnd looked
  std::string answer;
  size_t sent = 0;
  bool closed = false;  // closed during this turn of the loop; erased at its end
};

}  // namespace

Status CheckListenAddress(const std::string& listen, const std::string& flag) {
  return ParseListen(listen, flag + ":").status();
}

struct MetricsHttpServer::Impl {
  RenderFn render;
  MetricsHttpLimits limits;
  UniqueFd listener;
  UniqueFd epoll;
  UniqueFd stop;  // an eventfd: written once by the destructor
  std::list<Connection> connections;
  Clock::time_point listener_paused_until{};
  bool listener_watched = true;
  std::thread thread;

  // Tags for the epoll entries that are not connections.
  static inline char listener_tag = 0;
  static inline char stop_tag = 0;

  void Run() {
    pthread_setname_np(pthread_self(), "metrics-http");
    std::array<epoll_event, 64> events;
    for (;;) {
      const int n = epoll_wait(epoll.get(), events.data(), static_cast<int>(events.size()),
                               WaitMs(Clock::now()));
      if (n < 0 && errno != EINTR) return;  // cannot happen with a valid epoll fd
      for (int i = 0; i < n; ++i) {
        void* tag = events[i].data.ptr;
        if (tag == &stop_tag) return;
        if (tag == &listener_tag) {
          AcceptAll();
          continue;
        }
        auto* c = static_cast<Connection*>(tag);
        if (!c->closed) Serve(c, events[i].events);
      }
      const auto now = Clock::now();
      for (Connection& c : connections) {
        if (!c.closed && now >= c.deadline) Close(&c);
      }
      connections.remove_if([](const Connection& c) { return c.closed; });
      if (!listener_watched && now >= listener_paused_until) WatchListener(true);
    }
  }

  // Until the nearest deadline (or the listener's pause), -1 when nothing is due.
  int WaitMs(Clock::time_point now) const {
    Clock::time_point next = Clock::time_point::max();
    for (const Connection& c : connections) next = std::min(next, c.deadline);
    if (!listener_watched) next = std::min(next, listener_paused_until);
    if (next == Clock::time_point::max()) return -1;
    if (next <= now) return 0;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
    return static_cast<int>(std::min<int64_t>(ms, 60'000));
  }

  void WatchListener(bool on) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &listener_tag;
    epoll_ctl(epoll.get(), on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, listener.get(), &ev);
    listener_watched = on;
  }

  void AcceptAll() {
    for (;;) {
      const int fd = accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          // Out of descriptors or memory: the pending connection stays queued, and a level-
          // triggered listener would wake this loop at once, again and again. Look back later.
          WatchListener(false);
          listener_paused_until = Clock::now() + std::chrono::milliseconds(100);
        }
        return;
      }
      if (Open() >= limits.max_connections) CloseOldest();
      Connection& c = connections.emplace_back();
      c.fd = UniqueFd(fd);
      c.accepted = Clock::now();
      c.deadline = c.accepted + limits.request_timeout;
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.ptr = &c;
      if (epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &ev) != 0) Close(&c);
    }
  }

  size_t Open() const {
    return static_cast<size_t>(std::count_if(connections.begin(), connections.end(),
                                             [](const Connection& c) { return !c.closed; }));
  }

  // Makes room: the oldest connection still sending its request, else the oldest of all.
  void CloseOldest() {
    Connection* oldest = nullptr;
    for (Connection& c : connections) {
      if (c.closed) continue;
      if (c.phase == Connection::Phase::kRequest) {
        oldest = &c;
        break;
      }
      if (oldest == nullptr) oldest = &c;
    }
    if (oldest != nullptr) Close(oldest);
  }

  static void Close(Connection* c) {
    c->fd.Reset();  // also leaves the epoll set
    c->closed = true;
  }

  void Serve(Connection* c, uint32_t events) {
    switch (c->phase) {
      case Connection::Phase::kRequest:
        ReadRequest(c);
        break;
      case Connection::Phase::kAnswer:
        if (events & (EPOLLERR | EPOLLHUP)) return Close(c);
        SendAnswer(c);
        break;
      case Connection::Phase::kDrain:
        Drain(c);
        break;
    }
  }

  void ReadRequest(Connection* c) {
    const size_t cap = limits.max_request_head_bytes;
    char buffer[4096];
    const size_t room = std::min(sizeof(buffer), cap - c->received.size());
    const ssize_t got = recv(c->fd.get(), buffer, room, 0);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (got <= 0) return Close(c);  // gone before its request was complete
    c->received.append(buffer, static_cast<size_t>(got));
    const size_t end = FindRequestHeadEnd(c->received, c->searched);
    c->searched = c->received.size();
    if (end != std::string::npos) {
      c->received.resize(end);
      return Respond(c, AnswerTo(c->received));
    }
    if (c->received.size() >= cap) {
      Respond(c, ErrorAnswer(431, "Request Header Fields Too Large",
                             "the request head is over " + std::to_string(cap) + " bytes\n"));
    }
  }

  std::string AnswerTo(std::string_view head) const {
    RequestHead request;
    if (ParseRequestHead(head, &request) != HeadShape::kRequest) {
      return ErrorAnswer(400, "Bad Request", "malformed HTTP/1.x request\n");
    }
    const bool get = request.method == "GET";
    if (!get && request.method != "HEAD") {
      return ErrorAnswer(405, "Method Not Allowed", "only GET /metrics is served\n",
                         "Allow: GET, HEAD\r\n");
    }
    if (request.path != "/metrics") {
      return ErrorAnswer(404, "Not Found", "only GET /metrics is served\n");
    }
    const std::string body = render();
    std::string answer = Answer(200, "OK", kContentType, body.size());
    if (get) answer += body;
    return answer;
  }

  void Respond(Connection* c, std::string answer) {
    c->answer = std::move(answer);
    c->received = std::string();
    c->phase = Connection::Phase::kAnswer;
    c->deadline = Clock::now() + limits.request_timeout;
    SendAnswer(c);
  }

  void SendAnswer(Connection* c) {
    while (c->sent < c->answer.size()) {
      const ssize_t n =
          send(c->fd.get(), c->answer.data() + c->sent, c->answer.size() - c->sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Watch(c, EPOLLOUT);
      if (n <= 0) return Close(c);
      c->sent += static_cast<size_t>(n);
    }
    c->answer = std::string();
    shutdown(c->fd.get(), SHUT_WR);
    c->phase = Connection::Phase::kDrain;
    Watch(c, EPOLLIN | EPOLLRDHUP);
  }

  void Watch(Connection* c, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = c;
    if (epoll_ctl(epoll.get(), EPOLL_CTL_MOD, c->fd.get(), &ev) != 0) Close(c);
  }

  static void Drain(Connection* c) {
    char discard[4096];
    const ssize_t n = recv(c->fd.get(), discard, sizeof(discard), 0);
    if (n > 0) return;  // more to discard (a client that keeps sending is cut off at the deadline)
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    Close(c);  // the client closed (or reset): nothing more to wait for
  }
};

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsHttpServer::~MetricsHttpServer() {
  if (!impl_ || !impl_->thread.joinable()) return;
  const uint64_t one = 1;
  while (write(impl_->stop.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  impl_->thread.join();
}

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, RenderFn render, const MetricsHttpLimits& limits) {
  auto address = ParseListen(listen, "metrics listen address");
  if (!address.ok()) return address.status();
  auto cannot = [&](const std::string& why) {
    return Status(ErrorCode::kInternal,
                  "cannot serve metrics on " + listen + ": " + why + "; pick a free HOST:PORT");
  };
  auto addresses = ResolveHostPort(*address, /*passive=*/true);
  if (!addresses.ok()) return cannot(addresses.status().message());

  auto impl = std::make_unique<Impl>();
  impl->render = std::move(render);
  impl->limits = limits;
  impl->limits.max_connections = std::max<size_t>(limits.max_connections, 1);
  impl->limits.max_request_head_bytes = std::max<size_t>(limits.max_request_head_bytes, 64);
  const addrinfo* a = addresses->get();
  impl->listener = UniqueFd(socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!impl->listener.valid()) return cannot(ErrnoText(errno));
  const int on = 1;
  setsockopt(impl->listener.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (bind(impl->listener.get(), a->ai_addr, a->ai_addrlen) != 0 ||
      ::listen(impl->listener.get(), 64) != 0) {
    return cannot(ErrnoText(errno));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  getsockname(impl->listener.get(), reinterpret_cast<sockaddr*>(&bound), &bound_len);
  const int port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);

  impl->epoll = UniqueFd(epoll_create1(EPOLL_CLOEXEC));
  impl->stop = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->epoll.valid() || !impl->stop.valid()) return cannot(ErrnoText(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &Impl::stop_tag;
  if (epoll_ctl(impl->epoll.get(), EPOLL_CTL_ADD, impl->stop.get(), &ev) != 0) {
    return cannot(ErrnoText(errno));
  }
  impl->WatchListener(true);
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(std::move(impl)));
  server->port_ = port;
  server->url_ = "http://" + JoinHostPort(address->host, static_cast<uint16_t>(port)) + "/metrics";
  return server;
}

}  // namespace kvagent::metrics

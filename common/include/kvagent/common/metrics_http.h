// MetricsHttpServer: serves GET /metrics (Prometheus text format 0.0.4) on one HOST:PORT.
//
// One thread serves every connection from an epoll loop, so a client that connects and sends
// nothing, or sends its request a byte at a time, or never reads its answer, holds one of
// `max_connections` slots and not the server: a scrape arriving meanwhile is answered at once.
// When every slot is taken, a new connection closes the oldest one still sending its request
// (a scraper sends its request in one packet and is answered in the same turn of the loop).
// Each connection has `request_timeout` to send its request head, and again to take its answer.
//
// The thread only calls `render`, which must be safe on any thread: it reads counters that the
// working threads keep (metrics.h), so a scrape never waits for, or adds work to, a request path.
// GET and HEAD of /metrics (with any query) answer 200; any other path 404; any other method 405;
// a malformed request 400; a request head over `max_request_head_bytes` 431. Every answer closes
// the connection (`Connection: close`).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "kvagent/common/status.h"

namespace kvagent::metrics {

struct MetricsHttpLimits {
  size_t max_connections = 64;
  std::chrono::milliseconds request_timeout{5000};
  size_t max_request_head_bytes = 8192;
};

class MetricsHttpServer {
 public:
  using RenderFn = std::function<std::string()>;

  // Listens on `listen` ("HOST:PORT", "[V6]:PORT"; port 0: any free one). INVALID_PARAMS for a
  // malformed address, INTERNAL naming the address when it cannot be bound (in use, not local).
  static Result<std::unique_ptr<MetricsHttpServer>> Start(const std::string& listen,
                                                          RenderFn render,
                                                          const MetricsHttpLimits& limits = {});
  ~MetricsHttpServer();  // stops serving, closes every connection and joins the thread
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // "http://HOST:PORT/metrics" with the bound port.
  const std::string& url() const { return url_; }
  int port() const { return port_; }

 private:
  struct Impl;
  explicit MetricsHttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string url_;
  int port_ = 0;
};

// Checks a --metrics-listen value: "HOST:PORT" with a port in 0..65535 ("[::1]:PORT" for IPv6;
// host_port.h). INVALID_PARAMS "<flag>: '<listen>' is not HOST:PORT: <the defect> (e.g. ...)".
Status CheckListenAddress(const std::string& listen, const std::string& flag);

}  // namespace kvagent::metrics

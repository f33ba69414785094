// MetricsHttpServer: serves GET /metrics (Prometheus text format 0.0.4) on one HOST:PORT, with
// the CivetWeb embedded HTTP server (Debian's libcivetweb: the HTTP parsing is CivetWeb's).
//
// Its threads only call `render`, which must be safe on any thread: it reads counters that the
// working threads keep (metrics.h), so a scrape never waits for, or adds work to, a request path.
// Any other path answers 404; any other method 405.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kvagent/common/status.h"

namespace kvagent::metrics {

class MetricsHttpServer {
 public:
  using RenderFn = std::function<std::string()>;

  // Listens on `listen` ("HOST:PORT", port 0: any free one). INVALID_PARAMS for a malformed
  // address, INTERNAL naming the address when it cannot be bound (in use, not local).
  static Result<std::unique_ptr<MetricsHttpServer>> Start(const std::string& listen,
                                                          RenderFn render);
  ~MetricsHttpServer();  // stops serving and joins the server's threads
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

// Checks a --metrics-listen value: "HOST:PORT" with a port in 0..65535 ("[::1]:PORT" for IPv6).
Status CheckListenAddress(const std::string& listen, const std::string& flag);

}  // namespace kvagent::metrics

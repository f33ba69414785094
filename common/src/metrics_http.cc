#include "kvagent/common/metrics_http.h"

#include <civetweb.h>

#include <charconv>
#include <cstring>
#include <mutex>

namespace kvagent::metrics {
namespace {

constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

// Splits "HOST:PORT" / "[V6]:PORT"; false when malformed.
bool SplitHostPort(const std::string& listen, std::string* host, int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) return false;
  *host = listen.substr(0, colon);
  if (host->front() == '[' && host->back() != ']') return false;
  const char* first = listen.data() + colon + 1;
  const char* last = listen.data() + listen.size();
  auto [ptr, ec] = std::from_chars(first, last, *port);
  return ec == std::errc() && ptr == last && *port >= 0 && *port <= 65535;
}

}  // namespace

Status CheckListenAddress(const std::string& listen, const std::string& flag) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(listen, &host, &port)) {
    return InvalidParams(flag + ": '" + listen +
                         "' is not HOST:PORT (e.g. 127.0.0.1:9478, or 0.0.0.0:9478 for every "
                         "interface)");
  }
  return Status::Ok();
}

struct MetricsHttpServer::Impl {
  RenderFn render;
  mg_context* ctx = nullptr;

  static int Handle(mg_connection* conn, void* data) {
    auto* self = static_cast<Impl*>(data);
    const mg_request_info* info = mg_get_request_info(conn);
    const bool head = std::strcmp(info->request_method, "HEAD") == 0;
    if (!head && std::strcmp(info->request_method, "GET") != 0) {
      mg_send_http_error(conn, 405, "only GET /metrics is served\n");
      return 405;
    }
    const std::string body = self->render();
    mg_send_http_ok(conn, kContentType, static_cast<long long>(body.size()));
    if (!head) mg_write(conn, body.data(), body.size());
    return 200;
  }
};

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsHttpServer::~MetricsHttpServer() {
  if (impl_ && impl_->ctx) mg_stop(impl_->ctx);
}

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& listen,
                                                                    RenderFn render) {
  std::string host;
  int requested_port = 0;
  if (!SplitHostPort(listen, &host, &requested_port)) {
    return CheckListenAddress(listen, "metrics listen address");
  }
  static std::once_flag init_once;
  std::call_once(init_once, [] { mg_init_library(0); });

  auto impl = std::make_unique<Impl>();
  impl->render = std::move(render);
  // One worker thread is plenty for a scraper every few seconds; a slow client is cut off.
  const char* options[] = {
      "listening_ports",          listen.c_str(), "num_threads", "1", "request_timeout_ms", "10000",
      "enable_directory_listing", "no",           nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  // CivetWeb logs to stderr unless told otherwise; its errors come back through mg_start2.
  callbacks.log_message = [](const mg_connection*, const char*) { return 1; };
  mg_init_data init{&callbacks, impl.get(), options};
  char text[256] = {};
  unsigned code = 0;
  mg_error_data error{&code, text, sizeof(text)};
  impl->ctx = mg_start2(&init, &error);
  if (impl->ctx == nullptr) {
    return Status(ErrorCode::kInternal, "cannot serve metrics on " + listen + ": " +
                                            (text[0] ? std::string(text) : "mg_start failed") +
                                            "; pick a free HOST:PORT");
  }
  mg_set_request_handler(impl->ctx, "/metrics$", &Impl::Handle, impl.get());
  mg_server_port ports[4];
  std::memset(ports, 0, sizeof(ports));
  const int n = mg_get_server_ports(impl->ctx, 4, ports);
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(std::move(impl)));
  server->port_ = n > 0 ? ports[0].port : requested_port;
  server->url_ = "http://" + host + ":" + std::to_string(server->port_) + "/metrics";
  return server;
}

}  // namespace kvagent::metrics

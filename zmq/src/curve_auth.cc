#include "kvagent/zmq/curve_auth.h"
#include "kvagent/common/thread_start.h"

#include <glog/logging.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <string_view>
#include <thread>

namespace kvagent {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr std::string_view kZapDomain = "kvagent";

Status SetOption(void* socket, int option, const void* value, size_t size, const char* what) {
  if (zmq_setsockopt(socket, option, value, size) == 0) return Status::Ok();
  return Internal(std::string("cannot set ") + what + ": " + zmq_strerror(zmq_errno()));
}

Status CheckCurveAvailable() {
  if (zmq_has("curve")) return Status::Ok();
  return Internal(
      "this libzmq has no CURVE security; install a libzmq built with libsodium (Debian's is)");
}

}  // namespace

Status MakeCurveServer(void* socket, const CurvePlaneKeys& keys) {
  KVAGENT_RETURN_IF_ERROR(CheckCurveAvailable());
  const int one = 1;
  KVAGENT_RETURN_IF_ERROR(
      SetOption(socket, ZMQ_ZAP_DOMAIN, kZapDomain.data(), kZapDomain.size(), "ZMQ_ZAP_DOMAIN"));
  KVAGENT_RETURN_IF_ERROR(SetOption(socket, ZMQ_CURVE_SERVER, &one, sizeof one, "CURVE_SERVER"));
  return SetOption(socket, ZMQ_CURVE_SECRETKEY, keys.server.secret_key.data(),
                   keys.server.secret_key.size(), "CURVE_SECRETKEY");
}

Status MakeCurveClient(void* socket, const CurvePlaneKeys& keys) {
  KVAGENT_RETURN_IF_ERROR(CheckCurveAvailable());
  KVAGENT_RETURN_IF_ERROR(SetOption(socket, ZMQ_CURVE_SERVERKEY, keys.server.public_key.data(),
                                    keys.server.public_key.size(), "CURVE_SERVERKEY"));
  KVAGENT_RETURN_IF_ERROR(SetOption(socket, ZMQ_CURVE_PUBLICKEY, keys.client.public_key.data(),
                                    keys.client.public_key.size(), "CURVE_PUBLICKEY"));
  return SetOption(socket, ZMQ_CURVE_SECRETKEY, keys.client.secret_key.data(),
                   keys.client.secret_key.size(), "CURVE_SECRETKEY");
}

// One thread owns the REP socket (docs/architecture.md: one thread per ZMQ socket). It polls with a
// short timeout so that a stop request is seen without a second socket.
class ZapHandler::Thread {
 public:
  Thread(void* context, std::vector<PublicKey> allowed, ZapHandler* owner)
      : context_(context), allowed_(std::move(allowed)), owner_(owner) {}

  ~Thread() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
  }

  Status Start() {
    return StartThreadAndWait(&thread_, [this](std::promise<Status>* bound) { Run(bound); });
  }

 private:
  void Run(std::promise<Status>* bound) {
    void* socket = zmq_socket(context_, ZMQ_REP);
    if (socket == nullptr) {
      bound->set_value(Internal(std::string("ZAP handler: cannot create its socket: ") +
                                zmq_strerror(zmq_errno())));
      return;
    }
    const int zero = 0;
    zmq_setsockopt(socket, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(socket, kZapEndpoint) != 0) {
      const std::string why = zmq_strerror(zmq_errno());
      zmq_close(socket);
      bound->set_value(Internal("ZAP handler: cannot bind " + std::string(kZapEndpoint) + ": " +
                                why + " (another handler in this context?)"));
      return;
    }
    bound->set_value(Status::Ok());
    while (!stop_.load(std::memory_order_relaxed)) {
      zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 100) <= 0) continue;
      Serve(socket);
    }
    zmq_close(socket);
  }

  // One request: [version, request_id, domain, address, identity, mechanism, credentials...].
  void Serve(void* socket) {
    std::vector<std::string> frames;
    int more = 1;
    while (more != 0 && frames.size() < 16) {
      zmq_msg_t part;
      zmq_msg_init(&part);
      if (zmq_msg_recv(&part, socket, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&part);
        return;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&part)), zmq_msg_size(&part));
      more = zmq_msg_more(&part);
      zmq_msg_close(&part);
    }
    while (more != 0) {  // a malformed request: drain the rest before answering
      zmq_msg_t part;
      zmq_msg_init(&part);
      const int rc = zmq_msg_recv(&part, socket, ZMQ_DONTWAIT);
      more = rc >= 0 ? zmq_msg_more(&part) : 0;
      zmq_msg_close(&part);
    }
    const bool well_formed = frames.size() >= 6 && frames[0] == "1.0";
    bool allowed = false;
    if (well_formed && frames[5] == "CURVE" && frames.size() == 7 && frames[6].size() == 32) {
      const auto* key = reinterpret_cast<const uint8_t*>(frames[6].data());
      for (const PublicKey& k : allowed_) {
        allowed |= ConstantTimeEqual(k, std::span<const uint8_t>(key, 32));
      }
    }
    if (allowed) {
      owner_->accepted_.fetch_add(1, std::memory_order_relaxed);
    } else {
      owner_->refused_.fetch_add(1, std::memory_order_relaxed);
      LOG_EVERY_N(WARNING, 100)
          << "refused a connection from " << (frames.size() > 3 ? frames[3] : "?")
          << ": it does not hold this cluster's secret (check --cluster-secret-file and the "
             "fingerprints of both ends: kvctl secret fingerprint FILE)";
    }
    const std::string request_id = frames.size() > 1 ? frames[1] : "";
    const std::string reply[] = {"1.0",
                                 request_id,
                                 allowed ? "200" : "400",
                                 allowed ? "OK" : "not a member of this cluster",
                                 allowed ? "member" : "",
                                 ""};
    for (size_t i = 0; i < 6; ++i) {
      zmq_send(socket, reply[i].data(), reply[i].size(), i + 1 < 6 ? ZMQ_SNDMORE : 0);
    }
  }

  void* context_;
  const std::vector<PublicKey> allowed_;
  ZapHandler* owner_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Result<std::unique_ptr<ZapHandler>> ZapHandler::Start(void* context,
                                                      std::vector<PublicKey> allowed) {
  std::unique_ptr<ZapHandler> handler(new ZapHandler());
  handler->thread_ = std::make_unique<Thread>(context, std::move(allowed), handler.get());
  KVAGENT_RETURN_IF_ERROR(handler->thread_->Start());
  return handler;
}

ZapHandler::~ZapHandler() { thread_.reset(); }

Result<CurveServer> StartCurveServer(void* context, const CurvePlaneKeys& keys) {
  KVAGENT_RETURN_IF_ERROR(CheckCurveAvailable());
  auto zap = ZapHandler::Start(context, {keys.client.public_key});
  if (!zap.ok()) return zap.status();
  return CurveServer{keys, std::move(*zap)};
}

}  // namespace kvagent

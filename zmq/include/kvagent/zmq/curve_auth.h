// CurveZMQ for the cluster's ZMQ sockets, with keys derived from the cluster secret
// (cluster_secret.h): every member holds every plane's key pairs, so a server proves it is a
// member by completing the handshake with its secret key, and a client by presenting the
// plane's client public key, which the server's ZAP handler checks. Traffic on these sockets is
// then encrypted and authenticated (CurveZMQ: X25519 + XSalsa20-Poly1305 per message).
//
// Functions take libzmq's raw handles (zmq::socket_t::handle(), zmq::context_t::handle()) so
// that this header speaks std types only.
//
// A ZMQ server socket with CURVE but no ZAP handler in its context accepts any client that
// knows the server's public key, and a public key is public: every context with a CURVE server
// socket needs its ZapHandler, started before the socket binds and destroyed before the
// context.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/status.h"

namespace kvagent {

// Makes `socket` (before bind) a CURVE server presenting `keys.server`. Also sets the ZAP
// domain "kvagent". INTERNAL when libzmq lacks CURVE (it is built with libsodium on Debian).
Status MakeCurveServer(void* socket, const CurvePlaneKeys& keys);
// Makes `socket` (before connect) a CURVE client presenting `keys.client`, accepting only a
// server that holds `keys.server`.
Status MakeCurveClient(void* socket, const CurvePlaneKeys& keys);

// The ZAP handler (RFC 27) of one ZMQ context: a thread with a REP socket bound to
// inproc://zeromq.zap.01 that lets in CURVE clients presenting one of the allowed public keys
// and refuses everyone else (other mechanisms included).
class ZapHandler {
 public:
  using PublicKey = std::array<uint8_t, 32>;

  // Binds the handler in `context` and starts its thread. Fails when another handler is bound
  // in that context.
  static Result<std::unique_ptr<ZapHandler>> Start(void* context, std::vector<PublicKey> allowed);
  // Stops the thread and closes its socket (do this before the context terminates).
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  uint64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  class Thread;
  ZapHandler() = default;
  std::unique_ptr<Thread> thread_;
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> refused_{0};
};

// The CURVE setup of a server socket: the keys, and the handler for its context.
struct CurveServer {
  CurvePlaneKeys keys;
  std::unique_ptr<ZapHandler> zap;
};

// Starts the ZAP handler in `context` for clients of `keys` and returns both; then call
// MakeCurveServer on each server socket of that context.
Result<CurveServer> StartCurveServer(void* context, const CurvePlaneKeys& keys);

}  // namespace kvagent

#include "kvagent/zmq/curve_auth.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <string>
#include <zmq.hpp>

namespace kvagent {
namespace {

CurvePlaneKeys KeysOf(std::string_view secret_text, KeyPlane plane = KeyPlane::kMasterRpc) {
  Result<ClusterSecret> secret = ClusterSecret::FromBytes(secret_text);
  EXPECT_TRUE(secret.ok());
  return secret->CurveKeys(plane);
}

constexpr std::string_view kOurs = "our cluster's secret, at least thirty-two bytes";
constexpr std::string_view kTheirs = "another cluster's secret, also thirty-two bytes+";

// A CURVE ROUTER (with its ZAP handler) in its own context, echoing what it receives.
class Server {
 public:
  explicit Server(const CurvePlaneKeys& keys) : router_(context_, zmq::socket_type::router) {
    auto curve = StartCurveServer(context_.handle(), keys);
    EXPECT_TRUE(curve.ok()) << curve.status().ToString();
    if (curve.ok()) zap_ = std::move(curve->zap);
    EXPECT_TRUE(MakeCurveServer(router_.handle(), keys).ok());
    router_.set(zmq::sockopt::linger, 0);
    router_.bind("tcp://127.0.0.1:0");
    endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  }
  ~Server() {
    router_.close();
    zap_.reset();
  }
  // Echoes one message if one arrives within `ms`; true when it did.
  bool EchoOne(int ms) {
    zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(ms)) <= 0) return false;
    zmq::message_t id, body;
    (void)router_.recv(id);
    (void)router_.recv(body);
    router_.send(id, zmq::send_flags::sndmore);
    router_.send(body, zmq::send_flags::none);
    return true;
  }
  const std::string& endpoint() const { return endpoint_; }
  const ZapHandler& zap() const { return *zap_; }

 private:
  zmq::context_t context_{1};
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t router_;
  std::string endpoint_;
};

// Sends "ping" from a DEALER (CURVE client of `keys` when given) and waits for the echo.
bool RoundTrip(Server& server, const CurvePlaneKeys* keys) {
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  if (keys != nullptr) {
    EXPECT_TRUE(MakeCurveClient(dealer.handle(), *keys).ok());
  }
  dealer.connect(server.endpoint());
  dealer.send(zmq::str_buffer("ping"), zmq::send_flags::none);
  if (!server.EchoOne(1000)) return false;
  zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, std::chrono::milliseconds(2000)) <= 0) return false;
  zmq::message_t echo;
  (void)dealer.recv(echo);
  return echo.to_string() == "ping";
}

TEST(CurveAuth, AMemberOfTheClusterGetsThrough) {
  const CurvePlaneKeys ours = KeysOf(kOurs);
  Server server(ours);
  EXPECT_TRUE(RoundTrip(server, &ours));
  EXPECT_GE(server.zap().accepted(), 1u);
}

TEST(CurveAuth, AClientWithAnotherSecretOrNoneOrAnotherPlanesKeysIsRefused) {
  const CurvePlaneKeys ours = KeysOf(kOurs);
  Server server(ours);
  // Knows our server's public key (it is public) but not our client key: the ZAP handler
  // refuses it.
  CurvePlaneKeys impostor = KeysOf(kTheirs);
  impostor.server.public_key = ours.server.public_key;
  EXPECT_FALSE(RoundTrip(server, &impostor));
  EXPECT_GE(server.zap().refused(), 1u);
  const CurvePlaneKeys theirs = KeysOf(kTheirs);
  EXPECT_FALSE(RoundTrip(server, &theirs));  // pins another server key: the handshake fails
  EXPECT_FALSE(RoundTrip(server, nullptr));  // no CURVE at all
  const CurvePlaneKeys events = KeysOf(kOurs, KeyPlane::kEvents);
  CurvePlaneKeys wrong_plane = events;
  wrong_plane.server.public_key = ours.server.public_key;
  EXPECT_FALSE(RoundTrip(server, &wrong_plane));
  EXPECT_TRUE(RoundTrip(server, &ours));  // and members still get through
}

// The derived key pairs are CurveZMQ pairs as libzmq computes them: the public key of each is
// the one libzmq derives from its secret key (keys travel in binary; Z85 is libzmq's text form).
TEST(CurveAuth, DerivedPublicKeyBelongsToItsSecretKeyForLibzmq) {
  const auto z85 = [](const std::array<uint8_t, 32>& key) {
    char text[41] = {};
    EXPECT_NE(zmq_z85_encode(text, key.data(), key.size()), nullptr);
    return std::string(text);
  };
  for (KeyPlane plane : {KeyPlane::kMasterRpc, KeyPlane::kEvents}) {
    const CurvePlaneKeys keys = KeysOf(kOurs, plane);
    for (const CurveKeyPair* pair : {&keys.server, &keys.client}) {
      const std::string public_z85 = z85(pair->public_key);
      ASSERT_EQ(public_z85.size(), 40u);
      char computed[41] = {};
      ASSERT_EQ(zmq_curve_public(computed, z85(pair->secret_key).c_str()), 0);
      EXPECT_EQ(std::string(computed), public_z85) << KeyPlaneName(plane);
    }
  }
}

}  // namespace
}  // namespace kvagent

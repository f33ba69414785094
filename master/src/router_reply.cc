#include "kvagent/master/router_reply.h"

namespace kvagent::master {

void SendRouterReply(zmq::socket_t& router, const zmq::message_t& identity,
                     std::span<const uint8_t> reply, std::string_view detached,
                     const std::shared_ptr<const void>& owner) {
  router.send(zmq::buffer(identity.data(), identity.size()), zmq::send_flags::sndmore);
  router.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  if (detached.empty()) {
    router.send(zmq::buffer(reply.data(), reply.size()), zmq::send_flags::none);
    return;
  }
  // Freed by whichever thread drops the message last (ZMQ's I/O thread once it is sent, or this
  // one if the peer's queue refuses it): the owner's count is atomic.
  auto* keep = new std::shared_ptr<const void>(owner);
  zmq::message_t records(
      const_cast<char*>(detached.data()), detached.size(),
      [](void*, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }, keep);
  router.send(zmq::buffer(reply.data(), reply.size()), zmq::send_flags::sndmore);
  router.send(records, zmq::send_flags::none);
}

}  // namespace kvagent::master

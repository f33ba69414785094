// How kvmaster answers a ROUTER peer (its server; master_bench times it): [identity, "", reply],
// and, for a Replicate whose records are detached (MasterRpc::LastRequest::detached), the records
// as one more part, sent from where they lie (a built snapshot's mapping) without a copy. Their
// owner is held until ZMQ's I/O thread is done with them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <zmq.hpp>

namespace kvagent::master {

// Sends one reply to the ROUTER peer `identity`; `detached` (with `owner`, what keeps it valid)
// as a part of its own after it when not empty.
void SendRouterReply(zmq::socket_t& router, const zmq::message_t& identity,
                     std::span<const uint8_t> reply, std::string_view detached = {},
                     const std::shared_ptr<const void>& owner = nullptr);

}  // namespace kvagent::master

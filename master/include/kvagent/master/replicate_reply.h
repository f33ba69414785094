// How a Replicate reply goes out on a ROUTER socket (kvmaster's server; master_bench times it):
// [identity, "", reply], and, when the follower asked for its records detached
// (MasterRpc::LastRequest::detached), the records as one more part, sent from where they lie
// (a built snapshot's mapping) without a copy. The records' owner is held until ZMQ's I/O thread
// is done with them.
#pragma once

#include <cstdint>
#include <span>
#include <zmq.hpp>

#include "kvagent/master/master_rpc.h"

namespace kvagent::master {

// Sends one reply to the ROUTER peer `identity`; `last` is what the Handle call that built
// `reply` left in MasterRpc::last().
void SendReplicateReply(zmq::socket_t& router, const zmq::message_t& identity,
                        std::span<const uint8_t> reply, const MasterRpc::LastRequest& last);

}  // namespace kvagent::master

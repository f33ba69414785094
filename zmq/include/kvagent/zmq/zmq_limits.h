// The documented limits of every ZMQ socket (docs/operations.md, "Security"): the largest
// message each accepts (ZMQ_MAXMSGSIZE: a peer that sends more is disconnected by ZMQ before the
// message is buffered) and how many messages it queues per peer (ZMQ_SNDHWM / ZMQ_RCVHWM).
#pragma once

#include <cstdint>

namespace kvagent {

// kvmaster's RPC ROUTER: one master.fbs Request. An agent's batch holds at most 16 MiB of client
// frames (a frame is at most --max-ring-bytes, 32 MiB), far below this.
inline constexpr int64_t kMaxMasterRequestBytes = int64_t{64} << 20;
// The agent's master link: one master.fbs Reply (a PlacementReply for 65 536 keys of many parts
// and replicas, a ListKeys page of up to 10 000 keys with their block metadata).
inline constexpr int64_t kMaxMasterReplyBytes = int64_t{256} << 20;
// A standby's link to its primary: one Reply (FlatBuffers caps a buffer at 2 GiB anyway). The
// records of a snapshot sent after it as a part of their own may be larger (master/types.h,
// kMaxDetachedReplicationBytes).
inline constexpr int64_t kMaxReplicationReplyBytes = (int64_t{1} << 31) - 1;
// An event SUB or replay DEALER: one frame of a batch (a batch is at most 1 MiB unless one event
// alone is larger; no event is larger than the write that made it).
inline constexpr int64_t kMaxEventFrameBytes = int64_t{64} << 20;
// An event PUB receives only subscriptions (topic prefixes; ours is empty) and, with CURVE, the
// handshake's commands (INITIATE carries ~300 bytes of vouch and metadata): the limit applies to
// those too.
inline constexpr int64_t kMaxSubscriptionBytes = 4096;
// A replay request: [identity, b"", start_seq].
inline constexpr int64_t kMaxReplayRequestBytes = 4096;

// Messages kvmaster's RPC ROUTER queues per agent in each direction. Beyond it ZMQ stops reading
// from that agent (inbound; TCP pushes back) or drops replies to it (outbound: an agent that
// does not read its replies times out and reconnects).
inline constexpr int kMasterRpcPeerQueue = 1000;
// Messages the event replay ROUTER queues per subscriber; a replay proceeds as the subscriber
// reads (EventPublisher), so one that never reads holds at most this many.
inline constexpr int kReplayPeerQueue = 1000;

}  // namespace kvagent

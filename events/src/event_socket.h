// Private to common/: the ZMQ plumbing shared by EventPublisher and EventSubscriber. Every
// socket these helpers touch belongs to the calling thread (docs/architecture.md: one thread per
// ZMQ socket).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "kvagent/common/status.h"

namespace kvagent::events {

// Binds `socket` to `endpoint`; on failure a Status that names `role` ("event PUB", ...), the
// endpoint, the reason and what to do (port in use, missing ipc directory, bad address).
Status BindEventSocket(zmq::socket_t& socket, const std::string& endpoint, std::string_view role);

// Connects `socket` to `endpoint` (the peer need not be up yet: ZMQ retries in the background).
// Fails only for an endpoint ZMQ cannot parse.
Status ConnectEventSocket(zmq::socket_t& socket, const std::string& endpoint,
                          std::string_view role);

// Receives one whole multipart message. Keeps at most `max_parts` frames in `*parts` and drains
// (discards) the rest, so a peer cannot make us hold unbounded frames; `*too_many` tells whether
// that happened. Returns false when no message is waiting (non-blocking) or on ETERM.
bool ReceiveMultipart(zmq::socket_t& socket, size_t max_parts, std::vector<zmq::message_t>* parts,
                      bool* too_many);

inline std::string_view FrameView(const zmq::message_t& frame) {
  return {static_cast<const char*>(frame.data()), frame.size()};
}

// Sends one frame; `more` marks it as not the last of its message. Never blocks: a PUB drops
// at its high-water mark by itself, a ROUTER drops for a peer that is gone or full. Returns
// false when the frame was not queued.
bool SendFrame(zmq::socket_t& socket, std::string_view frame, bool more);

// Sends `payload` as the last frame of a message without copying it: ZMQ holds a reference
// until its I/O thread has sent the bytes (the string must not change meanwhile). An empty or
// null payload is an empty frame. Never blocks; false when the frame was not queued.
bool SendSharedFrame(zmq::socket_t& socket, const std::shared_ptr<const std::string>& payload);

// For reuse of a payload SendSharedFrame sent: moves `*sent`'s buffer into `*into` (emptied,
// its capacity kept) when nothing but `sent` refers to it any more (ZMQ has let go) and it is
// larger than what `*into` holds. Call it on the thread that owns `sent`.
void TakeSentBuffer(const std::shared_ptr<std::string>& sent, std::string* into);

}  // namespace kvagent::events

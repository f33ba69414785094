// TCP sockets named by "tcp://HOST:PORT" (host_port.h; HOST: an IPv4 address, [IPv6] or IPv6
// without brackets (the port after the last colon, as ZMQ reads it), a name, or * for every
// interface), for transports that do their own I/O (the framed RPC, frame_stream.h). Sockets are
// non-blocking, close-on-exec, with TCP_NODELAY.
#pragma once

#include <string>

#include "kvagent/common/status.h"
#include "kvagent/common/unique_fd.h"

namespace kvagent {

// Listens on `endpoint`; `bound` gets the endpoint actually bound (port 0 resolved).
// INVALID_PARAMS for a malformed endpoint, INTERNAL (with the reason) when it cannot be bound.
Result<UniqueFd> ListenTcp(const std::string& endpoint, std::string* bound);

// Starts connecting to `endpoint`: the socket becomes writable when the connection is made or
// failed (then SO_ERROR says why).
Result<UniqueFd> ConnectTcp(const std::string& endpoint);

// Accepts one pending connection of `listener` (invalid when none is pending).
UniqueFd AcceptTcp(int listener);

// HOST:PORT of the other end of connected socket `fd` ("" when it has none, or is not TCP).
std::string PeerAddressOf(int fd);

}  // namespace kvagent

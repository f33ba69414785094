// Sends all n bytes on a socket (send with MSG_NOSIGNAL until done): the test helpers' write.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace kvagent::testing {

// False when the peer is gone or the socket fails before every byte is sent.
inline bool WriteAll(int fd, const void* data, size_t n) {
  const auto* in = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t put = send(fd, in, n, MSG_NOSIGNAL);
    if (put <= 0) return false;
    in += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

}  // namespace kvagent::testing

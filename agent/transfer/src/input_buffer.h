// InputBuffer: buffered reading for the TCP state machines, so that many small headers (and
// small payloads) arrive in one recv instead of one recv each, while large payloads still go
// straight from the socket to their destination.
//
// Copy rule: a payload byte is copied out of the buffer only if it arrived together with the
// header before it (at most one buffer's worth per message); once a message has at least
// kDirectBytes left to read and nothing buffered, the rest is received in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "socket.h"

namespace kvagent::transfer {

class InputBuffer {
 public:
  static constexpr size_t kCapacity = 64 * 1024;
  static constexpr uint64_t kDirectBytes = 16 * 1024;

  InputBuffer() : bytes_(new uint8_t[kCapacity]) {}

  // Buffered bytes not yet consumed.
  size_t size() const { return end_ - begin_; }
  const uint8_t* data() const { return bytes_.get() + begin_; }
  void Consume(size_t n) { begin_ += n; }

  // One recv into the free space (after moving unread bytes to the front when needed).
  IoResult Fill(int fd);

  // Moves up to `left` bytes of a payload to `dst` (nullptr: discard them): buffered bytes
  // first, then straight from the socket when at least kDirectBytes remain and `dst` is set,
  // else through the buffer. `*moved` is what reached dst (or was discarded) in this call.
  // `crc` (with `dst`): extended by the CRC32C of those bytes, taken in the copy out of the
  // buffer, or right after the receive while they are in cache.
  IoResult ReadPayload(int fd, uint8_t* dst, uint64_t left, uint64_t* moved,
                       uint32_t* crc = nullptr);

 private:
  std::unique_ptr<uint8_t[]> bytes_;
  size_t begin_ = 0;
  size_t end_ = 0;
};

}  // namespace kvagent::transfer

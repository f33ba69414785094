// Length-prefixed frames on a byte stream: the framed RPC transport's wire (docs/protocol.md,
// "Framed RPC"). A connection starts with an 8-byte hello from each side (kFrameHello: the
// protocol's name and version); then every frame is a 4-byte little-endian length followed by
// that many bytes.
//
// FrameReader takes what read() returns and hands out complete frames. It never holds more than
// one frame of at most `max_frame` bytes plus a header and what one read() may add: a peer that
// names a longer frame gets an error before any of its bytes are kept, so memory per
// connection is bounded by the limit, not by what the peer sends.
//
// OutgoingBytes is the other direction: the hello and frames queued for the socket and written as
// it takes them, for both ends (FramedConnection, kvmaster's FramedRpcServer).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kvagent/common/status.h"

namespace kvagent {

class FrameSealer;  // frame_cipher.h

inline constexpr size_t kFrameHeaderBytes = 4;
// "KVMF" (kvagent master frames), then the version (1) as 4 little-endian bytes: the hello of
// the plain wire. Version 2 (frame_cipher.h: under a cluster secret) adds handshake bytes.
inline constexpr std::string_view kFrameHello{"KVMF\x01\x00\x00\x00", 8};
// The most bytes a hello carries after its 8-byte prefix.
inline constexpr size_t kMaxFrameHelloRest = 64;

// Appends a frame holding `payload` (at most 4 GiB - 1 bytes) to `out`.
void AppendFrame(std::vector<uint8_t>* out, std::span<const uint8_t> payload);

class FrameReader {
 public:
  // Frames longer than `max_frame` are an error. With `hello`, the stream must start with
  // kFrameHello (checked before any frame).
  FrameReader(size_t max_frame, bool hello);
  // The stream must start with the hello of `version` ("KVMF" and the version), then
  // `hello_rest` more bytes (at most kMaxFrameHelloRest), which hello_rest() returns. The
  // prefix is checked as soon as its bytes arrive, before the rest.
  FrameReader(size_t max_frame, uint32_t version, size_t hello_rest);

  // Where the next read() may put up to `n` bytes; Commit the count it read.
  std::span<uint8_t> Space(size_t n);
  void Commit(size_t n);

  // The next complete frame (valid until the next Space or Compact; the caller may change its
  // bytes in place, e.g. to decrypt them), nullopt when the bytes so far end inside one, or
  // INVALID_PARAMS naming what was wrong (a bad hello, a frame longer than the limit): the
  // stream cannot go on.
  Result<std::optional<std::span<uint8_t>>> Next();

  // Drops the frames Next returned (call once they are handled).
  void Compact();

  // Frames longer than `max_frame` are an error from now on (a frame being received is judged
  // by its header anew at the next Next).
  void set_max_frame(size_t max_frame) { max_frame_ = max_frame; }

  // True once the hello was read (or none was expected).
  bool hello_done() const { return !hello_pending_; }
  // The bytes of the hello after its prefix (empty until hello_done()).
  std::span<const uint8_t> hello_rest() const {
    return std::span(hello_rest_.data(), hello_pending_ ? 0 : hello_rest_bytes_);
  }

  // Bytes held (a frame being received, and frames not yet compacted).
  size_t buffered() const { return end_ - begin_; }

 private:
  std::vector<uint8_t> buffer_;
  size_t begin_ = 0;  // first byte not yet returned by Next
  size_t end_ = 0;    // end of the bytes committed
  size_t max_frame_;
  bool hello_pending_;
  uint32_t version_ = 1;
  size_t hello_rest_bytes_ = 0;
  std::array<uint8_t, kMaxFrameHelloRest> hello_rest_{};
};

// Bytes queued for a non-blocking stream socket, written as the socket takes them: one side's
// outgoing stream of a framed RPC connection (its hello, then frames). Memory is what is queued;
// the owner bounds it (queued() before appending). Not thread-safe: one thread owns it.
class OutgoingBytes {
 public:
  // Queues `bytes` as they are (a hello, a handshake's answer).
  void Append(std::string_view bytes);
  void Append(std::span<const uint8_t> bytes);
  // Queues a frame holding `payload` (AppendFrame).
  void AppendFrame(std::span<const uint8_t> payload);
  // Queues a frame holding `payload` sealed by `sealer` (frame_cipher.h, the encrypted wire;
  // defined in frame_cipher.cc, so that a user of the plain wire links no cipher).
  void AppendSealedFrame(FrameSealer& sealer, std::span<const uint8_t> payload);

  // Writes queued bytes to `fd` until all are written or send() would block (EAGAIN,
  // EWOULDBLOCK) or is interrupted (EINTR): what is left stays queued for the next call. OK in
  // those cases; INTERNAL "sending to <peer> failed: <reason>" when send() fails otherwise (the
  // connection is broken; what was not written stays queued). Never raises SIGPIPE.
  [[nodiscard]] Status FlushTo(int fd, std::string_view peer);

  // Bytes queued and not yet written.
  size_t queued() const { return bytes_.size() - sent_; }
  bool empty() const { return sent_ == bytes_.size(); }
  // Drops every queued byte (a connection given up).
  void Clear();

 private:
  std::vector<uint8_t> bytes_;
  size_t sent_ = 0;  // bytes_[0, sent_) are written
};

}  // namespace kvagent

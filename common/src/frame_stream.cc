#include "kvagent/common/frame_stream.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "kvagent/common/errno_text.h"

namespace kvagent {

void AppendFrame(std::vector<uint8_t>* out, std::span<const uint8_t> payload) {
  const auto n = static_cast<uint32_t>(payload.size());
  const uint8_t header[kFrameHeaderBytes] = {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8),
                                             static_cast<uint8_t>(n >> 16),
                                             static_cast<uint8_t>(n >> 24)};
  out->insert(out->end(), header, header + kFrameHeaderBytes);
  out->insert(out->end(), payload.begin(), payload.end());
}

FrameReader::FrameReader(size_t max_frame, bool hello)
    : max_frame_(max_frame), hello_pending_(hello) {}

FrameReader::FrameReader(size_t max_frame, uint32_t version, size_t hello_rest)
    : max_frame_(max_frame),
      hello_pending_(true),
      version_(version),
      hello_rest_bytes_(std::min(hello_rest, kMaxFrameHelloRest)) {}

std::span<uint8_t> FrameReader::Space(size_t n) {
  if (buffer_.size() - end_ < n) {
    if (begin_ > 0) Compact();
    if (buffer_.size() - end_ < n) buffer_.resize(end_ + n);
  }
  return std::span(buffer_.data() + end_, n);
}

void FrameReader::Commit(size_t n) { end_ += n; }

Result<std::optional<std::span<uint8_t>>> FrameReader::Next() {
  uint8_t* at = buffer_.data() + begin_;
  const size_t have = end_ - begin_;
  if (hello_pending_) {
    const size_t seen = std::min(have, kFrameHello.size());
    if (std::memcmp(at, kFrameHello.data(), std::min<size_t>(seen, 4)) != 0) {
      return InvalidParams(
          "the stream does not start with the framed RPC hello (KVMF): the peer speaks another "
          "protocol (ZMQ?)");
    }
    if (seen < kFrameHello.size()) return std::optional<std::span<uint8_t>>();
    const uint32_t version =
        uint32_t{at[4]} | uint32_t{at[5]} << 8 | uint32_t{at[6]} << 16 | uint32_t{at[7]} << 24;
    if (version != version_) {
      return InvalidParams("the peer speaks framed RPC version " + std::to_string(version) +
                           ", this end version " + std::to_string(version_) +
                           " (version 2 is the wire under a cluster secret, 1 the plain one: "
                           "both ends need the same --cluster-secret-file, or neither)");
    }
    if (have < kFrameHello.size() + hello_rest_bytes_) {
      return std::optional<std::span<uint8_t>>();
    }
    std::memcpy(hello_rest_.data(), at + kFrameHello.size(), hello_rest_bytes_);
    begin_ += kFrameHello.size() + hello_rest_bytes_;
    hello_pending_ = false;
    return Next();
  }
  if (have < kFrameHeaderBytes) return std::optional<std::span<uint8_t>>();
  const size_t n = size_t{at[0]} | size_t{at[1]} << 8 | size_t{at[2]} << 16 | size_t{at[3]} << 24;
  if (n > max_frame_) {
    return InvalidParams("a frame of " + std::to_string(n) + " bytes, over the limit of " +
                         std::to_string(max_frame_));
  }
  if (have - kFrameHeaderBytes < n) {
    // Room for the rest of this frame once the reader asks (Space), not before.
    return std::optional<std::span<uint8_t>>();
  }
  begin_ += kFrameHeaderBytes + n;
  return std::optional<std::span<uint8_t>>(std::span(at + kFrameHeaderBytes, n));
}

void FrameReader::Compact() {
  if (begin_ == 0) return;
  std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
  end_ -= begin_;
  begin_ = 0;
  // A connection that once received a large frame does not keep its buffer for ever.
  if (buffer_.size() > (size_t{1} << 20) && end_ < buffer_.size() / 4) {
    buffer_.resize(std::max<size_t>(end_, size_t{1} << 16));
    buffer_.shrink_to_fit();
  }
}

void OutgoingBytes::Append(std::string_view bytes) {
  bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
}

void OutgoingBytes::Append(std::span<const uint8_t> bytes) {
  bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
}

void OutgoingBytes::AppendFrame(std::span<const uint8_t> payload) {
  kvagent::AppendFrame(&bytes_, payload);
}

Status OutgoingBytes::FlushTo(int fd, std::string_view peer) {
  while (sent_ < bytes_.size()) {
    const ssize_t n = ::send(fd, bytes_.data() + sent_, bytes_.size() - sent_, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
      return Internal("sending to " + std::string(peer) + " failed: " + ErrnoText(errno));
    }
    sent_ += static_cast<size_t>(n);
  }
  Clear();
  return Status::Ok();
}

void OutgoingBytes::Clear() {
  bytes_.clear();
  sent_ = 0;
  // A connection that once sent a large burst does not keep its buffer for ever.
  if (bytes_.capacity() > (size_t{1} << 20)) bytes_.shrink_to_fit();
}

}  // namespace kvagent

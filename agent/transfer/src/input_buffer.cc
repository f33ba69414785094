#include "input_buffer.h"

#include <algorithm>
#include <cstring>

#include "kvagent/common/checksum.h"

namespace kvagent::transfer {

IoResult InputBuffer::Fill(int fd) {
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (end_ == kCapacity) {
    std::memmove(bytes_.get(), bytes_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  IoResult io = ReceiveSome(fd, bytes_.get() + end_, kCapacity - end_);
  end_ += io.bytes;
  return io;
}

IoResult InputBuffer::ReadPayload(int fd, uint8_t* dst, uint64_t left, uint64_t* moved,
                                  uint32_t* crc) {
  *moved = 0;
  if (size() == 0) {
    if (dst != nullptr && left >= kDirectBytes) {
      IoResult io = ReceiveSome(fd, dst, static_cast<size_t>(left));
      *moved = io.bytes;
      if (crc != nullptr) *crc = Crc32c(dst, io.bytes, *crc);
      return io;
    }
    IoResult io = Fill(fd);
    if (io.kind != IoResult::kData || size() == 0) return io;
  }
  const size_t n = static_cast<size_t>(std::min<uint64_t>(left, size()));
  if (dst != nullptr && crc != nullptr) {
    *crc = CopyWithCrc32c(dst, data(), n, CopyStores::kCached, *crc);
  } else if (dst != nullptr) {
    std::memcpy(dst, data(), n);
  }
  Consume(n);
  *moved = n;
  return {IoResult::kData, n, 0};
}

}  // namespace kvagent::transfer

// The framed RPC transport's stream (common/frame_stream.h), as a peer could send it to kvmaster's
// --framed-listen or to an agent's master link: the first two bytes pick how the rest is cut into
// reads and whether a hello is expected. Must never crash or hit UB; every frame handed out is
// within the limit and is exactly the bytes its header named; the reader never holds more than a
// frame, its header and one read beyond what it handed out.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kvagent/common/frame_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  constexpr size_t kLimit = 4096;
  const size_t piece = 1 + data[0] % 64 * 37;
  const bool hello = (data[1] & 1) != 0;
  data += 2;
  size -= 2;
  kvagent::FrameReader reader(kLimit, hello);
  size_t at = 0;
  size_t consumed = 0;  // bytes of the stream the frames handed out (and the hello) account for
  while (at < size) {
    const size_t n = std::min(piece, size - at);
    std::span<uint8_t> space = reader.Space(n);
    std::memcpy(space.data(), data + at, n);
    reader.Commit(n);
    at += n;
    while (true) {
      auto frame = reader.Next();
      if (!frame.ok()) return 0;  // the stream cannot go on: the connection is closed
      if (!frame->has_value()) break;
      if (hello && consumed == 0) consumed = kvagent::kFrameHello.size();
      const std::span<const uint8_t> f = **frame;
      if (f.size() > kLimit) std::abort();
      // The frame is the bytes right after its header in the stream.
      if (consumed + 4 + f.size() > at) std::abort();
      if (f.size() > 0 && std::memcmp(f.data(), data + consumed + 4, f.size()) != 0) std::abort();
      consumed += 4 + f.size();
    }
    reader.Compact();
    if (reader.buffered() > kLimit + 4 + piece) std::abort();
  }
  return 0;
}

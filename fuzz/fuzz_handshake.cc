// The agent.sock handshake as the agent reads it: length-prefixed framing (ipc::MessageReader,
// over a real socket pair) and the Hello / Attached messages (agent/src/handshake_messages.cc).
// Any bytes a local process can write to agent.sock. Must never crash, hit UB, or buffer more
// than one message's limit.
#include <sys/socket.h>
#include <unistd.h>

#include <glog/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "handshake_messages.h"
#include "kvagent/ipc/unix_socket.h"

// The code under test logs refusals; millions of runs must not print them.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) return 0;
  kvagent::ipc::UniqueFd reader_end(fds[0]), writer_end(fds[1]);
  kvagent::ipc::MessageReader reader;
  size_t sent = 0;
  bool open = true;
  while (open) {
    if (sent < size) {
      const ssize_t n = ::send(writer_end.get(), data + sent, size - sent, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
    } else if (writer_end.valid()) {
      writer_end.Reset();  // EOF after the input
    }
    while (true) {
      const auto state = reader.Read(reader_end.get());
      if (state == kvagent::ipc::MessageReader::State::kNeedMore) break;
      if (state != kvagent::ipc::MessageReader::State::kMessage) {
        open = false;
        break;
      }
      const std::vector<uint8_t>& message = reader.message();
      if (message.size() > kvagent::ipc::kMaxHandshakeMessage) std::abort();
      auto hello = kvagent::agent::ReadHello(message);
      if (hello.ok()) {
        if (hello->client_name.size() > 4 * 64 + 3) std::abort();  // sanitized and capped
        for (char c : hello->client_name) {
          if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
            std::abort();  // nothing unprintable reaches a log line
          }
        }
      }
      (void)kvagent::agent::ReadAttached(message);
    }
    if (reader.pending_bytes() > kvagent::ipc::kMaxHandshakeMessage + 4) std::abort();
  }
  return 0;
}

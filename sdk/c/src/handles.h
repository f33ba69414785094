// What the C ABI's opaque handles are, and the rule that keeps arena buffers safe across
// asynchronous calls: a call holds a reference to every buffer it names until it is collected,
// so a caller (or a garbage collector) may free a kv_buffer_t early without the agent ever
// reading or writing a range the arena has handed out again.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "kvagent/client.h"
#include "kvagent/client_c.h"

namespace kvagent::c_abi {
struct Parking;
}  // namespace kvagent::c_abi

struct kv_buffer {
  // Shared with the calls that name the buffer (see the file comment).
  std::shared_ptr<kvagent::ArenaBuffer> arena;
};

struct kv_pending {
  kvagent::PendingCall call;
  std::optional<kvagent::Reply> refused;  // the C arguments were refused before the SDK saw them
  std::vector<std::shared_ptr<kvagent::ArenaBuffer>> held;  // buffers the call reads or writes
  std::weak_ptr<kvagent::c_abi::Parking> parking;           // its client's
  bool collected = false;
};

namespace kvagent::c_abi {

// Per client: calls abandoned while they still held buffers (kv_pending_free before the reply
// came), kept until they are ready, and the buffers of calls that timed out, kept until the
// client is freed. A call holds the parking only weakly, so it never keeps a freed client's
// state alive.
struct Parking {
  // A sweep runs when the list reaches sweep_at entries, then sweep_at doubles the survivors:
  // amortized O(1) work per parked call however many are abandoned.
  static constexpr size_t kMinSweep = 64;

  std::mutex mu;
  bool closed = false;  // the client is gone: nothing is parked any more
  std::vector<std::unique_ptr<kv_pending>> calls;
  // The agent may still write into these: a timed-out call's reply can come late.
  std::vector<std::shared_ptr<ArenaBuffer>> timed_out;
  size_t sweep_at = kMinSweep;
};

}  // namespace kvagent::c_abi

struct kv_client {
  std::unique_ptr<kvagent::Client> client;
  std::shared_ptr<kvagent::c_abi::Parking> parking = std::make_shared<kvagent::c_abi::Parking>();
};

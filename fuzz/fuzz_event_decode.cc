// The KV-event decoder (events/src/kv_event_decode.cc): any payload a publisher (or an attacker
// on an unauthenticated event port) can send to the relay or kvctl. Must never crash, hit UB or
// allocate without bound; what decodes must describe without trouble.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvagent/events/kv_event.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view payload(reinterpret_cast<const char*>(data), size);
  auto batch = kvagent::events::DecodeEventBatch(payload);
  if (batch.ok()) {
    size_t total = 0;
    for (const auto& e : batch->events) total += kvagent::events::DescribeEvent(e).size();
    volatile size_t keep = total;
    (void)keep;
  }
  (void)kvagent::events::DecodeSeq(payload.substr(0, 8));
  return 0;
}

// The relay's own reader of master event batches (agent/relay/src/event_digest.h), which keeps
// its downstream index from the bytes it republishes: any payload a master (or an attacker on
// an unauthenticated event port) can send. Must never crash, hit UB or read out of bounds; and,
// differentially, every payload the strict decoder accepts (what consumers read) must read the
// same here: the same events, types, object keys and fingerprints.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <variant>
#include <vector>

#include "downstream_index.h"
#include "event_digest.h"
#include "kvagent/events/kv_event.h"

namespace {

using kvagent::relay::DownstreamIndex;
using kvagent::relay::EventDigest;

struct Seen {
  EventDigest::Type type;
  bool has_key;
  std::string key;
  uint64_t fingerprint;
};

void Check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view payload(reinterpret_cast<const char*>(data), size);
  std::vector<Seen> seen;
  const bool read = kvagent::relay::ForEachEvent(payload, [&](const EventDigest& d) {
    seen.push_back({d.type, d.object_key.has_value(), std::string(d.object_key.value_or("")),
                    d.type == EventDigest::Type::kStored ? DownstreamIndex::Fingerprint(d) : 0});
  });
  DownstreamIndex index;
  Check(index.ApplyPayload(payload) == read);
  auto strict = kvagent::events::DecodeEventBatch(payload);
  if (!strict.ok()) return 0;
  Check(read);
  Check(seen.size() == strict->events.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    const auto& e = strict->events[i];
    if (const auto* s = std::get_if<kvagent::events::BlockStored>(&e)) {
      Check(seen[i].type == EventDigest::Type::kStored);
      Check(seen[i].has_key == s->object_key.has_value());
      Check(seen[i].key == s->object_key.value_or(""));
      Check(seen[i].fingerprint == DownstreamIndex::Fingerprint(kvagent::relay::DigestOf(*s)));
    } else if (const auto* r = std::get_if<kvagent::events::BlockRemoved>(&e)) {
      Check(seen[i].type == EventDigest::Type::kRemoved);
      Check(seen[i].has_key == r->object_key.has_value());
      Check(seen[i].key == r->object_key.value_or(""));
    } else {
      Check(seen[i].type == EventDigest::Type::kCleared);
    }
  }
  return 0;
}

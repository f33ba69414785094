// The relay's own reader of event payloads (agent/relay/src/event_digest.h) against the strict
// decoder (what consumers read): a payload one accepts, the other reads the same way. Cases the
// fuzz harness (fuzz/fuzz_relay_digest.cc) found or that sit next to them: a key of one event
// type with a value of another type on an event type that does not read it.
#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "downstream_index.h"
#include "event_digest.h"
#include "kvagent/events/kv_event.h"

namespace kvagent::relay {
namespace {

using Packer = msgpack::packer<std::stringstream>;

// One event map; `fields` writes its key/value pairs (count of them first).
struct Event {
  uint32_t pairs;
  std::function<void(Packer&)> fields;
};

std::string Batch(const std::vector<Event>& events) {
  std::stringstream out;
  Packer pk(out);
  pk.pack_array(3);
  pk.pack_double(1700000000.5);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const Event& e : events) {
    pk.pack_map(e.pairs);
    e.fields(pk);
  }
  pk.pack_int(0);
  return out.str();
}

template <class T>
void Pair(Packer& pk, const std::string& key, const T& value) {
  pk.pack(key);
  pk.pack(value);
}

Event Stored(const std::string& object_key) {
  return {10, [object_key](Packer& pk) {
            Pair(pk, "type", std::string("BlockStored"));
            Pair(pk, "block_hashes", std::vector<uint64_t>{1});
            pk.pack(std::string("parent_block_hash"));
            pk.pack_nil();
            Pair(pk, "token_ids", std::vector<uint32_t>{1, 2});
            Pair(pk, "block_size", 2u);
            pk.pack(std::string("lora_id"));
            pk.pack_nil();
            Pair(pk, "medium", std::string("EXTERNAL"));
            pk.pack(std::string("lora_name"));
            pk.pack_nil();
            Pair(pk, "session_id", std::string("session-1"));
            Pair(pk, "object_key", object_key);
          }};
}

// A BlockRemoved with an extra key of another event type, written before "type".
template <class T>
Event RemovedWith(const std::string& extra_key, const T& extra_value) {
  return {5, [=](Packer& pk) {
            Pair(pk, extra_key, extra_value);
            Pair(pk, "block_hashes", std::vector<uint64_t>{1});
            Pair(pk, "medium", std::string("EXTERNAL"));
            Pair(pk, "object_key", std::string("obj-a"));
            Pair(pk, "type", std::string("BlockRemoved"));
          }};
}

struct Read {
  bool ok = false;
  std::vector<EventDigest::Type> types;
  std::vector<std::string> keys;
};

Read Digest(const std::string& payload) {
  Read r;
  r.ok = ForEachEvent(payload, [&](const EventDigest& d) {
    r.types.push_back(d.type);
    r.keys.emplace_back(d.object_key.value_or(""));
  });
  return r;
}

TEST(EventDigest, AKeyAnEventTypeDoesNotReadIsSkippedWhateverItHoldsAsConsumersSkipIt) {
  // Found by fuzz_relay_digest: "block_size" holding a string on a BlockRemoved. Strict
  // consumers ignore the key there; the relay refused the batch and stopped vouching for what
  // its consumers hold (a needless clear and re-announce for every router behind it).
  for (const Event& removed :
       {RemovedWith("block_size", std::string("obj-a")), RemovedWith("token_ids", 7u),
        RemovedWith("lora_id", std::string("x")), RemovedWith("group_idx", 1.5),
        RemovedWith("parent_block_hash", std::vector<std::string>{"a"})}) {
    const std::string payload =
        Batch({Stored("obj-a"), removed, {1, [](Packer& pk) {
                                            Pair(pk, "type", std::string("AllBlocksCleared"));
                                          }}});
    auto strict = events::DecodeEventBatch(payload);
    ASSERT_TRUE(strict.ok()) << strict.status().ToString();
    const Read read = Digest(payload);
    ASSERT_TRUE(read.ok);
    EXPECT_EQ(read.types, (std::vector<EventDigest::Type>{EventDigest::Type::kStored,
                                                          EventDigest::Type::kRemoved,
                                                          EventDigest::Type::kCleared}));
    EXPECT_EQ(read.keys, (std::vector<std::string>{"obj-a", "obj-a", ""}));
    DownstreamIndex index;
    index.Vouch();
    index.ApplyPayload(payload);
    EXPECT_TRUE(index.valid());
  }
}

TEST(EventDigest, AClearedEventReadsNoKeySoNoneOfItsValuesMatters) {
  const std::string payload = Batch({{3, [](Packer& pk) {
                                        Pair(pk, "block_hashes", std::string("not hashes"));
                                        Pair(pk, "medium", 5);
                                        Pair(pk, "type", std::string("AllBlocksCleared"));
                                      }}});
  ASSERT_TRUE(events::DecodeEventBatch(payload).ok());
  const Read read = Digest(payload);
  ASSERT_TRUE(read.ok);
  EXPECT_EQ(read.types, std::vector<EventDigest::Type>{EventDigest::Type::kCleared});
}

TEST(EventDigest, AKeyTheEventTypeReadsWithAValueOfAnotherTypeIsRefusedByBoth) {
  const std::vector<std::string> payloads = {
      Batch({RemovedWith("medium", 3)}),  // medium written twice: the first one a number
      Batch({RemovedWith("object_key", 3)}),
      Batch({{2,
              [](Packer& pk) {  // a BlockStored's block_size as a string, type last
                Pair(pk, "block_size", std::string("4"));
                Pair(pk, "type", std::string("BlockStored"));
              }}}),
  };
  for (const std::string& payload : payloads) {
    EXPECT_FALSE(events::DecodeEventBatch(payload).ok());
    EXPECT_FALSE(Digest(payload).ok);
  }
}

TEST(EventDigest, AValueThatIsNotMsgpackAtAllIsRefused) {
  std::string payload = Batch({RemovedWith("block_size", std::string("xx"))});
  const size_t at = payload.find("block_size") + std::string("block_size").size();
  payload[at] = static_cast<char>(0xc1);  // never used in msgpack
  EXPECT_FALSE(events::DecodeEventBatch(payload).ok());
  EXPECT_FALSE(Digest(payload).ok);
}

}  // namespace
}  // namespace kvagent::relay

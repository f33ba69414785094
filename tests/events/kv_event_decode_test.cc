// DecodeEventBatch is as strict as the strictest consumer (docs/events.md, "What
// strict consumers check"): each test hand-packs one defect with msgpack-c and expects
// INVALID_PARAMS naming the field. Events are built as ordered key/value lists so that each test
// changes exactly one thing in an otherwise valid payload.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <msgpack.hpp>

#include "kvagent/events/kv_event.h"

namespace kvagent::events {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;
using Value = std::function<void(Packer&)>;
using Fields = std::vector<std::pair<std::string, Value>>;

Value Str(std::string s) {
  return [s](Packer& pk) {
    pk.pack_str(static_cast<uint32_t>(s.size()));
    pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
  };
}
Value Int(int64_t v) {
  return [v](Packer& pk) { pk.pack_int64(v); };
}
Value Nil() {
  return [](Packer& pk) { pk.pack_nil(); };
}
Value Ints(std::vector<int64_t> vs) {
  return [vs](Packer& pk) {
    pk.pack_array(static_cast<uint32_t>(vs.size()));
    for (int64_t v : vs) pk.pack_int64(v);
  };
}

Fields ValidStored() {
  return {{"type", Str("BlockStored")}, {"block_hashes", Ints({123, -5})},
          {"parent_block_hash", Nil()}, {"token_ids", Ints({1, 2, 3, 4})},
          {"block_size", Int(2)},       {"lora_id", Nil()},
          {"medium", Str("EXTERNAL")},  {"lora_name", Nil()},
          {"session_id", Str("sess-1")}};
}

Fields ValidRemoved() {
  return {{"type", Str("BlockRemoved")}, {"block_hashes", Ints({123})}, {"medium", Str("DISK")}};
}

Value Map(Fields fields) {
  return [fields](Packer& pk) {
    pk.pack_map(static_cast<uint32_t>(fields.size()));
    for (const auto& [k, v] : fields) {
      Str(k)(pk);
      v(pk);
    }
  };
}

Fields Without(Fields f, const std::string& key) {
  std::erase_if(f, [&](const auto& kv) { return kv.first == key; });
  return f;
}

Fields With(Fields f, const std::string& key, Value v) {
  for (auto& kv : f) {
    if (kv.first == key) {
      kv.second = std::move(v);
      return f;
    }
  }
  f.emplace_back(key, std::move(v));
  return f;
}

std::string Pack(const std::vector<Value>& elements) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(static_cast<uint32_t>(elements.size()));
  for (const Value& v : elements) v(pk);
  return std::string(buf.data(), buf.size());
}

Value Events(std::vector<Value> events) {
  return [events](Packer& pk) {
    pk.pack_array(static_cast<uint32_t>(events.size()));
    for (const Value& e : events) e(pk);
  };
}

Value Ts() {
  return [](Packer& pk) { pk.pack_double(1732900000.5); };
}

std::string BatchOf(Fields event) { return Pack({Ts(), Events({Map(std::move(event))}), Int(0)}); }

// Expects rejection with INVALID_PARAMS and a message that contains every one of `words`.
void ExpectRejected(const std::string& payload, std::vector<std::string> words) {
  auto r = DecodeEventBatch(payload);
  ASSERT_FALSE(r.ok()) << "accepted a payload that should fail: " << words.front();
  EXPECT_TRUE(r.status().IsInvalidParams()) << r.status().ToString();
  for (const std::string& w : words) {
    EXPECT_NE(r.status().message().find(w), std::string::npos)
        << "message \"" << r.status().message() << "\" does not mention \"" << w << "\"";
  }
}

TEST(KvEventDecode, ValidHandPackedEventsAreAccepted) {
  auto r =
      DecodeEventBatch(Pack({Ts(), Events({Map(ValidStored()), Map(ValidRemoved())}), Int(0)}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->events.size(), 2u);
  const auto& s = std::get<BlockStored>(r->events[0]);
  EXPECT_EQ(s.block_hashes,
            (std::vector<BlockHash>{BlockHash::Unsigned(123), BlockHash::Signed(-5)}));
  EXPECT_EQ(s.session_id, "sess-1");
  EXPECT_EQ(std::get<BlockRemoved>(r->events[1]).medium, "DISK");
}

TEST(KvEventDecode, TwoElementBatchIsRejectedAsDynamoDoes) {
  ExpectRejected(Pack({Ts(), Events({})}), {"batch", "exactly 3", "array of 2"});
}

TEST(KvEventDecode, FourElementBatchIsRejected) {
  ExpectRejected(Pack({Ts(), Events({}), Int(0), Int(0)}), {"exactly 3", "array of 4"});
}

TEST(KvEventDecode, BatchThatIsAMapIsRejected) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  Map(ValidRemoved())(pk);
  ExpectRejected(std::string(buf.data(), buf.size()), {"exactly 3", "got map"});
}

TEST(KvEventDecode, UnknownEventTypeIsRejected) {
  ExpectRejected(BatchOf(With(ValidRemoved(), "type", Str("BlockMoved"))),
                 {"events[0].type", "BlockMoved"});
}

TEST(KvEventDecode, MissingTypeIsRejected) {
  ExpectRejected(BatchOf(Without(ValidRemoved(), "type")), {"events[0]", "type"});
}

TEST(KvEventDecode, NilTokenIdsIsRejected) {
  ExpectRejected(BatchOf(With(ValidStored(), "token_ids", Nil())), {"token_ids", "got nil"});
}

TEST(KvEventDecode, BinHashIsRejected) {
  Value bin_hash = [](Packer& pk) {
    pk.pack_array(1);
    pk.pack_bin(32);
    pk.pack_bin_body(std::string(32, '\x11').data(), 32);
  };
  ExpectRejected(BatchOf(With(ValidStored(), "block_hashes", bin_hash)),
                 {"block_hashes[0]", "got bin"});
}

TEST(KvEventDecode, BinParentHashIsRejected) {
  Value bin_hash = [](Packer& pk) {
    pk.pack_bin(8);
    pk.pack_bin_body("\x01\x02\x03\x04\x05\x06\x07\x08", 8);
  };
  ExpectRejected(BatchOf(With(ValidStored(), "parent_block_hash", bin_hash)),
                 {"parent_block_hash", "got bin"});
}

TEST(KvEventDecode, InvalidUtf8SessionIdIsRejected) {
  ExpectRejected(BatchOf(With(ValidStored(), "session_id", Str("sess-\xff"))),
                 {"session_id", "UTF-8"});
}

TEST(KvEventDecode, InvalidUtf8InsideAnUnknownKeyIsRejectedAsRawFalseDoes) {
  ExpectRejected(BatchOf(With(ValidRemoved(), "extra_keys", Str("\xc0\xaf"))),
                 {"extra_keys", "UTF-8"});
}

TEST(KvEventDecode, NonStringMapKeyIsRejectedAsStrictMapKeyDoes) {
  Value event = [](Packer& pk) {
    pk.pack_map(4);
    Str("type")(pk);
    Str("BlockRemoved")(pk);
    Str("block_hashes")(pk);
    Ints({1})(pk);
    Str("medium")(pk);
    Str("DISK")(pk);
    pk.pack_int64(7);  // key
    pk.pack_nil();
  };
  ExpectRejected(Pack({Ts(), Events({event}), Int(0)}), {"map key", "int", "strings"});
}

TEST(KvEventDecode, TextAsBinInsteadOfStrIsRejected) {
  Value bin_medium = [](Packer& pk) {
    pk.pack_bin(4);
    pk.pack_bin_body("DISK", 4);
  };
  ExpectRejected(BatchOf(With(ValidRemoved(), "medium", bin_medium)), {"medium", "got bin"});
}

TEST(KvEventDecode, MissingKeysWithoutDefaultAreRejectedAsMsgspecDoes) {
  for (const char* key : {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                          "medium", "lora_name"}) {
    SCOPED_TRACE(key);
    ExpectRejected(BatchOf(Without(ValidStored(), key)), {"BlockStored", key});
  }
  ExpectRejected(BatchOf(Without(ValidRemoved(), "medium")), {"BlockRemoved", "medium"});
}

TEST(KvEventDecode, LegacyArrayFormEventIsRejected) {
  Value legacy = [](Packer& pk) {
    pk.pack_array(3);
    Str("BlockRemoved")(pk);
    Ints({123})(pk);
    Str("GPU")(pk);
  };
  ExpectRejected(Pack({Ts(), Events({legacy}), Int(0)}), {"events[0]", "legacy"});
}

TEST(KvEventDecode, TrailingBytesAfterTheBatchAreRejected) {
  ExpectRejected(BatchOf(ValidRemoved()) + std::string("\xc0", 1), {"1 bytes follow"});
}

TEST(KvEventDecode, TruncatedAndEmptyPayloadsAreRejected) {
  const std::string full = BatchOf(ValidStored());
  for (size_t cut : {size_t{1}, size_t{10}, full.size() - 1}) {
    ExpectRejected(full.substr(0, cut), {"not valid msgpack"});
  }
  ExpectRejected("", {"empty"});
}

TEST(KvEventDecode, HugeDeclaredArrayIsRejectedWithoutAllocatingIt) {
  // array32 header claiming 2^32-1 elements, then nothing: must fail fast (ASan would report an
  // allocation of ~100 GB otherwise).
  ExpectRejected(std::string("\xdd\xff\xff\xff\xff", 5), {"not valid msgpack"});
  ExpectRejected(std::string("\x93\xcb\x41\xd9\xd2\x7d\x28\x00\x00\x00\xdf\xff\xff\xff\xff", 15),
                 {"not valid msgpack"});
}

TEST(KvEventDecode, TokenIdOutsideU32IsRejected) {
  ExpectRejected(BatchOf(With(ValidStored(), "token_ids", Ints({1, 2, 3, int64_t{1} << 32}))),
                 {"token_ids[3]", "u32"});
  ExpectRejected(BatchOf(With(ValidStored(), "token_ids", Ints({1, -2, 3, 4}))),
                 {"token_ids[1]", "u32"});
}

TEST(KvEventDecode, TokenCountOtherThanBlockSizeTimesHashesIsRejected) {
  ExpectRejected(BatchOf(With(ValidStored(), "token_ids", Ints({1, 2, 3}))),
                 {"token_ids", "3 token IDs", "block_size 2 x 2"});
}

TEST(KvEventDecode, EmptyTokenIdsAreAcceptedAsUnknown) {
  auto r = DecodeEventBatch(BatchOf(With(ValidStored(), "token_ids", Ints({}))));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::get<BlockStored>(r->events[0]).token_ids.empty());
}

TEST(KvEventDecode, SessionIdOnBlockRemovedOrClearedIsRejected) {
  ExpectRejected(BatchOf(With(ValidRemoved(), "session_id", Str("s"))),
                 {"BlockRemoved", "session_id", "only on BlockStored"});
  ExpectRejected(BatchOf({{"type", Str("AllBlocksCleared")}, {"session_id", Str("s")}}),
                 {"AllBlocksCleared", "session_id"});
}

TEST(KvEventDecode, NilOrEmptyOrOverlongSessionIdIsRejected) {
  ExpectRejected(BatchOf(With(ValidStored(), "session_id", Nil())), {"session_id", "nil"});
  ExpectRejected(BatchOf(With(ValidStored(), "session_id", Str(""))), {"session_id", "empty"});
  ExpectRejected(BatchOf(With(ValidStored(), "session_id", Str(std::string(257, 'a')))),
                 {"session_id", "257"});
}

TEST(KvEventDecode, LowercaseOrEmptyMediumIsRejected) {
  ExpectRejected(BatchOf(With(ValidRemoved(), "medium", Str("cpu"))), {"medium", "uppercase"});
  ExpectRejected(BatchOf(With(ValidStored(), "medium", Str(""))), {"medium", "empty"});
  ExpectRejected(BatchOf(With(ValidStored(), "medium", Nil())), {"medium", "got nil"});
}

TEST(KvEventDecode, DuplicateKnownKeyIsRejected) {
  Fields f = ValidRemoved();
  f.emplace_back("medium", Str("DISK"));
  ExpectRejected(BatchOf(f), {"duplicate", "medium"});
}

TEST(KvEventDecode, BatchLevelTypesAreChecked) {
  ExpectRejected(Pack({Str("now"), Events({}), Int(0)}), {"ts", "got str"});
  ExpectRejected(Pack({Ts(), Map({}), Int(0)}), {"events", "got map"});
  ExpectRejected(Pack({Ts(), Events({}), Str("0")}), {"dp_rank", "got str"});
  ExpectRejected(Pack({Ts(), Events({}), Int(int64_t{1} << 31)}), {"dp_rank", "int32"});
  ExpectRejected(Pack({Ts(), Events({Str("BlockStored")}), Int(0)}), {"events[0]", "got str"});
}

TEST(KvEventDecode, WrongScalarTypesInKnownFieldsAreRejected) {
  ExpectRejected(BatchOf(With(ValidStored(), "block_size", Str("16"))), {"block_size"});
  ExpectRejected(BatchOf(With(ValidStored(), "lora_id", Str("x"))), {"lora_id"});
  ExpectRejected(BatchOf(With(ValidStored(), "lora_name", Int(1))), {"lora_name"});
  ExpectRejected(BatchOf(With(ValidStored(), "group_idx", Nil())), {"group_idx", "nil"});
  ExpectRejected(BatchOf(With(ValidRemoved(), "object_key", Int(5))), {"object_key"});
  ExpectRejected(BatchOf(With(ValidRemoved(), "block_hashes", Int(5))), {"block_hashes"});
}

TEST(KvEventDecode, IntegerTsIsWidenedAndFloat32IsAccepted) {
  auto r = DecodeEventBatch(Pack({Int(1732900000), Events({}), Nil()}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->ts, 1732900000.0);
  EXPECT_EQ(r->dp_rank, std::nullopt);
  auto f = DecodeEventBatch(Pack({[](Packer& pk) { pk.pack_float(2.5f); }, Events({}), Int(1)}));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->ts, 2.5);
}

TEST(KvEventDecode, UnknownKeysAreIgnoredAsEveryConsumerDoes) {
  Fields f = ValidStored();
  f.emplace_back("kv_cache_spec_kind", Str("full_attention"));
  f.emplace_back("extra_keys", [](Packer& pk) {
    pk.pack_array(1);
    pk.pack_nil();
  });
  f.emplace_back("locality", Str("LOCAL"));
  auto r = DecodeEventBatch(BatchOf(f));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(std::get<BlockStored>(r->events[0]).session_id, "sess-1");
}

TEST(KvEventDecode, KeyOrderIsNotPartOfTheContractForReading) {
  Fields f = ValidStored();
  std::reverse(f.begin(), f.end());  // "type" last
  auto r = DecodeEventBatch(BatchOf(f));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::holds_alternative<BlockStored>(r->events[0]));
}

TEST(KvEventDecode, DeeplyNestedUnknownValueIsRejectedNotOverflowingTheStack) {
  std::string payload(
      "\x93\xcb\x41\xd9\xd2\x7d\x28\x00\x00\x00\x91\x82\xa4type\xac"
      "BlockRemoved\xa1x",
      30);
  payload += std::string(100000, '\x91');
  payload += std::string("\xc0\x00", 2);
  ExpectRejected(payload, {"not valid msgpack"});
}

}  // namespace
}  // namespace kvagent::events

// The KV-event codec against docs/events.md: golden bytes, smallest formats, round trips of every
// event type and optional-field combination, BlockHashFromKey, DescribeEvent, seq frames.
// Decoder rejections are in kv_event_decode_test.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "kvagent/events/kv_event.h"

namespace kvagent::events {
namespace {

// docs/events.md, "Golden example" (python-msgpack 1.0.3, use_bin_type=True), copied verbatim.
constexpr std::string_view kGoldenHex =
    "93cb41d9d27d280000009389a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573917b"
    "b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a"
    "6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa73657373696f6e5f6964"
    "a6736573732d3183a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573917ba66d65"
    "6469756da347505581a474797065b0416c6c426c6f636b73436c656172656400";

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

EventBatch GoldenBatch() {
  BlockStored stored;
  stored.block_hashes = {BlockHash::Unsigned(123)};
  stored.token_ids = {1, 2, 3, 4};
  stored.block_size = 4;
  stored.medium = "GPU";
  stored.session_id = "sess-1";
  BlockRemoved removed;
  removed.block_hashes = {BlockHash::Unsigned(123)};
  removed.medium = "GPU";
  return EventBatch{1732900000.0, {stored, removed, AllBlocksCleared{}}, 0};
}

TEST(KvEventCodec, EncoderReproducesTheGoldenBytesOfEventsMd) {
  const std::string payload = EncodeEventBatch(GoldenBatch());
  EXPECT_EQ(payload.size(), 208u);
  EXPECT_EQ(Hex(payload), kGoldenHex);
}

TEST(KvEventCodec, EncoderAppendsToWhatTheBufferAlreadyHolds) {
  std::string out = "prefix";
  EncodeEventBatch(GoldenBatch(), &out);
  EXPECT_EQ(out.substr(0, 6), "prefix");
  EXPECT_EQ(Hex(out.substr(6)), kGoldenHex);
}

TEST(KvEventCodec, DecoderReadsTheGoldenBytesBackToTheSameBatch) {
  const std::string payload = EncodeEventBatch(GoldenBatch());
  auto decoded = DecodeEventBatch(payload);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, GoldenBatch());
}

TEST(KvEventCodec, BatchBuilderProducesTheSameBytesAsEncodeEventBatch) {
  EventBatchBuilder builder;
  std::string payload;
  for (int round = 0; round < 3; ++round) {  // reuse of the builder's buffer is part of the test
    for (const KvEvent& e : GoldenBatch().events) builder.Add(e);
    EXPECT_EQ(builder.event_count(), 3u);
    EXPECT_GE(builder.payload_bound(), 208u);
    builder.Finish(1732900000.0, 0, &payload);
    EXPECT_EQ(Hex(payload), kGoldenHex) << "round " << round;
    EXPECT_TRUE(builder.empty());
  }
}

TEST(KvEventCodec, BatchBuilderRemoveLastTakesBackOnlyTheLastEvent) {
  EventBatchBuilder builder;
  const EventBatch golden = GoldenBatch();
  for (const KvEvent& e : golden.events) builder.Add(e);
  builder.Add(golden.events[0]);
  builder.RemoveLast();
  builder.RemoveLast();  // a second call without Add changes nothing
  std::string payload;
  builder.Finish(1732900000.0, 0, &payload);
  EXPECT_EQ(Hex(payload), kGoldenHex);
}

TEST(KvEventCodec, EmptyBatchWithNilRankIsThreeElements) {
  const std::string payload = EncodeEventBatch(EventBatch{1.5, {}, std::nullopt});
  // 0x93, float64 1.5, empty fixarray, nil.
  EXPECT_EQ(Hex(payload), "93cb3ff800000000000090c0");
}

TEST(KvEventCodec, IntegralTimestampIsStillFloat64) {
  // msgpack-c 4.1.3's pack_double would write 0.0 as the integer 0x00.
  EXPECT_EQ(Hex(EncodeEventBatch(EventBatch{0.0, {}, 7})), "93cb00000000000000009007");
}

// Finds `needle` in `haystack`, as hex, so that a failure prints something readable.
bool ContainsBytes(const std::string& haystack, std::string_view needle) {
  return Hex(haystack).find(Hex(needle)) != std::string::npos;
}

TEST(KvEventCodec, IntegersUseTheSmallestFormatAndSignednessOfTheHash) {
  BlockRemoved e;
  e.block_hashes = {BlockHash::Unsigned(0x7f),
                    BlockHash::Unsigned(0x80),
                    BlockHash::Unsigned(uint64_t{1} << 63),
                    BlockHash::Signed(-1),
                    BlockHash::Signed(-33),
                    BlockHash::Signed(std::numeric_limits<int64_t>::min()),
                    BlockHash::Signed(300)};
  const std::string payload = EncodeEventBatch(EventBatch{0, {e}, 0});
  const std::string expected_hashes =
      std::string("\x97", 1) + "\x7f" + std::string("\xcc\x80", 2) +
      std::string("\xcf\x80\x00\x00\x00\x00\x00\x00\x00", 9) + "\xff" + "\xd0\xdf" +
      std::string("\xd3\x80\x00\x00\x00\x00\x00\x00\x00", 9) + std::string("\xcd\x01\x2c", 3);
  EXPECT_TRUE(ContainsBytes(payload, expected_hashes)) << Hex(payload);
}

TEST(KvEventCodec, StringsUseStr8AndLongArraysUseArray16NeverBin) {
  BlockStored e;
  e.block_hashes.assign(20, BlockHash::Unsigned(1));
  e.token_ids.assign(320, 70000);  // uint32 format, array16 header
  e.block_size = 16;
  e.session_id = std::string(40, 's');  // 40 bytes: str8 (0xd9 0x28), not bin8 (0xc4)
  const std::string payload = EncodeEventBatch(EventBatch{0, {e}, 0});
  EXPECT_TRUE(ContainsBytes(payload, std::string("\xd9\x28", 2) + std::string(40, 's')));
  EXPECT_TRUE(ContainsBytes(payload, std::string("\xdc\x01\x40\xce\x00\x01\x11\x70", 8)));
  EXPECT_FALSE(ContainsBytes(payload, std::string("\xc4\x28", 2)));
}

TEST(KvEventCodec, EmptySessionIdIsOmittedLikeAnUntaggedObject) {
  EventBatch tagged_empty;
  tagged_empty.events.emplace_back(BlockStored{});
  std::get<BlockStored>(tagged_empty.events[0]).session_id.emplace();
  EventBatch untagged;
  untagged.events.emplace_back(BlockStored{});
  EXPECT_EQ(EncodeEventBatch(tagged_empty), EncodeEventBatch(untagged));
}

// What the decoder gives back for an event: the wire cannot tell a non-negative signed hash
// from an unsigned one, so those come back Unsigned.
BlockHash WireHash(BlockHash h) {
  if (h.is_signed && static_cast<int64_t>(h.bits) >= 0) return BlockHash::Unsigned(h.bits);
  return h;
}

KvEvent WireForm(KvEvent event) {
  auto fix = [](std::vector<BlockHash>& hs) {
    for (BlockHash& h : hs) h = WireHash(h);
  };
  if (auto* s = std::get_if<BlockStored>(&event)) {
    fix(s->block_hashes);
    if (s->parent_block_hash) s->parent_block_hash = WireHash(*s->parent_block_hash);
  } else if (auto* r = std::get_if<BlockRemoved>(&event)) {
    fix(r->block_hashes);
  }
  return event;
}

void ExpectRoundTrip(const EventBatch& batch) {
  const std::string payload = EncodeEventBatch(batch);
  auto decoded = DecodeEventBatch(payload);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->events.size(), batch.events.size());
  for (size_t i = 0; i < batch.events.size(); ++i) {
    EXPECT_EQ(decoded->events[i], WireForm(batch.events[i])) << DescribeEvent(batch.events[i]);
  }
  EXPECT_EQ(decoded->ts, batch.ts);
  EXPECT_EQ(decoded->dp_rank, batch.dp_rank);
  EXPECT_EQ(EncodeEventBatch(*decoded), payload);
}

TEST(KvEventCodec, EveryBlockStoredOptionalFieldCombinationRoundTrips) {
  // Bits: parent, lora_id, lora_name, group_idx, session_id, object_key, signed hashes.
  for (unsigned mask = 0; mask < (1u << 7); ++mask) {
    BlockStored e;
    const bool is_signed = mask & 64;
    e.block_hashes = {is_signed ? BlockHash::Signed(-5) : BlockHash::Unsigned(~uint64_t{0}),
                      BlockHash::Unsigned(7)};
    e.token_ids = {1, 2, 3, 4294967295u};
    e.block_size = 2;
    e.medium = (mask & 1) ? std::string(kMediumDisk) : std::string(kMediumExternal);
    if (mask & 1) e.parent_block_hash = is_signed ? BlockHash::Signed(-9) : BlockHash::Unsigned(9);
    if (mask & 2) e.lora_id = (mask & 64) ? -3 : 12;
    if (mask & 4) e.lora_name = "adapter-ü";
    if (mask & 8) e.group_idx = 0;
    if (mask & 16) e.session_id = "会话-" + std::to_string(mask);
    if (mask & 32) e.object_key = "model/layer 3/key\x01";
    SCOPED_TRACE("mask " + std::to_string(mask));
    ExpectRoundTrip(
        EventBatch{1732900000.25, {e}, (mask & 2) ? std::optional<int64_t>(3) : std::nullopt});
  }
}

TEST(KvEventCodec, BlockRemovedAndAllBlocksClearedRoundTripWithAndWithoutObjectKey) {
  BlockRemoved plain;
  plain.block_hashes = {BlockHash::Signed(std::numeric_limits<int64_t>::min())};
  BlockRemoved keyed;
  keyed.block_hashes = {};
  keyed.medium = std::string(kMediumDisk);
  keyed.object_key = "not-a-hash";
  ExpectRoundTrip(EventBatch{0.0, {plain, keyed, AllBlocksCleared{}, plain}, -1});
}

TEST(KvEventCodec, BlockStoredWithoutTokenIdsKeepsAnEmptyArray) {
  BlockStored e;
  e.block_hashes = {BlockHash::Unsigned(1), BlockHash::Unsigned(2)};
  e.block_size = 16;
  const std::string payload = EncodeEventBatch(EventBatch{0, {e}, 0});
  // "token_ids" followed by an empty fixarray (0x90), never nil (0xc0).
  EXPECT_TRUE(ContainsBytes(payload, std::string("\xa9token_ids\x90")));
  ExpectRoundTrip(EventBatch{0, {e}, 0});
}

// ---- StoredEventFor ------------------------------------------------------------------------

TEST(StoredEventFor, WithoutWriterMetadataHashesComeFromTheKey) {
  BlockStored e = StoredEventFor("12345", "sess-1");
  EXPECT_EQ(e.block_hashes, std::vector<BlockHash>{BlockHash::Unsigned(12345)});
  EXPECT_EQ(e.object_key, "12345");
  EXPECT_EQ(e.session_id, "sess-1");
  EXPECT_EQ(e.medium, "EXTERNAL");
  EXPECT_TRUE(e.token_ids.empty());
  EXPECT_FALSE(StoredEventFor("plain", "").session_id.has_value());
  EXPECT_TRUE(StoredEventFor("plain", "").block_hashes.empty());
}

TEST(StoredEventFor, WriterMetadataWinsOverTheKey) {
  BlockStored writer;
  writer.block_hashes = {BlockHash::Signed(-3)};
  writer.parent_block_hash = BlockHash::Unsigned(2);
  writer.token_ids = {1, 2};
  writer.block_size = 2;
  writer.lora_name = "adapter";
  writer.session_id = "ignored";  // the session comes from the argument
  BlockStored e = StoredEventFor("12345", "会话", writer);
  EXPECT_EQ(e.block_hashes, writer.block_hashes);
  EXPECT_EQ(e.parent_block_hash, writer.parent_block_hash);
  EXPECT_EQ(e.token_ids, writer.token_ids);
  EXPECT_EQ(e.lora_name, "adapter");
  EXPECT_EQ(e.session_id, "会话");
  EXPECT_EQ(e.object_key, "12345");
}

// ---- BlockHashFromKey ----------------------------------------------------------------------

TEST(BlockHashFromKey, DecimalKeyIsThatValueUnsigned) {
  EXPECT_EQ(BlockHashFromKey("12345"), BlockHash::Unsigned(12345));
  EXPECT_EQ(BlockHashFromKey("0"), BlockHash::Unsigned(0));
  EXPECT_EQ(BlockHashFromKey("007"), BlockHash::Unsigned(7));
}

TEST(BlockHashFromKey, U64MaxInDecimalAndHexIsUnsigned) {
  EXPECT_EQ(BlockHashFromKey("18446744073709551615"), BlockHash::Unsigned(~uint64_t{0}));
  EXPECT_EQ(BlockHashFromKey("0xffffffffffffffff"), BlockHash::Unsigned(~uint64_t{0}));
  EXPECT_EQ(BlockHashFromKey("0XFFFFFFFFFFFFFFFF"), BlockHash::Unsigned(~uint64_t{0}));
}

TEST(BlockHashFromKey, HexKeyWithPrefixIsThatValueUnsigned) {
  EXPECT_EQ(BlockHashFromKey("0x1f"), BlockHash::Unsigned(31));
  EXPECT_EQ(BlockHashFromKey("0xDeadBeef"), BlockHash::Unsigned(0xdeadbeef));
}

TEST(BlockHashFromKey, HexKeyThatOverflowsU64HasNoHash) {
  EXPECT_EQ(BlockHashFromKey("0x10000000000000000"), std::nullopt);
  EXPECT_EQ(BlockHashFromKey("0x"), std::nullopt);
  EXPECT_EQ(BlockHashFromKey("0xg1"), std::nullopt);
}

TEST(BlockHashFromKey, DecimalOverflowWithSixteenDigitsFallsToTheHexDigestRule) {
  // u64 max + 1 is not a u64, but it starts with 16 hex digits: "1844674407370955" as hex.
  EXPECT_EQ(BlockHashFromKey("18446744073709551616"),
            BlockHash::Signed(static_cast<int64_t>(0x1844674407370955ULL)));
}

TEST(BlockHashFromKey, ShortDecimalOverflowIsImpossibleAndShortJunkHasNoHash) {
  EXPECT_EQ(BlockHashFromKey("123abc"), std::nullopt);
  EXPECT_EQ(BlockHashFromKey("-5"), std::nullopt);
  EXPECT_EQ(BlockHashFromKey("+5"), std::nullopt);
  EXPECT_EQ(BlockHashFromKey(" 5"), std::nullopt);
  EXPECT_EQ(BlockHashFromKey(""), std::nullopt);
}

TEST(BlockHashFromKey, SixteenOrMoreLeadingHexDigitsGiveTheFirst64BitsSigned) {
  // hash_str_to_int64: int(s[:16], 16), minus 2**64 when >= 2**63.
  const std::string digest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  EXPECT_EQ(BlockHashFromKey(digest),
            BlockHash::Signed(static_cast<int64_t>(0xe3b0c44298fc1c14ULL)));
  EXPECT_EQ(BlockHashFromKey("0123456789abcdefXYZ/suffix"),
            BlockHash::Signed(0x0123456789abcdefLL));
  EXPECT_EQ(BlockHashFromKey("FFFFFFFFFFFFFFFF-upper"), BlockHash::Signed(-1));
  EXPECT_EQ(BlockHashFromKey("8000000000000000abc"),
            BlockHash::Signed(std::numeric_limits<int64_t>::min()));
}

TEST(BlockHashFromKey, ShortHexWithoutPrefixHasNoHash) {
  EXPECT_EQ(BlockHashFromKey("abcdef"), std::nullopt);
  EXPECT_EQ(BlockHashFromKey("0123456789abcde"), std::nullopt);         // 15 digits
  EXPECT_EQ(BlockHashFromKey("0123456789abcde-xyzxyz"), std::nullopt);  // 15 then junk
}

TEST(BlockHashFromKey, OrdinaryTextHasNoHash) {
  EXPECT_EQ(BlockHashFromKey("model/llama/layer0/block17"), std::nullopt);
  EXPECT_EQ(BlockHashFromKey("sess-1/some key that is long enough"), std::nullopt);
}

// ---- DescribeEvent and seq frames ------------------------------------------------------------

TEST(DescribeEvent, BlockStoredNamesMediumSessionHashesAndKey) {
  BlockStored e;
  e.block_hashes = {BlockHash::Unsigned(123), BlockHash::Signed(-4)};
  e.token_ids = {1, 2};
  e.block_size = 1;
  e.session_id = "sess-1";
  e.object_key = "k\n";
  EXPECT_EQ(DescribeEvent(e),
            "BlockStored EXTERNAL session=sess-1 hashes=[123,-4] parent=- tokens=2 "
            "block_size=1 key=k\\x0a");
}

TEST(DescribeEvent, LongHashListsAreShortenedAndOtherTypesAreOneWord) {
  BlockRemoved r;
  for (uint64_t i = 0; i < 10; ++i) r.block_hashes.push_back(BlockHash::Unsigned(i));
  EXPECT_EQ(DescribeEvent(r), "BlockRemoved EXTERNAL hashes=[0,1,2,3,4,5,6,7,...+2]");
  EXPECT_EQ(DescribeEvent(AllBlocksCleared{}), "AllBlocksCleared");
}

TEST(SeqFrame, IsEightBytesBigEndianAndRejectsOtherSizes) {
  EXPECT_EQ(EncodeSeq(5), std::string("\0\0\0\0\0\0\0\x05", 8));
  EXPECT_EQ(EncodeSeq(0x0102030405060708ULL), "\x01\x02\x03\x04\x05\x06\x07\x08");
  EXPECT_EQ(DecodeSeq(EncodeSeq(0x0102030405060708ULL)), 0x0102030405060708ULL);
  EXPECT_EQ(DecodeSeq(std::string(8, '\xff')), kReplayEndSeq);
  EXPECT_EQ(DecodeSeq(std::string(7, '\0')), std::nullopt);
  EXPECT_EQ(DecodeSeq(std::string(9, '\0')), std::nullopt);
}

}  // namespace
}  // namespace kvagent::events

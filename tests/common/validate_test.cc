#include "kvagent/common/validate.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvagent {
namespace {

using namespace std::string_literals;

TEST(Utf8Test, AcceptsAsciiAndMultiByteText) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("session-1"));
  EXPECT_TRUE(IsValidUtf8("sessão-é"));          // 2-byte
  EXPECT_TRUE(IsValidUtf8("会话-七"));           // 3-byte
  EXPECT_TRUE(IsValidUtf8("\xF0\x9F\x98\x80"));  // U+1F600, 4-byte
  EXPECT_TRUE(IsValidUtf8("\xF4\x8F\xBF\xBF"));  // U+10FFFF, the last code point
  EXPECT_TRUE(IsValidUtf8("\xED\x9F\xBF"));      // U+D7FF, just below the surrogates
  EXPECT_TRUE(IsValidUtf8("a\0b"s));             // NUL is a valid code point
}

struct BadUtf8Case {
  std::string text;
  size_t offset;
  std::string reason;
};

void PrintTo(const BadUtf8Case& c, std::ostream* os) { *os << c.reason << " @" << c.offset; }

class BadUtf8Test : public ::testing::TestWithParam<BadUtf8Case> {};

TEST_P(BadUtf8Test, ReportsOffsetAndReason) {
  const auto& c = GetParam();
  auto err = FindInvalidUtf8(c.text);
  ASSERT_TRUE(err.has_value()) << c.reason;
  EXPECT_EQ(err->offset, c.offset);
  EXPECT_EQ(std::string(err->reason), c.reason);
}

INSTANTIATE_TEST_SUITE_P(
    Rejections, BadUtf8Test,
    ::testing::Values(BadUtf8Case{"\xC0\xAF", 0, "overlong encoding"},  // '/' as 2 bytes
                      BadUtf8Case{"ab\xC1\xBF", 2, "overlong encoding"},
                      BadUtf8Case{"\xE0\x80\xAF", 0, "overlong encoding"},      // 3-byte overlong
                      BadUtf8Case{"\xF0\x80\x80\xAF", 0, "overlong encoding"},  // 4-byte overlong
                      BadUtf8Case{"\xED\xA0\x80", 0, "surrogate code point"},   // U+D800
                      BadUtf8Case{"x\xED\xBF\xBF", 1, "surrogate code point"},  // U+DFFF
                      BadUtf8Case{"\xF4\x90\x80\x80", 0, "code point above U+10FFFF"},
                      BadUtf8Case{"\xF5\x80\x80\x80", 0, "code point above U+10FFFF"},
                      BadUtf8Case{"\xFF", 0, "code point above U+10FFFF"},
                      BadUtf8Case{"abc\xE4\xBC", 3, "truncated sequence"},
                      BadUtf8Case{"\xF0\x9F\x98", 0, "truncated sequence"},
                      BadUtf8Case{"\x80", 0, "unexpected continuation byte"},
                      BadUtf8Case{"12345678\xBF", 8, "unexpected continuation byte"},
                      BadUtf8Case{"\xE4\x41\x41", 0, "invalid continuation byte"}));

TEST(ValidateKeyTest, EmptyKeyIsRejected) {
  Status s = ValidateKey("", "keys[0]");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(s.message(), "keys[0]: a key must not be empty");
}

TEST(ValidateKeyTest, LengthLimitIsInclusive) {
  EXPECT_TRUE(ValidateKey(std::string(kMaxKeyBytes, 'k')).ok());
  Status s = ValidateKey(std::string(kMaxKeyBytes + 1, 'k'));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidParams);
  EXPECT_NE(s.message().find("4097 bytes; the limit is 4096"), std::string::npos);
}

// The one List/Sessions page bound, shared by the SDK and the agent.
TEST(ValidateListTest, LimitIsInclusiveAndZeroAsksForTheDefault) {
  EXPECT_TRUE(ValidateListLimit(0).ok());
  EXPECT_TRUE(ValidateListLimit(kMaxListLimit).ok());
  const Status s = ValidateListLimit(kMaxListLimit + 1);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidParams);
  EXPECT_NE(s.message().find("next_cursor"), std::string::npos) << s.message();
}

TEST(ValidateListTest, PrefixIsAKeyStartThatMayBeEmpty) {
  EXPECT_TRUE(ValidateListPrefix("").ok());
  EXPECT_TRUE(ValidateListPrefix(std::string(kMaxKeyBytes, 'p')).ok());
  EXPECT_EQ(ValidateListPrefix(std::string(kMaxKeyBytes + 1, 'p')).code(),
            ErrorCode::kInvalidParams);
  EXPECT_EQ(ValidateListPrefix("p\xC0\x80").code(), ErrorCode::kInvalidParams);
}

TEST(ValidateSessionIdTest, EmptyMeansUntaggedAndIsValid) {
  EXPECT_TRUE(ValidateSessionId("").ok());
}

TEST(ValidateSessionIdTest, At256BytesValidAt257Rejected) {
  EXPECT_TRUE(ValidateSessionId(std::string(256, 's')).ok());
  Status s = ValidateSessionId(std::string(257, 's'), "session_ids[4]");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(s.message(), "session_ids[4]: session ID is 257 bytes; the limit is 256");
}

TEST(ValidateSessionIdTest, LimitCountsBytesNotCodePoints) {
  std::string id;
  for (int i = 0; i < 86; ++i) id += "会";  // 258 bytes, 86 code points
  EXPECT_FALSE(ValidateSessionId(id).ok());
}

TEST(ValidateSessionIdTest, InvalidUtf8NamesTheByte) {
  Status s = ValidateSessionId("sess\xED\xA0\x80", "session_ids[1]");
  EXPECT_EQ(s.message(), "session_ids[1]: invalid UTF-8 at byte 4 (surrogate code point)");
}

TEST(ValidateBufferRefTest, InsideArenaIsValid) {
  EXPECT_TRUE(ValidateBufferRef(0, 4096, 4096).ok());
  EXPECT_TRUE(ValidateBufferRef(4096, 0, 4096).ok());
}

TEST(ValidateBufferRefTest, PastTheEndIsOutOfRange) {
  EXPECT_EQ(ValidateBufferRef(1, 4096, 4096).code(), ErrorCode::kBufferOutOfRange);
  EXPECT_EQ(ValidateBufferRef(4097, 0, 4096).code(), ErrorCode::kBufferOutOfRange);
}

TEST(ValidateBufferRefTest, OverflowingRangeIsOutOfRange) {
  EXPECT_EQ(ValidateBufferRef(8, UINT64_MAX - 4, 1 << 20).code(), ErrorCode::kBufferOutOfRange);
}

// A block_size without its tokens would be published as token_ids [] with that block_size,
// which routers that hash each block's tokens (Dynamo) skip or fail on.
TEST(ValidateBlockMetaTest, ABlockSizeWithoutTokenIdsIsInvalidParamsSayingWhatToGive) {
  const Status st = ValidateBlockMeta(2, 0, 16, "", "blocks[3]");
  EXPECT_EQ(st.code(), ErrorCode::kInvalidParams);
  EXPECT_NE(st.message().find("blocks[3]: block_size 16 with no token IDs"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("block_size 0 when the tokens are not known"), std::string::npos);
}

TEST(ValidateBlockMetaTest, TokenCountMustMatchBlockSizeTimesBlocks) {
  EXPECT_TRUE(ValidateBlockMeta(2, 32, 16, "").ok());
  EXPECT_TRUE(ValidateBlockMeta(2, 0, 0, "").ok());  // tokens unknown
  EXPECT_FALSE(ValidateBlockMeta(2, 31, 16, "").ok());
  EXPECT_FALSE(ValidateBlockMeta(0, 0, 0, "").ok());
  EXPECT_FALSE(ValidateBlockMeta(1, 0, 0, "lora\xC0").ok());
  // Bounded: one key's metadata must fit a record of the master's log.
  EXPECT_TRUE(ValidateBlockMeta(kMaxBlockHashes, 0, 0, "").ok());
  EXPECT_FALSE(ValidateBlockMeta(kMaxBlockHashes + 1, 0, 0, "").ok());
  EXPECT_TRUE(ValidateBlockMeta(1, kMaxBlockTokens, kMaxBlockTokens, "").ok());
  EXPECT_FALSE(ValidateBlockMeta(1, kMaxBlockTokens + 1, kMaxBlockTokens + 1, "").ok());
  EXPECT_TRUE(ValidateBlockMeta(1, 0, 0, std::string(kMaxLoraNameBytes, 'l')).ok());
  EXPECT_FALSE(ValidateBlockMeta(1, 0, 0, std::string(kMaxLoraNameBytes + 1, 'l')).ok());
}

std::vector<std::string> Keys(size_t n) {
  std::vector<std::string> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back("key-" + std::to_string(i));
  return keys;
}

TEST(ValidateWriteKeysTest, ValidBatchWithAndWithoutTags) {
  auto keys = Keys(3);
  std::vector<std::string> ids = {"a", "", "会话"};
  auto key_at = [&](size_t i) -> std::string_view { return keys[i]; };
  auto id_at = [&](size_t i) -> std::string_view { return ids[i]; };
  EXPECT_TRUE(ValidateWriteKeys(3, key_at, 3, id_at).ok());
  EXPECT_TRUE(ValidateWriteKeys(3, key_at, 0, id_at).ok());
}

TEST(ValidateWriteKeysTest, MismatchedCountsAreRejected) {
  auto keys = Keys(3);
  std::vector<std::string> ids = {"a", "b"};
  Status s = ValidateWriteKeys(
      3, [&](size_t i) -> std::string_view { return keys[i]; }, 2,
      [&](size_t i) -> std::string_view { return ids[i]; });
  EXPECT_EQ(s.code(), ErrorCode::kInvalidParams);
  EXPECT_NE(s.message().find("session_ids has 2 entries for 3 keys"), std::string::npos);
}

TEST(ValidateWriteKeysTest, NamesTheFirstBadSessionId) {
  auto keys = Keys(3);
  std::vector<std::string> ids = {"ok", std::string(257, 'x'), "\xC0\xAF"};
  Status s = ValidateWriteKeys(
      3, [&](size_t i) -> std::string_view { return keys[i]; }, 3,
      [&](size_t i) -> std::string_view { return ids[i]; });
  EXPECT_EQ(s.message(), "session_ids[1]: session ID is 257 bytes; the limit is 256");
}

TEST(ValidateWriteKeysTest, EmptyAndOversizedBatchesAreRejected) {
  auto none = [](size_t) -> std::string_view { return "k"; };
  EXPECT_EQ(ValidateWriteKeys(0, none, 0, none).code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(ValidateWriteKeys(kMaxBatchKeys + 1, none, 0, none).code(), ErrorCode::kInvalidParams);
}

TEST(ValidateWriteKeysTest, NamesTheBadKey) {
  auto keys = Keys(3);
  keys[2] = "bad\xFF";
  Status s = ValidateKeys(3, [&](size_t i) -> std::string_view { return keys[i]; });
  EXPECT_EQ(s.message(), "keys[2]: invalid UTF-8 at byte 3 (code point above U+10FFFF)");
}

}  // namespace
}  // namespace kvagent

#include "kvagent/common/cluster_secret.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace kvagent {
namespace {

constexpr std::string_view kSecret = "correct horse battery staple, 32+ bytes long";

std::string Hex(std::span<const uint8_t> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 0xf];
  }
  return out;
}

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

class ClusterSecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvagent-secret-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, std::string_view content, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << content;
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  }

  std::string dir_;
};

// The expected values are computed independently (Python: hashlib.blake2b with digest_size=32,
// keyed with the BLAKE2b-256 of the secret; hmac with sha256): they pin the derivation, which is
// part of the protocol between members of different releases.
TEST(ClusterSecretTest, DerivationMatchesTheDocumentedConstruction) {
  Result<ClusterSecret> secret = ClusterSecret::FromBytes(kSecret);
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  EXPECT_EQ(secret->Fingerprint(), "8c21cb9600946577");
  const SymmetricKey mac_key = secret->MacKey(KeyPlane::kDataPlaneMac);
  EXPECT_EQ(Hex(mac_key), "bb65680216f297016ff62b7f63f693d315daabfaf5c47d6c43fe995edc243aec");
  EXPECT_EQ(Hex(HmacSha256(mac_key, Bytes("challenge"))),
            "4a6293103660909436b28a3c8879387afa2f1266720dcd55dc5c7df74778ba93");
}

TEST(ClusterSecretTest, TrailingWhitespaceDoesNotChangeTheSecret) {
  Result<ClusterSecret> bare = ClusterSecret::FromBytes(kSecret);
  Result<ClusterSecret> line = ClusterSecret::FromBytes(std::string(kSecret) + "\r\n \n");
  ASSERT_TRUE(bare.ok() && line.ok());
  EXPECT_EQ(bare->Fingerprint(), line->Fingerprint());
  Result<ClusterSecret> other = ClusterSecret::FromBytes(std::string(kSecret) + "!");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(bare->Fingerprint(), other->Fingerprint());
}

TEST(ClusterSecretTest, ShortSecretIsRefusedWithTheFix) {
  Result<ClusterSecret> secret = ClusterSecret::FromBytes("too short\n");
  ASSERT_FALSE(secret.ok());
  EXPECT_TRUE(secret.status().IsInvalidParams());
  EXPECT_NE(secret.status().message().find("at least 32"), std::string::npos);
  EXPECT_NE(secret.status().message().find("kvctl secret generate"), std::string::npos);
  EXPECT_FALSE(ClusterSecret::FromBytes(std::string(kClusterSecretMaxBytes + 1, 'x')).ok());
}

TEST(ClusterSecretTest, EveryPlaneAndRoleHasItsOwnKeys) {
  Result<ClusterSecret> secret = ClusterSecret::FromBytes(kSecret);
  ASSERT_TRUE(secret.ok());
  const CurvePlaneKeys rpc = secret->CurveKeys(KeyPlane::kMasterRpc);
  const CurvePlaneKeys events = secret->CurveKeys(KeyPlane::kEvents);
  EXPECT_NE(rpc.server.public_key, rpc.client.public_key);
  EXPECT_NE(rpc.server.public_key, events.server.public_key);
  EXPECT_NE(rpc.client.public_key, events.client.public_key);
  EXPECT_NE(secret->MacKey(KeyPlane::kDataPlaneMac), secret->MacKey(KeyPlane::kEvents));
  // Stable: the same secret gives the same keys every time.
  EXPECT_EQ(secret->CurveKeys(KeyPlane::kMasterRpc).server.secret_key, rpc.server.secret_key);
}

TEST(ClusterSecretTest, HmacVerificationRejectsAnyChange) {
  Result<ClusterSecret> secret = ClusterSecret::FromBytes(kSecret);
  ASSERT_TRUE(secret.ok());
  const SymmetricKey key = secret->MacKey(KeyPlane::kDataPlaneMac);
  MacTag tag = HmacSha256(key, Bytes("nonce-1"));
  EXPECT_TRUE(VerifyHmacSha256(key, Bytes("nonce-1"), tag));
  EXPECT_FALSE(VerifyHmacSha256(key, Bytes("nonce-2"), tag));
  EXPECT_FALSE(VerifyHmacSha256(key, Bytes("nonce-1"), std::span<const uint8_t>(tag).first(31)));
  tag[31] ^= 1;
  EXPECT_FALSE(VerifyHmacSha256(key, Bytes("nonce-1"), tag));
  Result<ClusterSecret> other = ClusterSecret::FromBytes(std::string(kSecret) + "?");
  ASSERT_TRUE(other.ok());
  tag[31] ^= 1;
  EXPECT_FALSE(VerifyHmacSha256(other->MacKey(KeyPlane::kDataPlaneMac), Bytes("nonce-1"), tag));
}

TEST(ClusterSecretTest, ConstantTimeEqualComparesSizeAndEveryByte) {
  EXPECT_TRUE(ConstantTimeEqual(Bytes("abc"), Bytes("abc")));
  EXPECT_FALSE(ConstantTimeEqual(Bytes("abc"), Bytes("abd")));
  EXPECT_FALSE(ConstantTimeEqual(Bytes("abc"), Bytes("abcd")));
  EXPECT_TRUE(ConstantTimeEqual(Bytes(""), Bytes("")));
}

TEST(ClusterSecretTest, RandomBytesFillTheBuffer) {
  std::array<uint8_t, 32> a{}, b{};
  RandomBytes(a);
  RandomBytes(b);
  EXPECT_NE(a, b);  // 2^-256 chance of a false failure
}

TEST_F(ClusterSecretFileTest, LoadsAnOwnerOnlyFile) {
  const std::string path = Write("secret", std::string(kSecret) + "\n", 0600);
  Result<ClusterSecret> secret = ClusterSecret::LoadFromFile(path);
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  EXPECT_EQ(secret->Fingerprint(), "8c21cb9600946577");
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  EXPECT_TRUE(ClusterSecret::LoadFromFile(path).ok());
}

TEST_F(ClusterSecretFileTest, GroupOrWorldAccessIsRefusedWithChmodHint) {
  for (mode_t mode : {0644, 0640, 0604, 0620, 0602}) {
    const std::string path = Write("secret", kSecret, mode);
    Result<ClusterSecret> secret = ClusterSecret::LoadFromFile(path);
    ASSERT_FALSE(secret.ok()) << std::oct << mode;
    EXPECT_TRUE(secret.status().IsInvalidParams());
    EXPECT_NE(secret.status().message().find("chmod 600 " + path), std::string::npos)
        << secret.status().message();
  }
}

TEST_F(ClusterSecretFileTest, MissingDirectoryAndShortFilesAreClearErrors) {
  Result<ClusterSecret> missing = ClusterSecret::LoadFromFile(dir_ + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos);
  Result<ClusterSecret> directory = ClusterSecret::LoadFromFile(dir_);
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos);
  Result<ClusterSecret> short_one = ClusterSecret::LoadFromFile(Write("s", "short\n", 0600));
  ASSERT_FALSE(short_one.ok());
  EXPECT_NE(short_one.status().message().find(dir_ + "/s"), std::string::npos);
  EXPECT_NE(short_one.status().message().find("at least 32"), std::string::npos);
  EXPECT_FALSE(ClusterSecret::LoadFromFile("").ok());
}

TEST_F(ClusterSecretFileTest, FileOwnedBySomeoneElseIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  const std::string path = Write("secret", kSecret, 0600);
  ASSERT_EQ(::chown(path.c_str(), 12345, 12345), 0);
  Result<ClusterSecret> secret = ClusterSecret::LoadFromFile(path);
  ASSERT_FALSE(secret.ok());
  EXPECT_NE(secret.status().message().find("owned by uid 12345"), std::string::npos);
}

TEST_F(ClusterSecretFileTest, GenerateWritesALoadableOwnerOnlyFileAndNeverOverwrites) {
  const std::string path = dir_ + "/generated";
  ASSERT_TRUE(GenerateClusterSecretFile(path).ok());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Result<ClusterSecret> first = ClusterSecret::LoadFromFile(path);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Status again = GenerateClusterSecretFile(path);
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("never overwritten"), std::string::npos);
  Result<ClusterSecret> still = ClusterSecret::LoadFromFile(path);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(first->Fingerprint(), still->Fingerprint());
  const std::string other = dir_ + "/generated2";
  ASSERT_TRUE(GenerateClusterSecretFile(other).ok());
  EXPECT_NE(ClusterSecret::LoadFromFile(other)->Fingerprint(), first->Fingerprint());
}

}  // namespace
}  // namespace kvagent

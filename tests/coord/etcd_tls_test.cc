// etcd over TLS against a real etcd that asks every client for a certificate
// (--client-cert-auth): a client with the CA and a certificate the CA signed reads, writes,
// transacts and watches; every other client fails with an error that says what to check, and
// nothing it sent reaches etcd. With etcd's user authentication on, a client acts as its user
// (only on the keys the user's role allows) and authenticates again when etcd forgot its token.
// Certificates and a password renewed in place are used without a restart. The options are
// checked before any connection.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "agent_process.h"
#include "etcd_process.h"
#include "kvagent/coord/cluster_address.h"
#include "kvagent/coord/etcd_client.h"
#include "kvagent/coord/etcd_watch.h"
#include "test_pki.h"

namespace kvagent::coord {
namespace {

using testing::EtcdProcess;
using testing::TempDir;
using namespace std::chrono_literals;

bool Has(const Status& st, const std::string& text) {
  return st.message().find(text) != std::string::npos;
}

class EtcdOverTls : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(access(testing::kOpensslBinary, X_OK), 0) << "openssl is not installed (make deps)";
    ASSERT_TRUE(testing::MakeTestPki(dir_.path(), &pki_))
        << "see " << dir_.path() << "/openssl.log";
    etcd_.ServeTls(pki_.server_cert, pki_.server_key, pki_.ca,
                   Tls(pki_.client_cert, pki_.client_key));
    ASSERT_TRUE(etcd_.Start()) << "etcd did not start; see " << etcd_.log_path();
  }
  EtcdTls Tls(std::string cert, std::string key, std::string ca = "") const {
    return EtcdTls{true, ca.empty() ? pki_.ca : ca, std::move(cert), std::move(key)};
  }
  Result<std::optional<EtcdKeyValue>> GetWith(const EtcdTls& tls, std::string endpoint = "") {
    auto c = EtcdClient::Create({{endpoint.empty() ? etcd_.endpoint() : endpoint}, 2000ms, tls});
    if (!c.ok()) return c.status();
    return (*c)->Get("/tls/k");
  }
  Status PutWith(const EtcdTls& tls, const std::string& value) {
    auto c = EtcdClient::Create({{etcd_.endpoint()}, 2000ms, tls});
    if (!c.ok()) return c.status();
    return (*c)->Put("/tls/k", value);
  }
  TempDir dir_;
  testing::TestPki pki_;
  EtcdProcess etcd_{dir_.path()};
};

TEST_F(EtcdOverTls, AClientWithTheCaAndItsCertificateReadsWritesTransactsAndWatches) {
  const EtcdTls tls = Tls(pki_.client_cert, pki_.client_key);
  auto c = EtcdClient::Create({{etcd_.endpoint()}, 2000ms, tls});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  int64_t revision = 0;
  ASSERT_TRUE((*c)->Get("/tls/k", &revision).ok());
  auto watch = EtcdWatch::Open({{etcd_.endpoint()}, 2000ms, tls}, "/tls/", revision + 1, true);
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  ASSERT_TRUE((*c)->Put("/tls/k", "v1").ok());
  auto created = (*c)->CreateIfAbsent("/tls/leader", "me", 0);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_TRUE(created->created);
  auto got = (*c)->Get("/tls/k");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->value, "v1");
  std::vector<EtcdEvent> seen;
  ASSERT_TRUE(testing::WaitUntil([&] {
    auto e = (*watch)->Next(100ms);
    if (e.ok()) seen.insert(seen.end(), e->begin(), e->end());
    return seen.size() >= 2;
  }));
  EXPECT_EQ(seen[0].kv.key, "/tls/k");
  EXPECT_EQ(seen[1].kv.key, "/tls/leader");
  // A user given for an etcd whose authentication is off: etcd says so, and calls and watches
  // go through without a token.
  EtcdClientOptions as_user{{etcd_.endpoint()}, 2000ms, tls, EtcdAuth{"kv", "kv-password"}};
  auto u = EtcdClient::Create(as_user);
  ASSERT_TRUE(u.ok());
  const Status put = (*u)->Put("/tls/k", "v2");
  EXPECT_TRUE(put.ok()) << put.ToString();
  auto user_watch = EtcdWatch::Open(as_user, "/tls/", 0, true);
  EXPECT_TRUE(user_watch.ok()) << user_watch.status().ToString();
}

TEST_F(EtcdOverTls, EveryOtherClientFailsSayingWhatToCheckAndChangesNothing) {
  ASSERT_TRUE(PutWith(Tls(pki_.client_cert, pki_.client_key), "original").ok());
  struct Case {
    const char* what;
    EtcdTls tls;
    std::string endpoint;
    std::string says;
  };
  const std::vector<Case> cases = {
      // etcd's certificate cannot be checked against the system's CAs.
      {"without the CA", EtcdTls{true, "", pki_.client_cert, pki_.client_key}, "", "TLS: "},
      // A CA that did not sign etcd's certificate.
      {"with another CA", Tls(pki_.client_cert, pki_.client_key, dir_.path() + "/pki/rogue-ca.pem"),
       "", "TLS: "},
      // etcd asks for a client certificate and gets none.
      {"without a client certificate", Tls("", ""), "", "--etcd-cert-file"},
      // A certificate etcd's CA did not sign.
      {"with a certificate of another CA", Tls(pki_.rogue_cert, pki_.rogue_key), "",
       "--etcd-cert-file"},
      // etcd's certificate names 127.0.0.1, not "localhost".
      {"by a name its certificate does not carry", Tls(pki_.client_cert, pki_.client_key),
       "localhost:" + std::to_string(etcd_.port()), "TLS: "},
      // Plain HTTP to a TLS port.
      {"over plain HTTP", EtcdTls{}, "", "if etcd speaks TLS there"},
  };
  for (const Case& c : cases) {
    auto put =
        EtcdClient::Create({{c.endpoint.empty() ? etcd_.endpoint() : c.endpoint}, 1000ms, c.tls});
    ASSERT_TRUE(put.ok()) << c.what << ": " << put.status().ToString();
    const Status st = (*put)->Put("/tls/k", "overwritten");
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_TRUE(Has(st, c.says)) << c.what << ": " << st.ToString();
    auto watch = EtcdWatch::Open(
        {{c.endpoint.empty() ? etcd_.endpoint() : c.endpoint}, 1000ms, c.tls}, "/tls/", 0, true);
    EXPECT_FALSE(watch.ok()) << c.what;
  }
  auto got = GetWith(Tls(pki_.client_cert, pki_.client_key));
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->value, "original");
}

TEST_F(EtcdOverTls, AUserActsOnItsKeysOnlyAndAuthenticatesAgainAfterAnEtcdRestart) {
  ASSERT_TRUE(etcd_.EnableAuth("kv", "kv-password", {"/kvagent/"})) << "see " << etcd_.log_path();
  EtcdClientOptions as_kv{{etcd_.endpoint()},
                          2000ms,
                          Tls(pki_.client_cert, pki_.client_key),
                          EtcdAuth{"kv", "kv-password"}};
  auto c = EtcdClient::Create(as_kv);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  int64_t revision = 0;
  const auto first = (*c)->Get("/kvagent/k", &revision);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto watch = EtcdWatch::Open(as_kv, "/kvagent/", revision + 1, true);
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  ASSERT_TRUE((*c)->Put("/kvagent/k", "v1").ok());
  auto lease = (*c)->GrantLease(5s);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE((*c)->KeepAlive(lease->id).ok());
  std::vector<EtcdEvent> seen;
  ASSERT_TRUE(testing::WaitUntil([&] {
    auto e = (*watch)->Next(100ms);
    if (e.ok()) seen.insert(seen.end(), e->begin(), e->end());
    return !seen.empty();
  }));
  EXPECT_EQ(seen[0].kv.value, "v1");
  // Outside its role's prefix: refused, saying what to grant.
  const Status outside = (*c)->Put("/elsewhere", "x");
  EXPECT_FALSE(outside.ok());
  EXPECT_TRUE(Has(outside, "permission denied")) << outside.ToString();
  EXPECT_TRUE(Has(outside, "grant-permission")) << outside.ToString();
  EXPECT_FALSE(EtcdWatch::Open(as_kv, "/elsewhere", 0).ok());
  // etcd keeps its tokens in memory: after a restart the client's token may mean nothing (etcd
  // 3.4 replays the authentications its backend had not committed), and the client then
  // authenticates again by itself.
  ASSERT_TRUE(etcd_.Restart()) << "see " << etcd_.log_path();
  Status again;
  ASSERT_TRUE(testing::WaitUntil([&] {
    again = (*c)->Put("/kvagent/k", "v2");
    return again.code() != ErrorCode::kMasterUnavailable;  // etcd answers
  })) << again.ToString();
  EXPECT_TRUE(again.ok()) << again.ToString();
  auto got = (*c)->Get("/kvagent/k");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->value, "v2");

  // A wrong password, or no user: nothing.
  EtcdClientOptions wrong = as_kv;
  wrong.auth.password = "not-it";
  auto w = EtcdClient::Create(wrong);
  ASSERT_TRUE(w.ok());
  const Status refused = (*w)->Put("/kvagent/k", "overwritten");
  EXPECT_EQ(refused.code(), ErrorCode::kInvalidParams) << refused.ToString();
  EXPECT_TRUE(Has(refused, "etcd refused user kv")) << refused.ToString();
  EXPECT_TRUE(Has(refused, "--etcd-password-file")) << refused.ToString();
  EXPECT_FALSE(EtcdWatch::Open(wrong, "/kvagent/", 0).ok());
  EtcdClientOptions anonymous = as_kv;
  anonymous.auth = {};
  auto a = EtcdClient::Create(anonymous);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE((*a)->Put("/kvagent/k", "overwritten").ok());
  got = (*c)->Get("/kvagent/k");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->value, "v2");
}

// Certificates and passwords are renewed while the processes run: each new TLS connection reads
// the CA, certificate and key files, and each authentication reads the password file. Here all
// of them change at once, as a renewal tool writes them (beside the old file, then renamed over
// it), with etcd restarted on a certificate of a new CA that asks clients for certificates of
// that CA, and the user's password changed: the client that ran before goes on without a restart.
TEST_F(EtcdOverTls, RenewedCertificatesAndAChangedPasswordAreUsedWithoutARestart) {
  ASSERT_TRUE(etcd_.EnableAuth("kv", "kv-password", {"/kvagent/"})) << "see " << etcd_.log_path();
  const std::string next = dir_.path() + "/next", live = dir_.path() + "/live";
  ASSERT_EQ(::mkdir(next.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir(live.c_str(), 0700), 0);
  testing::TestPki renewed;
  ASSERT_TRUE(testing::MakeTestPki(next, &renewed)) << "see " << next << "/openssl.log";
  auto install = [&](const std::string& name, const std::string& content) {
    const std::string file = live + "/" + name;
    std::ofstream(file + ".new") << content;
    ::chmod((file + ".new").c_str(), 0600);
    std::filesystem::rename(file + ".new", file);
  };
  auto read = [](const std::string& file) {
    std::ifstream in(file);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto install_pki = [&](const testing::TestPki& pki, const std::string& password) {
    install("ca.pem", read(pki.ca));
    install("client.pem", read(pki.client_cert));
    install("client.key", read(pki.client_key));
    install("password", password + "\n");
  };
  install_pki(pki_, "kv-password");
  auto address = ParseClusterAddress("etcds://" + etcd_.endpoint() + "/c").value();
  EtcdAccessFlags flags;
  flags.ca_file = live + "/ca.pem";
  flags.cert_file = live + "/client.pem";
  flags.key_file = live + "/client.key";
  flags.user = "kv";
  flags.password_file = live + "/password";
  ASSERT_TRUE(flags.Apply(&address).ok());
  auto c = EtcdClient::Create(address.Etcd(2000ms));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const Status before = (*c)->Put("/kvagent/before", "1");
  ASSERT_TRUE(before.ok()) << before.ToString();

  ASSERT_TRUE(etcd_.ChangePassword("kv", "kv-password-2")) << "see " << etcd_.log_path();
  install_pki(renewed, "kv-password-2");
  etcd_.ServeTls(renewed.server_cert, renewed.server_key, renewed.ca,
                 EtcdTls{true, renewed.ca, renewed.client_cert, renewed.client_key});
  ASSERT_TRUE(etcd_.Restart()) << "see " << etcd_.log_path();
  Status after;
  ASSERT_TRUE(testing::WaitUntil([&] {
    after = (*c)->Put("/kvagent/after", "2");
    return after.ok();
  })) << after.ToString();
  for (const char* key : {"/kvagent/before", "/kvagent/after"}) {
    auto got = (*c)->Get(key);
    ASSERT_TRUE(got.ok() && got->has_value()) << key << ": " << got.status().ToString();
  }
  auto watch = EtcdWatch::Open(address.Etcd(2000ms), "/kvagent/", 0, true);
  EXPECT_TRUE(watch.ok()) << watch.status().ToString();
  // A password file gone when the client must authenticate again: MASTER_UNAVAILABLE naming the
  // file, and the client goes on once the file is back. A password change makes etcd drop the
  // user's tokens at once; a restart does not always (etcd 3.4 replays the authentications
  // its backend had not committed yet, and their tokens are valid again).
  ASSERT_EQ(::unlink((live + "/password").c_str()), 0);
  ASSERT_TRUE(etcd_.ChangePassword("kv", "kv-password-3")) << "see " << etcd_.log_path();
  Status missing;
  EXPECT_TRUE(testing::WaitUntil([&] {
    missing = (*c)->Put("/kvagent/after", "3");
    return Has(missing, "cannot authenticate to etcd");
  })) << missing.ToString();
  EXPECT_EQ(missing.code(), ErrorCode::kMasterUnavailable);
  EXPECT_TRUE(Has(missing, "--etcd-password-file " + live + "/password")) << missing.ToString();
  install("password", "kv-password-3\n");
  const Status back = (*c)->Put("/kvagent/after", "4");
  EXPECT_TRUE(back.ok()) << back.ToString();
  // The files of before the renewal no longer pass: the renewed ones were used.
  install_pki(pki_, "kv-password");
  auto stale = EtcdClient::Create(address.Etcd(2000ms));
  ASSERT_TRUE(stale.ok());
  EXPECT_FALSE((*stale)->Get("/kvagent/after").ok());
}

TEST(EtcdTlsOptions, AreCheckedBeforeAnyConnectionAndNameTheFlag) {
  TempDir dir;
  const std::string file = dir.path() + "/some.pem";
  std::ofstream(file) << "x\n";
  auto refused = [](const EtcdTls& tls, const std::string& says) {
    const Status st = CheckEtcdTls(tls);
    return !st.ok() && st.code() == ErrorCode::kInvalidParams && Has(st, says);
  };
  EXPECT_TRUE(refused(EtcdTls{false, file, "", ""}, "etcds://"));  // files without TLS
  EXPECT_TRUE(refused(EtcdTls{true, "", file, ""}, "--etcd-key-file"));
  EXPECT_TRUE(refused(EtcdTls{true, "", "", file}, "--etcd-cert-file"));
  EXPECT_TRUE(refused(EtcdTls{true, dir.path() + "/missing.pem", "", ""},
                      "--etcd-ca-file " + dir.path() + "/missing.pem: No such file"));
  EXPECT_TRUE(refused(EtcdTls{true, dir.path(), "", ""}, "not a regular file"));
  EXPECT_TRUE(CheckEtcdTls(EtcdTls{true, file, file, file}).ok());
  EXPECT_TRUE(CheckEtcdTls(EtcdTls{true, "", "", ""}).ok());  // the system's CAs
  EXPECT_FALSE(EtcdClient::Create({{"127.0.0.1:1"}, 300ms, EtcdTls{false, file, "", ""}}).ok());
  EXPECT_FALSE(
      EtcdWatch::Open({{"127.0.0.1:1"}, 300ms, EtcdTls{true, "", file, ""}}, "/k", 0).ok());
}

TEST(EtcdTlsOptions, AUserNeedsTlsAndAPasswordFileOnlyItsOwnerMayRead) {
  TempDir dir;
  const std::string password = dir.path() + "/password";
  std::ofstream(password) << "s3cret\nignored\n";
  ::chmod(password.c_str(), 0644);
  auto tls = ParseClusterAddress("etcds://127.0.0.1:2379/c").value();
  EtcdAccessFlags flags;
  flags.user = "kv";
  flags.password_file = password;
  Status st = flags.Apply(&tls);
  EXPECT_TRUE(Has(st, "chmod 600")) << st.ToString();  // group and others may read it
  ::chmod(password.c_str(), 0600);
  ASSERT_TRUE(flags.Apply(&tls).ok());
  EXPECT_EQ(tls.auth.user, "kv");
  EXPECT_EQ(tls.auth.password, "s3cret");  // the first line
  EXPECT_EQ(tls.Etcd(1000ms).auth.password, "s3cret");
  auto plain = ParseClusterAddress("etcd://127.0.0.1:2379/c").value();
  st = flags.Apply(&plain);
  EXPECT_TRUE(Has(st, "needs etcd over TLS")) << st.ToString();
  EtcdAccessFlags no_password;
  no_password.user = "kv";
  st = no_password.Apply(&tls);
  EXPECT_TRUE(Has(st, "--etcd-password-file")) << st.ToString();
  EtcdAccessFlags no_user;
  no_user.password_file = password;
  st = no_user.Apply(&tls);
  EXPECT_TRUE(Has(st, "needs --etcd-user")) << st.ToString();
  std::ofstream(dir.path() + "/empty") << "\n";
  ::chmod((dir.path() + "/empty").c_str(), 0600);
  EtcdAccessFlags empty;
  empty.user = "kv";
  empty.password_file = dir.path() + "/empty";
  st = empty.Apply(&tls);
  EXPECT_TRUE(Has(st, "holds no password")) << st.ToString();
}

TEST(EtcdTlsOptions, AddressesSayTlsByTheirScheme) {
  auto a = ParseClusterAddress("etcds://10.0.0.1:2379,10.0.0.2:2379/prod");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->tls.enabled);
  EXPECT_EQ(a->ToString(), "etcds://10.0.0.1:2379,10.0.0.2:2379/prod");
  EXPECT_TRUE(a->Etcd(1000ms).tls.enabled);
  EXPECT_TRUE(IsClusterAddress("etcds://h:1/c"));
  auto plain = ParseClusterAddress("etcd://10.0.0.1:2379/prod");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->tls.enabled);
  EXPECT_FALSE(ParseClusterAddress("etcds://10.0.0.1/prod").ok());
  std::vector<std::string> endpoints;
  bool https = false;
  ASSERT_TRUE(ParseEtcdEndpoints("https://h1:2379,https://h2:2379/", &endpoints, &https).ok());
  EXPECT_TRUE(https);
  EXPECT_EQ(endpoints, (std::vector<std::string>{"h1:2379", "h2:2379"}));
  ASSERT_TRUE(ParseEtcdEndpoints("h1:2379,http://h2:2379", &endpoints, &https).ok());
  EXPECT_FALSE(https);
  const Status mixed = ParseEtcdEndpoints("https://h1:2379,h2:2379", &endpoints, &https);
  EXPECT_FALSE(mixed.ok());
  EXPECT_TRUE(Has(mixed, "mix https://")) << mixed.ToString();
  EXPECT_FALSE(ParseEtcdEndpoints("https://h1:2379", &endpoints).ok());  // where TLS is not taken
}

}  // namespace
}  // namespace kvagent::coord

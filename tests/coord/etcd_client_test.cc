// EtcdClient and EtcdWatch against a real etcd: keys, the create-revision transactions an
// election rests on, leases, failing over between endpoints, and what a client sees when etcd is
// not there or not etcd.
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "agent_process.h"
#include "etcd_process.h"
#include "kvagent/coord/etcd_client.h"
#include "kvagent/coord/etcd_watch.h"

namespace kvagent::coord {
namespace {

using testing::EtcdProcess;
using testing::TempDir;
using namespace std::chrono_literals;

class Etcd : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(etcd_.Start()) << "etcd did not start; see " << etcd_.log_path();
    auto c = EtcdClient::Create({{etcd_.endpoint()}, 2000ms});
    ASSERT_TRUE(c.ok());
    client_ = std::move(*c);
  }
  TempDir dir_;
  EtcdProcess etcd_{dir_.path()};
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(Etcd, KeysAndValuesAreBytes) {
  const std::string key("/k/\0\xff binary", 13);
  const std::string value("v\0\x01\x80", 4);
  ASSERT_TRUE(client_->Put(key, value).ok());
  ASSERT_TRUE(client_->Put("/k/other", "x").ok());
  ASSERT_TRUE(client_->Put("/l/outside", "y").ok());
  int64_t revision = 0;
  auto got = client_->Get(key, &revision);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, value);
  EXPECT_EQ((*got)->version, 1);
  EXPECT_GE(revision, (*got)->mod_revision);
  auto missing = client_->Get("/k/missing");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  auto all = client_->GetPrefix("/k/");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);  // not /l/outside
}

TEST_F(Etcd, OnlyTheFirstCreateWinsAndOnlyItsCreatorMayReplaceIt) {
  auto first = client_->CreateIfAbsent("/e/leader", "one", 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(first->created);
  auto second = client_->CreateIfAbsent("/e/leader", "two", 0);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->created);
  ASSERT_TRUE(second->existing.has_value());
  EXPECT_EQ(second->existing->value, "one");
  EXPECT_EQ(second->existing->create_revision, first->create_revision);

  auto wrong = client_->PutIfCreatedAt("/e/leader", "x", 0, first->create_revision + 100);
  ASSERT_TRUE(wrong.ok());
  EXPECT_FALSE(*wrong);
  auto right = client_->PutIfCreatedAt("/e/leader", "one+", 0, first->create_revision);
  ASSERT_TRUE(right.ok());
  EXPECT_TRUE(*right);
  auto after = client_->Get("/e/leader");
  EXPECT_EQ((*after)->value, "one+");
  EXPECT_EQ((*after)->create_revision, first->create_revision);  // a put keeps it

  EXPECT_FALSE(*client_->DeleteIfCreatedAt("/e/leader", first->create_revision + 1));
  EXPECT_TRUE(*client_->DeleteIfCreatedAt("/e/leader", first->create_revision));
  auto again = client_->CreateIfAbsent("/e/leader", "three", 0);
  ASSERT_TRUE(again.ok() && again->created);
  EXPECT_GT(again->create_revision, first->create_revision);  // epochs only grow
}

TEST_F(Etcd, KeysOnALeaseGoWithIt) {
  auto lease = client_->GrantLease(5s);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_GE(lease->ttl.count(), 2);
  ASSERT_TRUE(client_->Put("/lease/k", "v", lease->id).ok());
  auto ttl = client_->KeepAlive(lease->id);
  ASSERT_TRUE(ttl.ok());
  EXPECT_GT(ttl->count(), 0);
  ASSERT_TRUE(client_->RevokeLease(lease->id).ok());
  EXPECT_FALSE(client_->Get("/lease/k")->has_value());
  auto gone = client_->KeepAlive(lease->id);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->count(), 0);                        // etcd no longer has it
  EXPECT_TRUE(client_->RevokeLease(lease->id).ok());  // revoking again is fine
  auto expiring = client_->GrantLease(1s);            // raised to etcd's minimum
  ASSERT_TRUE(expiring.ok());
  ASSERT_TRUE(client_->Put("/lease/short", "v", expiring->id).ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return !client_->Get("/lease/short")->has_value(); }));
}

TEST_F(Etcd, AClientMovesOnToTheNextEndpoint) {
  const std::string dead = "127.0.0.1:" + std::to_string(testing::UnusedPort());
  auto c = EtcdClient::Create({{dead, etcd_.endpoint()}, 2000ms});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Put("/f/k", "v").ok());
  EXPECT_EQ((*c)->endpoint(), etcd_.endpoint());
  EXPECT_EQ((*(*c)->Get("/f/k"))->value, "v");
}

TEST(EtcdClientAlone, NoEtcdIsUnavailableWithinTheTimeoutAndSaysWhere) {
  const std::string dead = "127.0.0.1:" + std::to_string(testing::UnusedPort());
  auto c = EtcdClient::Create({{dead}, 300ms});
  ASSERT_TRUE(c.ok());
  auto got = (*c)->Get("/x");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), ErrorCode::kMasterUnavailable);
  EXPECT_NE(got.status().message().find(dead), std::string::npos) << got.status().message();
  EXPECT_FALSE(EtcdClient::Create({{}, 300ms}).ok());
  EXPECT_FALSE(EtcdClient::Create({{"no-port"}, 300ms}).ok());
}

// Answers the n-th connection with the n-th body (HTTP 200, JSON), then closes it.
class CannedHttp {
 public:
  explicit CannedHttp(std::vector<std::string> bodies) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    listen(fd_, 8);
    endpoint_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    thread_ = std::thread([this, bodies = std::move(bodies)] {
      for (const std::string& body : bodies) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[4096];
        (void)!read(c, buf, sizeof(buf));
        const std::string reply =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            "Content-Length: " +
            std::to_string(body.size()) + "\r\n\r\n" + body;
        (void)!write(c, reply.data(), reply.size());
        close(c);
      }
    });
  }
  ~CannedHttp() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  int fd_ = -1;
  std::string endpoint_;
  std::thread thread_;
};

TEST(EtcdClientAlone, AServerThatIsNotEtcdGetsAClearErrorNotAHang) {
  CannedHttp not_etcd({"not json!", "not json!"});  // HTTP, but not etcd's JSON
  auto c = EtcdClient::Create({{not_etcd.endpoint()}, 2000ms});
  auto got = (*c)->Get("/x");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), ErrorCode::kInternal);
  EXPECT_NE(got.status().message().find("not JSON"), std::string::npos) << got.status().message();
  auto w = EtcdWatch::Open({{not_etcd.endpoint()}, 2000ms}, "/x", 0);
  EXPECT_FALSE(w.ok());
}

// etcd's answers come over plain HTTP: a compromised etcd, or whoever sits on the path, writes
// them. Fields of another type than etcd's own must fail the call, never throw out of the
// library (nlohmann's value() throws on a type mismatch: an uncaught throw ended kvagent and
// kvmaster, found by fuzz_etcd_answer).
TEST(EtcdClientAlone, AnswersWithFieldsOfTheWrongTypeFailTheCallNotTheProcess) {
  {  // CreateIfAbsent: a failed txn whose first response is not an object.
    CannedHttp etcd({R"({"header":{"revision":"3"},"succeeded":false,"responses":[5]})"});
    auto c = EtcdClient::Create({{etcd.endpoint()}, 2000ms});
    ASSERT_TRUE(c.ok());
    auto created = (*c)->CreateIfAbsent("/k", "v", 0);
    ASSERT_FALSE(created.ok());
    EXPECT_EQ(created.status().code(), ErrorCode::kInternal) << created.status().ToString();
  }
  {  // A watch confirmed, then an event whose type is a number.
    CannedHttp etcd({R"({"result":{"created":true}})"
                     "\n"
                     R"({"result":{"events":[{"type":5,"kv":{}}]}})"
                     "\n"});
    auto w = EtcdWatch::Open({{etcd.endpoint()}, 2000ms}, "/x", 0);
    Status st = w.ok() ? (*w)->Next(2000ms).status() : w.status();
    EXPECT_NE(st.message().find("type is not a name"), std::string::npos) << st.ToString();
  }
  {  // A canceled flag that is a string or a number: not a cancellation, and no crash.
    CannedHttp etcd({R"({"result":{"created":true,"canceled":"x"}})"
                     "\n"
                     R"({"result":{"canceled":1}})"
                     "\n"});
    auto w = EtcdWatch::Open({{etcd.endpoint()}, 2000ms}, "/x", 0);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto events = (*w)->Next(2000ms);  // no events; the stream ends after them
    if (events.ok()) events = (*w)->Next(2000ms);
    EXPECT_FALSE(events.ok());
  }
}

TEST_F(Etcd, AWatchSeesEveryChangeInOrderAndReportsABrokenStream) {
  int64_t revision = 0;
  ASSERT_TRUE(client_->Get("/w/k", &revision).ok());
  auto watch = EtcdWatch::Open({{etcd_.endpoint()}, 2000ms}, "/w/", revision + 1, true);
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  ASSERT_TRUE(client_->Put("/w/a", "1").ok());
  ASSERT_TRUE(client_->Put("/w/b", "2").ok());
  ASSERT_TRUE(client_->Put("/x/outside", "3").ok());
  auto lease = client_->GrantLease(5s);
  ASSERT_TRUE(client_->Put("/w/a", "4", lease->id).ok());
  ASSERT_TRUE(client_->RevokeLease(lease->id).ok());
  std::vector<EtcdEvent> seen;
  ASSERT_TRUE(testing::WaitUntil([&] {
    auto e = (*watch)->Next(100ms);
    if (e.ok()) seen.insert(seen.end(), e->begin(), e->end());
    return seen.size() >= 4;
  }));
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].kv.key, "/w/a");
  EXPECT_EQ(seen[0].kv.value, "1");
  EXPECT_EQ(seen[1].kv.key, "/w/b");
  EXPECT_EQ(seen[2].kv.value, "4");
  EXPECT_EQ(seen[3].type, EtcdEvent::Type::kDelete);  // the lease took it
  EXPECT_EQ(seen[3].kv.key, "/w/a");

  etcd_.Kill();
  bool broke = false;
  ASSERT_TRUE(testing::WaitUntil([&] {
    broke = !(*watch)->Next(100ms).ok();
    return broke;
  }));
}

}  // namespace
}  // namespace kvagent::coord

// The /metrics endpoint against the clients it meets: scrapers, and whoever else reaches the
// port (idle connections, requests a byte at a time, clients that never read, malformed heads).
#include "kvagent/common/metrics_http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "http_request_head.h"
#include "kvagent/common/unique_fd.h"

namespace kvagent::metrics {
namespace {

using namespace std::chrono_literals;

constexpr const char* kScrape = "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n";

// Long enough that no connection in these tests is cut off by the server's timeout: what they
// check is that a slow client never holds off another one, not that slow clients time out.
MetricsHttpLimits Patient(size_t max_connections = 64) {
  MetricsHttpLimits limits;
  limits.max_connections = max_connections;
  limits.request_timeout = std::chrono::minutes(10);
  return limits;
}

std::unique_ptr<MetricsHttpServer> Serve(MetricsHttpServer::RenderFn render,
                                         const MetricsHttpLimits& limits) {
  auto started = MetricsHttpServer::Start("127.0.0.1:0", std::move(render), limits);
  EXPECT_TRUE(started.ok()) << started.status().ToString();
  return started.ok() ? std::move(started.value()) : nullptr;
}

UniqueFd Connect(int port) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  // A bound on every read below: a test that would wait longer fails instead of hanging.
  timeval bound{60, 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
  return fd;
}

void SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// Everything the server sends until it closes.
std::string ReadToEnd(int fd) {
  std::string out;
  char buffer[65536];
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      EXPECT_EQ(n, 0) << "no answer within the bound";
      return out;
    }
    out.append(buffer, static_cast<size_t>(n));
  }
}

std::string Exchange(int port, std::string_view request) {
  UniqueFd fd = Connect(port);
  SendAll(fd.get(), request);
  return ReadToEnd(fd.get());
}

std::string StatusLine(const std::string& answer) { return answer.substr(0, answer.find("\r\n")); }

std::string Body(const std::string& answer) {
  const size_t end = answer.find("\r\n\r\n");
  return end == std::string::npos ? "" : answer.substr(end + 4);
}

// Whether the server still holds `fd` open (nothing to read, no end of stream), without waiting.
bool StillOpen(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

TEST(MetricsHttp, AnswersEachKindOfRequestWithItsCodeAndClosesTheConnection) {
  auto server = Serve([] { return std::string("kvagent_up 1\n"); }, Patient());
  ASSERT_TRUE(server);
  const int port = server->port();
  EXPECT_EQ(server->url(), "http://127.0.0.1:" + std::to_string(port) + "/metrics");

  const std::string ok = Exchange(port, kScrape);
  EXPECT_EQ(StatusLine(ok), "HTTP/1.1 200 OK");
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos);
  EXPECT_NE(ok.find("Content-Length: 13\r\n"), std::string::npos);
  EXPECT_NE(ok.find("Connection: close\r\n"), std::string::npos);
  EXPECT_EQ(Body(ok), "kvagent_up 1\n");

  const std::string head = Exchange(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(StatusLine(head), "HTTP/1.1 200 OK");
  EXPECT_NE(head.find("Content-Length: 13\r\n"), std::string::npos);
  EXPECT_EQ(Body(head), "");

  EXPECT_EQ(Body(Exchange(port, "GET /metrics?x=1 HTTP/1.1\n\n")), "kvagent_up 1\n");
  EXPECT_EQ(StatusLine(Exchange(port, "GET / HTTP/1.1\r\n\r\n")), "HTTP/1.1 404 Not Found");
  EXPECT_EQ(StatusLine(Exchange(port, "GET /metrics/x HTTP/1.1\r\n\r\n")),
            "HTTP/1.1 404 Not Found");
  const std::string post = Exchange(port, "POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_EQ(StatusLine(post), "HTTP/1.1 405 Method Not Allowed");
  EXPECT_NE(post.find("Allow: GET, HEAD\r\n"), std::string::npos);
  for (const char* bad :
       {"garbage\r\n\r\n", "GET /metrics HTTP/2.0\r\n\r\n", "GET metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1\r\n folded\r\n\r\n", "GET /metrics HTTP/1.1\r\nNo colon\r\n\r\n",
        "GET /me\x01trics HTTP/1.1\r\n\r\n"}) {
    EXPECT_EQ(StatusLine(Exchange(port, bad)), "HTTP/1.1 400 Bad Request") << bad;
  }
  const std::string huge = "GET /metrics HTTP/1.1\r\nX: " + std::string(10000, 'a') + "\r\n\r\n";
  EXPECT_EQ(StatusLine(Exchange(port, huge)), "HTTP/1.1 431 Request Header Fields Too Large");
  // Still serving after all of them.
  EXPECT_EQ(Body(Exchange(port, kScrape)), "kvagent_up 1\n");
}

// A request with a body the endpoint does not read (a POST of 1 MiB): the answer reaches the
// client whole. Closing with the body unread would send a reset that can discard the answer
// before the client reads it, so the server shuts its side and reads the rest first.
TEST(MetricsHttp, AnAnswerToARequestWithAnUnreadBodyArrivesWhole) {
  auto server = Serve([] { return std::string("a 1\n"); }, Patient());
  ASSERT_TRUE(server);
  for (int round = 0; round < 5; ++round) {
    UniqueFd fd = Connect(server->port());
    const std::string body(1 << 20, 'b');
    const std::string head =
        "POST /metrics HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
    std::thread sender([&] {
      SendAll(fd.get(), head);
      SendAll(fd.get(), body);
      shutdown(fd.get(), SHUT_WR);
    });
    const std::string answer = ReadToEnd(fd.get());
    sender.join();
    EXPECT_EQ(StatusLine(answer), "HTTP/1.1 405 Method Not Allowed") << "round " << round;
  }
}

TEST(MetricsHttp, ARequestArrivingAByteAtATimeIsServed) {
  auto server = Serve([] { return std::string("a 1\n"); }, Patient());
  ASSERT_TRUE(server);
  UniqueFd fd = Connect(server->port());
  for (const char* p = kScrape; *p != '\0'; ++p) SendAll(fd.get(), std::string_view(p, 1));
  EXPECT_EQ(Body(ReadToEnd(fd.get())), "a 1\n");
}

// With one thread per connection (CivetWeb's model, one worker), three idle connections held a
// scrape off for three request timeouts (30 s, past Prometheus' default scrape timeout).
TEST(MetricsHttp, IdleAndSlowClientsDoNotHoldOffAScrape) {
  auto server = Serve([] { return std::string("a 1\n"); }, Patient());
  ASSERT_TRUE(server);
  std::vector<UniqueFd> held;
  for (int i = 0; i < 20; ++i) held.push_back(Connect(server->port()));  // send nothing
  for (int i = 0; i < 10; ++i) {
    held.push_back(Connect(server->port()));
    SendAll(held.back().get(), "GET /metr");  // and the rest never
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Body(Exchange(server->port(), kScrape)), "a 1\n");
  // Answered while every slow client was still connected: none of them was in the way.
  for (const UniqueFd& fd : held) EXPECT_TRUE(StillOpen(fd.get()));
}

TEST(MetricsHttp, PastTheConnectionCapTheOldestUnfinishedRequestIsClosed) {
  auto server = Serve([] { return std::string("a 1\n"); }, Patient(/*max_connections=*/8));
  ASSERT_TRUE(server);
  std::vector<UniqueFd> held;
  for (int i = 0; i < 8; ++i) held.push_back(Connect(server->port()));
  // The ninth connection (the scrape) takes the slot of the oldest idle one.
  EXPECT_EQ(Body(Exchange(server->port(), kScrape)), "a 1\n");
  char byte;
  EXPECT_EQ(recv(held[0].get(), &byte, 1, 0), 0) << "the oldest idle connection is closed";
  for (size_t i = 1; i < held.size(); ++i) EXPECT_TRUE(StillOpen(held[i].get())) << i;
  // A flood of connections never leaves more than the cap open, and a scrape still gets in.
  std::vector<UniqueFd> flood;
  for (int i = 0; i < 100; ++i) flood.push_back(Connect(server->port()));
  EXPECT_EQ(Body(Exchange(server->port(), kScrape)), "a 1\n");
  int open = 0;
  for (const UniqueFd& fd : flood) {
    // The server closed the others before it read the scrape: their end of stream is queued.
    pollfd p{fd.get(), POLLIN, 0};
    if (poll(&p, 1, 0) == 0) ++open;
  }
  EXPECT_LE(open, 8);
}

TEST(MetricsHttp, AClientThatNeverReadsItsAnswerHoldsOffNoOne) {
  const std::string big(8 << 20, 'x');  // far more than the socket buffers take
  auto server = Serve([&] { return big; }, Patient());
  ASSERT_TRUE(server);
  UniqueFd stuck = Connect(server->port());
  SendAll(stuck.get(), kScrape);  // and never reads
  const std::string answer = Exchange(server->port(), kScrape);
  EXPECT_EQ(Body(answer).size(), big.size());
}

TEST(MetricsHttp, AClientSilentPastTheTimeoutIsCutOff) {
  MetricsHttpLimits limits;
  limits.request_timeout = 200ms;
  auto server = Serve([] { return std::string("a 1\n"); }, limits);
  ASSERT_TRUE(server);
  UniqueFd idle = Connect(server->port());
  char byte;
  EXPECT_EQ(recv(idle.get(), &byte, 1, 0), 0) << "closed by the server within the 60 s bound";
}

TEST(MetricsHttp, AnAddressThatCannotBeUsedIsRefusedByName) {
  auto server = Serve([] { return std::string(); }, Patient());
  ASSERT_TRUE(server);
  const std::string taken = "127.0.0.1:" + std::to_string(server->port());
  auto again = MetricsHttpServer::Start(taken, [] { return std::string(); });
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("cannot serve metrics on " + taken), std::string::npos)
      << again.status().ToString();
  auto malformed = MetricsHttpServer::Start("127.0.0.1", [] { return std::string(); });
  ASSERT_FALSE(malformed.ok());
  EXPECT_EQ(malformed.status().code(), ErrorCode::kInvalidParams);
  auto v6 = MetricsHttpServer::Start("[::1]:0", [] { return std::string("v6 1\n"); });
  if (v6.ok()) {  // where the machine has IPv6
    EXPECT_NE(v6.value()->url().find("http://[::1]:"), std::string::npos);
  }
}

TEST(MetricsHttp, ListenAddressesAreHostPortWithAnyPortFromZero) {
  for (const char* good :
       {"127.0.0.1:9478", "0.0.0.0:0", "localhost:65535", "[::1]:9478", "::1:9478"}) {
    EXPECT_TRUE(CheckListenAddress(good, "--metrics-listen").ok()) << good;
  }
  EXPECT_EQ(CheckListenAddress("9478", "--metrics-listen").message(),
            "--metrics-listen: '9478' is not HOST:PORT: it has no port (e.g. 127.0.0.1:9478, or "
            "0.0.0.0:9478 for every interface)");
  for (const char* bad : {"127.0.0.1:65536", "127.0.0.1:", ":9478", "tcp://127.0.0.1:9478",
                          "*:9478", "127.0.0.1:9478x"}) {
    Status refused = CheckListenAddress(bad, "--metrics-listen");
    EXPECT_TRUE(refused.IsInvalidParams()) << bad;
    EXPECT_EQ(refused.message().rfind(
                  std::string("--metrics-listen: '") + bad + "' is not HOST:PORT: ", 0),
              0u)
        << refused.ToString();
  }
}

TEST(HttpRequestHead, FindsTheEndOfAHeadArrivingInAnyPieces) {
  const std::string text = std::string(kScrape) + "trailing";
  const size_t whole = FindRequestHeadEnd(text, 0);
  ASSERT_EQ(whole, std::string(kScrape).size());
  for (size_t piece = 1; piece <= text.size(); ++piece) {
    size_t end = std::string::npos, searched = 0;
    for (size_t have = 0; have < text.size() && end == std::string::npos;) {
      have = std::min(text.size(), have + piece);
      end = FindRequestHeadEnd(std::string_view(text).substr(0, have), searched);
      searched = have;
    }
    EXPECT_EQ(end, whole) << "pieces of " << piece;
  }
  EXPECT_EQ(FindRequestHeadEnd("GET / HTTP/1.1\r\nX: y\r\n", 0), std::string::npos);
  EXPECT_EQ(FindRequestHeadEnd("GET / HTTP/1.1\n\n", 0), 16u);
}

TEST(HttpRequestHead, KeepsMethodAndPathAndRefusesOtherShapes) {
  RequestHead r;
  ASSERT_EQ(ParseRequestHead("\r\nHEAD /metrics?a=b HTTP/1.0\r\nX-Y: 1\t2\r\n\r\n", &r),
            HeadShape::kRequest);
  EXPECT_EQ(r.method, "HEAD");
  EXPECT_EQ(r.path, "/metrics");
  for (const char* bad :
       {"", "\r\n", "GET /metrics HTTP/1.1\r\n", "GET /metrics HTTP/1.1\r\n\r\nextra",
        "GET  /metrics HTTP/1.1\r\n\r\n", "GET /metrics HTTP/1.1 \r\n\r\n",
        "G(T /metrics HTTP/1.1\r\n\r\n", "GET http://h/metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1\r\n: empty name\r\n\r\n", "GET /metrics HTTP/1.1\r\nX: a\rb\r\n\r\n",
        "\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n"}) {
    EXPECT_EQ(ParseRequestHead(bad, &r), HeadShape::kMalformed) << bad;
  }
}

}  // namespace
}  // namespace kvagent::metrics

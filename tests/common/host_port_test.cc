#include "kvagent/common/host_port.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <string>

#include "kvagent/common/tcp_socket.h"

namespace kvagent {
namespace {

HostPortRules StrictHostPort() { return HostPortRules{}; }

HostPortRules TcpListenHostPort() {
  HostPortRules rules;
  rules.scheme = "tcp://";
  rules.star_is_every_interface = true;
  rules.port_zero = true;
  return rules;
}

// The message of a refused `text`; fails the test when `text` is taken.
std::string HostPortRefusal(std::string_view text, const HostPortRules& rules) {
  auto parsed = ParseHostPort(text, "--listen", rules);
  EXPECT_FALSE(parsed.ok()) << text << " was taken";
  EXPECT_TRUE(parsed.status().IsInvalidParams()) << parsed.status().ToString();
  return parsed.status().message();
}

TEST(HostPort, ReadsHostAndPort) {
  auto v4 = ParseHostPort("10.0.0.2:7100", "--listen", StrictHostPort());
  ASSERT_TRUE(v4.ok()) << v4.status().ToString();
  EXPECT_EQ(v4->host, "10.0.0.2");
  EXPECT_EQ(v4->port, 7100);
  auto name = ParseHostPort("node-7.example_net:65535", "--listen", StrictHostPort());
  ASSERT_TRUE(name.ok()) << name.status().ToString();
  EXPECT_EQ(name->host, "node-7.example_net");
  EXPECT_EQ(name->port, 65535);
}

TEST(HostPort, ReadsTheSchemeTheCallerNames) {
  auto parsed = ParseHostPort("tcp://127.0.0.1:50051", "endpoint", TcpListenHostPort());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->host, "127.0.0.1");
  EXPECT_EQ(parsed->port, 50051);
  EXPECT_EQ(HostPortRefusal("127.0.0.1:50051", TcpListenHostPort()),
            "--listen '127.0.0.1:50051' is not tcp://HOST:PORT: it does not start with tcp://");
  EXPECT_EQ(HostPortRefusal("tcp://127.0.0.1:50051", StrictHostPort()),
            "--listen 'tcp://127.0.0.1:50051' is not HOST:PORT: it has a scheme; write HOST:PORT "
            "without one");
}

TEST(HostPort, StarIsEveryInterfaceOnlyWhereTheCallerTakesIt) {
  auto any = ParseHostPort("tcp://*:0", "endpoint", TcpListenHostPort());
  ASSERT_TRUE(any.ok()) << any.status().ToString();
  EXPECT_EQ(any->host, "");
  EXPECT_EQ(any->port, 0);
  EXPECT_NE(
      HostPortRefusal("*:9478", StrictHostPort()).find("'*' (every interface) is not taken here"),
      std::string::npos);
  EXPECT_NE(HostPortRefusal("tcp://[*]:1", TcpListenHostPort()).find("has '*'"), std::string::npos);
}

TEST(HostPort, Ipv6HostsGoInBrackets) {
  auto loopback = ParseHostPort("[::1]:7100", "--listen", StrictHostPort());
  ASSERT_TRUE(loopback.ok()) << loopback.status().ToString();
  EXPECT_EQ(loopback->host, "::1");
  EXPECT_EQ(loopback->port, 7100);
  auto scoped = ParseHostPort("[fe80::1%eth0]:7100", "--listen", StrictHostPort());
  ASSERT_TRUE(scoped.ok()) << scoped.status().ToString();
  EXPECT_EQ(scoped->host, "fe80::1%eth0");
  EXPECT_NE(HostPortRefusal("::1:7100", StrictHostPort())
                .find("an IPv6 host goes in brackets: [ADDR]:PORT"),
            std::string::npos);
  EXPECT_NE(HostPortRefusal("[::1:7100", StrictHostPort()).find("'[' has no closing ']'"),
            std::string::npos);
  EXPECT_NE(HostPortRefusal("[::1]", StrictHostPort()).find("it has no port"), std::string::npos);
}

TEST(HostPort, UnbracketedIpv6TakesThePortAfterTheLastColonWhereAllowed) {
  HostPortRules rules;
  rules.unbracketed_ipv6 = true;
  auto parsed = ParseHostPort("::1:7100", "--listen", rules);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->host, "::1");
  EXPECT_EQ(parsed->port, 7100);
}

TEST(HostPort, RefusesAMissingPort) {
  EXPECT_EQ(HostPortRefusal("10.0.0.2", StrictHostPort()),
            "--listen '10.0.0.2' is not HOST:PORT: it has no port");
  EXPECT_NE(HostPortRefusal("10.0.0.2:", StrictHostPort()).find("it has no port"),
            std::string::npos);
  EXPECT_NE(HostPortRefusal("tcp://10.0.0.2", TcpListenHostPort()).find("it has no port"),
            std::string::npos);
}

TEST(HostPort, RefusesPortsOutOfRange) {
  EXPECT_EQ(HostPortRefusal("10.0.0.2:65536", StrictHostPort()),
            "--listen '10.0.0.2:65536' is not HOST:PORT: port '65536' is too large; a port is a "
            "number from 1 to 65535");
  EXPECT_NE(HostPortRefusal("10.0.0.2:99999999999999999999", StrictHostPort()).find("is too large"),
            std::string::npos);
  EXPECT_EQ(HostPortRefusal("10.0.0.2:0", StrictHostPort()),
            "--listen '10.0.0.2:0' is not HOST:PORT: port 0 is not taken here; a port is a number "
            "from 1 to 65535");
  auto zero = ParseHostPort("tcp://10.0.0.2:0", "endpoint", TcpListenHostPort());
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  EXPECT_EQ(zero->port, 0);
  EXPECT_NE(HostPortRefusal("tcp://10.0.0.2:65536", TcpListenHostPort()).find("from 0 to 65535"),
            std::string::npos);
}

TEST(HostPort, RefusesAnEmptyHostUnlessTheCallerTakesItAsEveryInterface) {
  EXPECT_EQ(HostPortRefusal(":7100", StrictHostPort()),
            "--listen ':7100' is not HOST:PORT: the host is empty");
  EXPECT_NE(HostPortRefusal("[]:7100", StrictHostPort()).find("the host is empty"),
            std::string::npos);
  HostPortRules rules;
  rules.empty_host = true;
  for (const char* any : {":7100", "[]:7100"}) {
    auto parsed = ParseHostPort(any, "--listen", rules);
    ASSERT_TRUE(parsed.ok()) << any << ": " << parsed.status().ToString();
    EXPECT_EQ(parsed->host, "") << any;
    EXPECT_EQ(parsed->port, 7100) << any;
  }
}

TEST(HostPort, RefusesGarbage) {
  for (const char* garbage :
       {"", ":", "garbage", "[", "[]", "]:1", "a]:1", "ho st:80", "h/x:80", "\x01:80", "tcp://"}) {
    HostPortRefusal(garbage, StrictHostPort());
  }
  EXPECT_EQ(HostPortRefusal("ho st:80", StrictHostPort()),
            "--listen 'ho st:80' is not HOST:PORT: the host 'ho st' has ' ', which is in no "
            "address or name");
  EXPECT_NE(HostPortRefusal("10.0.0.2:-1", StrictHostPort()).find("port '-1' is not a number"),
            std::string::npos);
  EXPECT_NE(HostPortRefusal("10.0.0.2:+1", StrictHostPort()).find("port '+1' is not a number"),
            std::string::npos);
}

TEST(HostPort, RefusesTrailingCharacters) {
  EXPECT_EQ(HostPortRefusal("10.0.0.2:80x", StrictHostPort()),
            "--listen '10.0.0.2:80x' is not HOST:PORT: port '80x' is not a number; a port is a "
            "number from 1 to 65535");
  EXPECT_NE(HostPortRefusal("10.0.0.2:80 ", StrictHostPort()).find("port '80 ' is not a number"),
            std::string::npos);
  EXPECT_NE(
      HostPortRefusal("tcp://10.0.0.2:80/", TcpListenHostPort()).find("port '80/' is not a number"),
      std::string::npos);
  EXPECT_EQ(HostPortRefusal("[::1]x:80", StrictHostPort()),
            "--listen '[::1]x:80' is not HOST:PORT: 'x:80' follows ']'; write [ADDR]:PORT");
}

TEST(HostPort, JoinsIpv6HostsInBrackets) {
  EXPECT_EQ(JoinHostPort("10.0.0.2", 7100), "10.0.0.2:7100");
  EXPECT_EQ(JoinHostPort("fd00::2", 7100), "[fd00::2]:7100");
  EXPECT_EQ(JoinHostPort("", 0), ":0");
}

TEST(HostPort, WritesSocketAddressesAsJoinHostPortDoes) {
  sockaddr_storage v4{};
  auto* s4 = reinterpret_cast<sockaddr_in*>(&v4);
  s4->sin_family = AF_INET;
  s4->sin_port = htons(7100);
  ASSERT_EQ(inet_pton(AF_INET, "10.0.0.2", &s4->sin_addr), 1);
  EXPECT_EQ(SocketAddressText(v4), "10.0.0.2:7100");
  sockaddr_storage v6{};
  auto* s6 = reinterpret_cast<sockaddr_in6*>(&v6);
  s6->sin6_family = AF_INET6;
  s6->sin6_port = htons(9);
  ASSERT_EQ(inet_pton(AF_INET6, "fd00::2", &s6->sin6_addr), 1);
  EXPECT_EQ(SocketAddressText(v6), "[fd00::2]:9");
  sockaddr_storage unix_socket{};
  unix_socket.ss_family = AF_UNIX;
  EXPECT_EQ(SocketAddressText(unix_socket), "");
}

TEST(HostPort, ResolvesNumericHostsAndEveryInterface) {
  auto loopback = ResolveHostPort(HostPort{"127.0.0.1", 7100}, /*passive=*/false);
  ASSERT_TRUE(loopback.ok()) << loopback.status().ToString();
  ASSERT_EQ(loopback->get()->ai_family, AF_INET);
  const auto* v4 = reinterpret_cast<const sockaddr_in*>(loopback->get()->ai_addr);
  EXPECT_EQ(ntohs(v4->sin_port), 7100);
  EXPECT_EQ(ntohl(v4->sin_addr.s_addr), INADDR_LOOPBACK);
  auto any = ResolveHostPort(HostPort{"", 0}, /*passive=*/true);
  ASSERT_TRUE(any.ok()) << any.status().ToString();
}

// The framed transport's tcp://HOST:PORT (tcp_socket.h) reads its endpoints with ParseHostPort.
// kvmaster's endpoints as ZMQ reads them: a listener may say port 0, a peer's endpoint may not.
TEST(HostPort, TcpEndpointRulesTakeZmqFormsAndPortZeroOnlyForAListener) {
  for (const char* text : {"tcp://*:0", "tcp://::1:0", "tcp://127.0.0.1:0"}) {
    EXPECT_TRUE(ParseHostPort(text, "--listen", TcpEndpointRules(true)).ok()) << text;
    EXPECT_FALSE(ParseHostPort(text, "endpoint", TcpEndpointRules(false)).ok()) << text;
  }
  auto star = ParseHostPort("tcp://*:50052", "endpoint", TcpEndpointRules(false));
  ASSERT_TRUE(star.ok());
  EXPECT_EQ(star->host, "");
  EXPECT_FALSE(ParseHostPort("127.0.0.1:50052", "endpoint", TcpEndpointRules(false)).ok());
}

TEST(HostPort, TcpSocketsTakeEveryFormTheyTookBefore) {
  std::string bound;
  auto star = ListenTcp("tcp://*:0", &bound);
  ASSERT_TRUE(star.ok()) << star.status().ToString();
  EXPECT_EQ(bound.rfind("tcp://", 0), 0u) << bound;
  auto loopback = ListenTcp("tcp://127.0.0.1:0", &bound);
  ASSERT_TRUE(loopback.ok()) << loopback.status().ToString();
  EXPECT_EQ(bound.rfind("tcp://127.0.0.1:", 0), 0u) << bound;
  auto connected = ConnectTcp(bound);
  EXPECT_TRUE(connected.ok()) << connected.status().ToString();
  auto v6 = ListenTcp("tcp://[::1]:0", &bound);
  if (v6.ok()) {  // where the machine has IPv6
    EXPECT_EQ(bound.rfind("tcp://[::1]:", 0), 0u) << bound;
  }
  for (const char* bad : {"127.0.0.1:0", "tcp://127.0.0.1", "tcp://127.0.0.1:65536", "tcp://:0",
                          "tcp://127.0.0.1:0x"}) {
    auto refused = ListenTcp(bad, &bound);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_TRUE(refused.status().IsInvalidParams()) << refused.status().ToString();
    EXPECT_NE(refused.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << refused.status().ToString();
  }
  auto nowhere = ConnectTcp("tcp://127.0.0.1:0");
  ASSERT_FALSE(nowhere.ok());
  EXPECT_NE(nowhere.status().message().find("name a host and a port"), std::string::npos);
}

}  // namespace
}  // namespace kvagent

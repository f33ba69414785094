#include "kvagent/transfer/endpoint.h"

#include <gtest/gtest.h>

namespace kvagent::transfer {
namespace {

TEST(EndpointTest, ParsesTcpAndRdmaEndpoints) {
  auto tcp = ParseEndpoint("tcp://10.0.0.2:7100");
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  EXPECT_EQ(tcp->scheme, Scheme::kTcp);
  EXPECT_EQ(tcp->host, "10.0.0.2");
  EXPECT_EQ(tcp->port, 7100);
  auto rdma = ParseEndpoint("rdma://192.168.1.9:20000");
  ASSERT_TRUE(rdma.ok());
  EXPECT_EQ(rdma->scheme, Scheme::kRdma);
  EXPECT_EQ(rdma->ToString(), "rdma://192.168.1.9:20000");
}

TEST(EndpointTest, Ipv6HostsAreBracketedAndCanonical) {
  auto v6 = ParseEndpoint("tcp://[fd00:0:0::2]:7100");
  ASSERT_TRUE(v6.ok()) << v6.status().ToString();
  EXPECT_EQ(v6->host, "fd00::2");
  EXPECT_EQ(v6->ToString(), "tcp://[fd00::2]:7100");
  EXPECT_FALSE(ParseEndpoint("tcp://fd00::2:7100").ok());
  EXPECT_FALSE(ParseEndpoint("tcp://[fd00::2:7100").ok());
}

TEST(EndpointTest, RejectsWhatCannotBeConnectedTo) {
  for (const char* bad :
       {"", "10.0.0.2:7100", "udp://10.0.0.2:7100", "tcp://10.0.0.2",
        "tcp://10.0.0.2:", "tcp://10.0.0.2:0", "tcp://10.0.0.2:65536", "tcp://10.0.0.2:71x",
        "tcp://node-7:7100", "tcp://:7100", "tcp://10.0.0.256:7100"}) {
    auto parsed = ParseEndpoint(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    EXPECT_TRUE(parsed.status().IsInvalidParams()) << bad;
  }
}

TEST(EndpointTest, ErrorMessagesNameTheDefect) {
  EXPECT_NE(ParseEndpoint("tcp://node-7:7100").status().message().find("numeric"),
            std::string::npos);
  EXPECT_NE(ParseEndpoint("http://10.0.0.1:80").status().message().find("tcp:// or rdma://"),
            std::string::npos);
  EXPECT_NE(ParseEndpoint("tcp://10.0.0.1").status().message().find("no port"), std::string::npos);
}

TEST(EndpointTest, ListenAddressAllowsWildcardAndPortZero) {
  auto any = ParseListenAddress("0.0.0.0:0");
  ASSERT_TRUE(any.ok());
  EXPECT_TRUE(IsWildcardHost(any->host));
  EXPECT_EQ(any->port, 0);
  auto v6 = ParseListenAddress("[::]:7100");
  ASSERT_TRUE(v6.ok());
  EXPECT_TRUE(IsWildcardHost(v6->host));
  EXPECT_EQ(v6->port, 7100);
  auto specific = ParseListenAddress("127.0.0.1:9");
  ASSERT_TRUE(specific.ok());
  EXPECT_FALSE(IsWildcardHost(specific->host));
  EXPECT_FALSE(ParseListenAddress("localhost:7100").ok());
  EXPECT_FALSE(ParseListenAddress("0.0.0.0").ok());
}

TEST(EndpointTest, ListenAddressWithAnEmptyHostIsEveryInterface) {
  for (const char* any : {":7100", "[]:7100"}) {
    auto parsed = ParseListenAddress(any);
    ASSERT_TRUE(parsed.ok()) << any << ": " << parsed.status().ToString();
    EXPECT_TRUE(IsWildcardHost(parsed->host)) << any;
    EXPECT_EQ(parsed->port, 7100) << any;
  }
  for (const char* bad :
       {"*:7100", "::1:7100", "0.0.0.0:65536", "0.0.0.0:7100 ", "tcp://0.0.0.0:1"}) {
    auto parsed = ParseListenAddress(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find(std::string("listen address '") + bad + "'"),
              std::string::npos)
        << parsed.status().ToString();
  }
}

TEST(EndpointTest, EqualityIsOnCanonicalForm) {
  EXPECT_EQ(*ParseEndpoint("tcp://[::1]:5"), *ParseEndpoint("tcp://[0::1]:5"));
  EXPECT_FALSE(*ParseEndpoint("tcp://10.0.0.1:5") == *ParseEndpoint("rdma://10.0.0.1:5"));
}

}  // namespace
}  // namespace kvagent::transfer

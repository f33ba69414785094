// The cluster address operators write (etcd://HOST:PORT[,HOST:PORT]/CLUSTER), etcd endpoint
// lists, names, and the records kvmasters publish.
#include <gtest/gtest.h>

#include "kvagent/coord/cluster_address.h"
#include "kvagent/coord/etcd_client.h"
#include "kvagent/coord/records.h"

namespace kvagent::coord {
namespace {

TEST(ClusterAddress, ParsesEndpointsAndCluster) {
  auto a = ParseClusterAddress("etcd://10.0.0.1:2379,10.0.0.2:2379/prod");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->etcd_endpoints, (std::vector<std::string>{"10.0.0.1:2379", "10.0.0.2:2379"}));
  EXPECT_EQ(a->cluster, "prod");
  EXPECT_EQ(a->ToString(), "etcd://10.0.0.1:2379,10.0.0.2:2379/prod");
  EXPECT_TRUE(IsClusterAddress("etcd://x:1/c"));
  EXPECT_FALSE(IsClusterAddress("tcp://x:1"));
}

TEST(ClusterAddress, RefusesWhatIsNotOneWithAnExample) {
  for (const char* bad :
       {"tcp://10.0.0.1:50051", "etcd://10.0.0.1:2379", "etcd://10.0.0.1/c", "etcd://:2379/c",
        "etcd://h:99999/c", "etcd://h:1/", "etcd://h:1/a/b", "etcd://h:1,/c", "etcd://h:x/c"}) {
    auto a = ParseClusterAddress(bad);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), ErrorCode::kInvalidParams) << bad;
    EXPECT_NE(a.status().message().find("etcd://HOST:PORT"), std::string::npos)
        << bad << ": " << a.status().message();
  }
}

TEST(ClusterAddress, EtcdEndpointListsAcceptHttpPrefixes) {
  std::vector<std::string> out;
  ASSERT_TRUE(ParseEtcdEndpoints("http://127.0.0.1:2379/,h2:2380", &out).ok());
  EXPECT_EQ(out, (std::vector<std::string>{"127.0.0.1:2379", "h2:2380"}));
  EXPECT_FALSE(ParseEtcdEndpoints("", &out).ok());
  EXPECT_FALSE(ParseEtcdEndpoints("https://h:1", &out).ok());
}

TEST(ClusterAddress, NamesAreShortAndPlain) {
  EXPECT_TRUE(CheckName("kvm-1.a_b", "--name").ok());
  EXPECT_FALSE(CheckName("", "--name").ok());
  EXPECT_FALSE(CheckName("a/b", "--name").ok());
  EXPECT_FALSE(CheckName(std::string(65, 'a'), "--name").ok());
  EXPECT_EQ(ClusterKeys("prod").leader(), "/kvagent/prod/leader");
  EXPECT_EQ(ClusterKeys("prod").member("m1"), "/kvagent/prod/members/m1");
}

TEST(Records, RoundTripAndRefuseWhatIsNotOne) {
  LeaderRecord l{"m1", "tcp://10.0.0.1:50051", "tcp://10.0.0.1:5557", "", ""};
  auto back = LeaderRecord::Decode(l.Encode());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->Encode(), l.Encode());
  EXPECT_TRUE(back->serving());
  EXPECT_EQ(l.Encode().find("framed"), std::string::npos);  // as before the field existed
  // A leader that serves the framed transport names its endpoint too.
  LeaderRecord f{"m1", "tcp://10.0.0.1:50051", "tcp://10.0.0.1:5557", "", "tcp://10.0.0.1:50052"};
  auto fb = LeaderRecord::Decode(f.Encode());
  ASSERT_TRUE(fb.ok());
  EXPECT_EQ(fb->framed, "tcp://10.0.0.1:50052");
  EXPECT_FALSE(LeaderRecord::Decode("not json").ok());
  EXPECT_FALSE(LeaderRecord::Decode("[1,2]").ok());
  EXPECT_FALSE(LeaderRecord::Decode("{\"rpc\": 5}").ok());  // no name
  MemberRecord m{"m2", "follower", 17, 1234, 99, ""};
  auto mb = MemberRecord::Decode(m.Encode());
  ASSERT_TRUE(mb.ok());
  EXPECT_EQ(mb->applied_seq, 1234u);
  EXPECT_EQ(mb->election, 99);
}

TEST(Records, ThePositionWithMoreOfTheNewestTermIsBetter) {
  MemberRecord a{"a", "follower", 10, 5, 0, ""};
  MemberRecord b{"b", "follower", 10, 7, 0, ""};
  MemberRecord c{"c", "follower", 11, 0, 0, ""};
  EXPECT_TRUE(BetterPosition(b, a));
  EXPECT_TRUE(BetterPosition(c, b));
  MemberRecord a2{"a2", "follower", 10, 5, 0, ""};
  EXPECT_TRUE(BetterPosition(a, a2));  // equal positions: the smaller name
  EXPECT_FALSE(BetterPosition(a2, a));
}

}  // namespace
}  // namespace kvagent::coord

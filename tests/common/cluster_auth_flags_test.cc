#include "kvagent/common/cluster_auth_flags.h"

#include <gtest/gtest.h>

namespace kvagent {
namespace {

TEST(ClusterAuthFlags, LocalEndpointsAreLoopbackIpcAndInprocOnly) {
  for (const char* local :
       {"tcp://127.0.0.1:50051", "tcp://127.3.2.1:1", "tcp://localhost:5557", "tcp://[::1]:1",
        "ipc:///run/kvagent/events.sock", "inproc://x", "tcp://10.0.0.1:1;127.0.0.1:5"}) {
    EXPECT_TRUE(IsLocalEndpoint(local)) << local;
  }
  for (const char* remote :
       {"tcp://0.0.0.0:50051", "tcp://*:5557", "tcp://10.0.0.5:50051", "tcp://master:50051",
        "tcp://[::]:1", "tcp://eth0:1", "udp://127.0.0.1:1", "tcp://128.0.0.1:1"}) {
    EXPECT_FALSE(IsLocalEndpoint(remote)) << remote;
  }
}

}  // namespace
}  // namespace kvagent

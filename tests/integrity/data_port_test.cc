// The data port under a flood of connections: an agent out of file descriptors neither spins on
// its listener nor floods its log (it sheds the connections it cannot take), and it still serves
// its clients and its peers once the flood is gone. (On the old code the accept loop spun at
// 100% CPU with a log line per try.)
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "integrity_support.h"

namespace kvagent::testing {
namespace {

// CPU seconds (user + system) process `pid` has used so far.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

TEST(DataPort, AFloodPastTheDescriptorLimitNeitherSpinsNorStopsTheAgent) {
  KvmasterProcess master;
  ASSERT_TRUE(master.started());
  const uint16_t port = FreePort();
  NodeAgent agent(
      Concat(master.AgentArgs(), {"--data-listen", "127.0.0.1:" + std::to_string(port)}),
      {"/usr/bin/prlimit", "--nofile=256:256"});
  ASSERT_TRUE(agent.started());
  auto c = agent.Connect();
  ASSERT_TRUE(c);
  // Twice the agent's descriptor limit in connections, held open.
  std::vector<int> flood;
  for (int i = 0; i < 512; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(fd);
      continue;
    }
    flood.push_back(fd);
  }
  ASSERT_GT(flood.size(), 256u);
  const double before = CpuSeconds(agent.pid());
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double used = CpuSeconds(agent.pid()) - before;
  EXPECT_LT(used, 1.0) << "the agent burned " << used << " s of CPU in 2 s: a busy accept loop";
  EXPECT_GT(CounterOf(c->Stat(), "agent.data.served_shed_connections"), 0u);
  for (int fd : flood) close(fd);
  // It still serves.
  const std::string value = Pattern("after", 4096);
  EXPECT_EQ(PutValue(*c, "after", value).code, ErrorCode::kOk);
  EXPECT_EQ(GetValue(*c, "after", 4096).bytes, value);
}

}  // namespace
}  // namespace kvagent::testing

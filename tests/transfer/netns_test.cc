// Two network namespaces joined by a veth pair, a transfer_peer serving a pool in one, a
// transfer_peer writing and reading across from the other. Everything it creates lives inside
// the two namespaces it adds (named kvt-<pid>-<n>a/b, addresses in 10.213.<n>.0/24) and is
// deleted when the test ends, whatever its outcome. Needs root and `ip netns`; skipped otherwise.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <string>
#include <vector>

#include "netns_pair.h"
#include "test_support.h"

namespace kvagent::transfer {
namespace {

struct Spawned {
  testing::ChildProcess process;
  int stdin_fd = -1;   // write end of the child's stdin
  int stdout_fd = -1;  // read end of the child's stdout
  ~Spawned() {
    if (stdin_fd >= 0) close(stdin_fd);
    if (stdout_fd >= 0) close(stdout_fd);
  }
};

// Starts `args` (searched in PATH) with pipes on stdin and stdout (and stderr into the same
// pipe when `merge_stderr`).
std::unique_ptr<Spawned> Spawn(const std::vector<std::string>& args, bool merge_stderr = false) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return nullptr;
  pid_t pid = fork();
  if (pid < 0) return nullptr;
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    if (merge_stderr) dup2(out[1], STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  auto spawned = std::make_unique<Spawned>();
  spawned->process = testing::ChildProcess(pid);
  spawned->stdin_fd = in[1];
  spawned->stdout_fd = out[0];
  return spawned;
}

// Everything a child printed until it closed stdout, waiting at most `timeout_ms` per read.
std::string ReadOutput(int fd, int timeout_ms) {
  std::string text;
  char buf[512];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) break;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

// The first line a child prints, waiting at most `timeout_ms` in total.
std::string ReadLine(int fd, int timeout_ms) {
  std::string line;
  char c;
  while (line.empty() || line.back() != '\n') {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1 || read(fd, &c, 1) != 1) break;
    line.push_back(c);
  }
  while (!line.empty() && line.back() == '\n') line.pop_back();
  return line;
}

using kvagent::testing::NamespacePair;

TEST(NetnsTransferTest, EnginesInTwoNamespacesWriteAndReadAcrossAVethPair) {
  if (!kvagent::testing::CanUseNetns()) GTEST_SKIP() << "needs root and `ip netns`";
  NamespacePair pair;
  ASSERT_TRUE(pair.ok()) << "could not set up namespaces " << pair.a() << " / " << pair.b();

  // The server listens on every interface; its advertised host is derived from the only
  // non-loopback address in its namespace.
  auto server = Spawn({"ip", "netns", "exec", pair.b(), KVAGENT_TRANSFER_PEER, "serve",
                       "--data-listen", "0.0.0.0:0", "--pool-size", "64MiB"});
  ASSERT_TRUE(server);
  const std::string line = ReadLine(server->stdout_fd, 20000);
  const std::string prefix = "ENDPOINT tcp://" + pair.address_b() + ":";
  ASSERT_EQ(line.rfind(prefix, 0), 0u) << "server said: '" << line << "'";
  const std::string endpoint = line.substr(9);

  auto client = Spawn({"ip", "netns", "exec", pair.a(), KVAGENT_TRANSFER_PEER, "check", "--peer",
                       endpoint, "--data-listen", pair.address_a() + ":0"});
  ASSERT_TRUE(client);
  close(client->stdin_fd);
  client->stdin_fd = -1;
  const std::string output = ReadOutput(client->stdout_fd, 60000);
  EXPECT_EQ(client->process.Wait(), 0) << output;
  EXPECT_EQ(output, "OK 1\nOK 4096\nOK 1048576\nOK 16777216\n");

  close(server->stdin_fd);  // the server exits at end of stdin
  server->stdin_fd = -1;
  EXPECT_EQ(server->process.Wait(), 0);
}

TEST(NetnsTransferTest, AServerInAnotherNamespaceIsUnreachableOverLoopback) {
  if (!kvagent::testing::CanUseNetns()) GTEST_SKIP() << "needs root and `ip netns`";
  NamespacePair pair;
  ASSERT_TRUE(pair.ok());
  auto server = Spawn({"ip", "netns", "exec", pair.b(), KVAGENT_TRANSFER_PEER, "serve",
                       "--data-listen", "127.0.0.1:0", "--pool-size", "1MiB"});
  ASSERT_TRUE(server);
  const std::string line = ReadLine(server->stdout_fd, 20000);
  ASSERT_EQ(line.rfind("ENDPOINT tcp://127.0.0.1:", 0), 0u) << line;
  // Namespace A has its own loopback: the same endpoint reaches nothing there.
  auto client = Spawn({"ip", "netns", "exec", pair.a(), KVAGENT_TRANSFER_PEER, "check", "--peer",
                       line.substr(9), "--data-listen", "127.0.0.1:0"});
  ASSERT_TRUE(client);
  close(client->stdin_fd);
  client->stdin_fd = -1;
  ReadOutput(client->stdout_fd, 60000);
  EXPECT_EQ(client->process.Wait(), 1) << "the write must fail: namespaces are isolated";
}

TEST(NetnsTransferTest, APeerAddressNobodyAnswersTimesOutWhileConnecting) {
  if (!kvagent::testing::CanUseNetns()) GTEST_SKIP() << "needs root and `ip netns`";
  NamespacePair pair;
  ASSERT_TRUE(pair.ok());
  // ARP for the address goes unanswered for seconds; the 300 ms peer timeout fires first.
  auto client = Spawn({"ip", "netns", "exec", pair.a(), KVAGENT_TRANSFER_PEER, "check", "--peer",
                       "tcp://" + pair.address_nobody() + ":7100", "--data-listen",
                       pair.address_a() + ":0", "--data-peer-timeout-ms", "300"},
                      /*merge_stderr=*/true);
  ASSERT_TRUE(client);
  close(client->stdin_fd);
  client->stdin_fd = -1;
  const std::string output = ReadOutput(client->stdout_fd, 60000);
  EXPECT_EQ(client->process.Wait(), 1) << output;
  EXPECT_NE(output.find("write: TIMEOUT"), std::string::npos) << output;
  EXPECT_NE(output.find("(connecting)"), std::string::npos) << output;
}

}  // namespace
}  // namespace kvagent::transfer

// The agent's lifecycle with real processes: clients dying mid-stream, the agent stopped by
// SIGTERM or killed by SIGKILL, limits on who and how many may attach, many clients at once.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "agent_process.h"
#include "kvagent/client.h"
#include "notify_socket.h"
#include "process_guard.h"
#include "temp_dir.h"
#include "test_client_process.h"

namespace kvagent::testing {
namespace {

std::unique_ptr<Client> ConnectTo(const AgentProcess& agent, uint64_t arena = 1 << 20) {
  ClientOptions options;
  options.run_dir = agent.run_dir();
  options.arena_bytes = arena;
  options.client_name = "lifecycle-test";
  auto client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

TEST(AgentLifecycle, ClientSigkilledMidStreamIsReclaimedAndOthersAreUnaffected) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  const int base_fds = CountFds(agent.pid());
  ASSERT_GT(base_fds, 0);
  auto other = ConnectTo(agent);
  ASSERT_TRUE(other);
  ASSERT_TRUE(WaitUntil([&] { return CountFds(agent.pid()) == base_fds + 1; }));

  for (int round = 0; round < 3; ++round) {
    int out = -1;
    ProcessGuard victim(SpawnTestClient({"ping-loop", agent.run_dir()}, &out));
    ASSERT_GT(victim.pid(), 0);
    EXPECT_EQ(ReadLine(out), "ready");
    close(out);
    // The agent closes its copy of the segment's descriptor just after passing it: wait.
    EXPECT_TRUE(WaitUntil([&] { return CountFds(agent.pid()) == base_fds + 2; }))
        << "agent fds: " << CountFds(agent.pid()) << ", expected " << base_fds + 2;
    victim.Kill();  // SIGKILL while it is pinging
    EXPECT_TRUE(WaitUntil([&] { return CountFds(agent.pid()) == base_fds + 1; }))
        << "agent fds: " << CountFds(agent.pid()) << ", baseline " << base_fds + 1;
    EXPECT_EQ(CountShm(agent.pid()), 0);
    Reply r = other->Ping();
    EXPECT_TRUE(r.ok()) << r.status.ToString();
  }
}

// The re-exec for a huge-page heap (heap_pages.h) keeps the process's name, by which operators
// find the agent (ps, pgrep, systemd); segments of live agents are told by pid alone.
TEST(AgentLifecycle, TheAgentKeepsItsNameAcrossTheHugePageHeapReexec) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  EXPECT_EQ(ReadFile("/proc/" + std::to_string(agent.pid()) + "/comm"), "kvagent\n");
  const std::string thp = ReadFile("/sys/kernel/mm/transparent_hugepage/enabled");
  const bool thp_offered =
      thp.find("[always]") != std::string::npos || thp.find("[madvise]") != std::string::npos;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const bool glibc_malloc = false;
#else
  const bool glibc_malloc = true;
#endif
  if (thp_offered && glibc_malloc && std::getenv("KVAGENT_HUGE_HEAP") == nullptr) {
    EXPECT_NE(ReadFile("/proc/" + std::to_string(agent.pid()) + "/environ")
                  .find("glibc.malloc.hugetlb=1"),
              std::string::npos);
  }
}

TEST(AgentLifecycle, SigtermExitsZeroRemovesTheSocketAndFailsClientsFast) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto client = ConnectTo(agent);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->Ping().ok());
  const pid_t pid = agent.pid();
  agent.Signal(SIGTERM);
  const int status = agent.WaitExit();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(access(agent.socket_path().c_str(), F_OK), 0);
  EXPECT_EQ(CountShm(pid), 0);
  Reply r = client->Ping();
  EXPECT_EQ(r.status.code(), ErrorCode::kAgentUnavailable) << r.status.ToString();
  EXPECT_FALSE(client->connected());
}

TEST(AgentLifecycle, AgentSigkilledFailsThePendingCallWithAgentUnavailable) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  auto client = ConnectTo(agent);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->Ping().ok());
  agent.Signal(SIGSTOP);  // the request below stays unanswered
  ASSERT_TRUE(WaitUntil([&] { return IsStopped(agent.pid()); }));
  PendingCall pending = client->SubmitPing(std::chrono::milliseconds(60000));
  EXPECT_FALSE(pending.Ready());
  const auto killed_at = std::chrono::steady_clock::now();
  agent.Kill();
  Reply r = pending.Wait();
  const auto elapsed = std::chrono::steady_clock::now() - killed_at;
  EXPECT_EQ(r.status.code(), ErrorCode::kAgentUnavailable) << r.status.ToString();
  // Recorded, not asserted: the 1 s bound holds by design (EOF wakes the waiter at once, and it
  // re-checks every 100 ms regardless); the test's timeout catches a hang.
  std::printf("pending call failed %lld us after the SIGKILL\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::microseconds>(elapsed).count()));
  EXPECT_EQ(client->Ping().status.code(), ErrorCode::kAgentUnavailable);
  EXPECT_EQ(CountShm(agent.pid()), 0);  // a SIGKILLed agent leaves nothing in /dev/shm
}

// Two clients attach to `agent` (started with a cap of 2), a third is refused with
// AGENT_UNAVAILABLE and a message holding `says`; `meanwhile` runs while the cap is reached;
// once one of the two is gone, a new client attaches again.
void TheThirdClientIsRefused(
    const AgentProcess& agent, const std::string& says,
    const std::function<void()>& meanwhile = [] {}) {
  auto a = ConnectTo(agent);
  auto b = ConnectTo(agent);
  ASSERT_TRUE(a && b);
  ClientOptions options;
  options.run_dir = agent.run_dir();
  auto c = Client::Connect(options);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kAgentUnavailable);
  EXPECT_NE(c.status().message().find(says), std::string::npos) << c.status().message();
  meanwhile();
  a.reset();  // a slot frees up once the agent sees a's EOF
  EXPECT_TRUE(WaitUntil([&] { return Client::Connect(options).ok(); }));
}

TEST(AgentLifecycle, MoreThanMaxClientsAreRefusedWithAMessageSayingWhatToDo) {
  AgentProcess agent({"--max-clients", "2"});
  ASSERT_TRUE(agent.started());
  TheThirdClientIsRefused(agent, "--max-clients");
}

// Runs `body` in a child process as `uid` (group `uid` too) with a client of the agent at
// `run_dir` (1 MiB arena, process memory when asked); its exit code: `body`'s result, 10 when
// the uid could not be taken, 11 when the agent refused the client, 12 when it could not connect.
int ClientAs(uid_t uid, const std::string& run_dir, bool process_memory,
             const std::function<int(Client&)>& body) {
  ProcessGuard child(fork());
  if (child.pid() == 0) {
    if (setgid(uid) != 0 || setuid(uid) != 0) _exit(10);
    ClientOptions options;
    options.run_dir = run_dir;
    options.arena_bytes = 1 << 20;
    options.process_memory = process_memory;
    auto client = Client::Connect(options);
    if (!client.ok()) _exit(client.status().code() == ErrorCode::kAgentUnavailable ? 11 : 12);
    _exit(body(**client));
  }
  const int status = child.Wait();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A client running as another user (the segment's descriptor reaches it over the socket,
// whatever its uid): 0 when it attached and pinged, 11 when refused.
int ConnectAs(uid_t uid, const std::string& run_dir) {
  return ClientAs(uid, run_dir, false, [](Client& c) { return c.Ping().ok() ? 0 : 13; });
}

TEST(AgentLifecycle, AllowUidAddsToTheAgentsUidAndRootAndOthersAreRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch the client's uid";
  AgentProcess allowing({"--allow-uid", "65534"});
  ASSERT_TRUE(allowing.started());
  EXPECT_EQ(ConnectAs(65534, allowing.run_dir()), 0);
  EXPECT_EQ(CountShm(allowing.pid()), 0);
  auto root = ConnectTo(allowing);  // root stays allowed: the flag adds, it does not replace
  ASSERT_TRUE(root);
  EXPECT_TRUE(root->Ping().ok());
  EXPECT_EQ(ConnectAs(4242, allowing.run_dir()), 11);  // refused: not in the allow-list
  AgentProcess defaults;
  ASSERT_TRUE(defaults.started());
  EXPECT_EQ(ConnectAs(65534, defaults.run_dir()), 11);
}

TEST(AgentLifecycle, ARefusalNamesTheFlagThatWouldAllowTheClient) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch the client's uid";
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  ProcessGuard child(fork());
  if (child.pid() == 0) {
    if (setgid(4242) != 0 || setuid(4242) != 0) _exit(10);
    ClientOptions options;
    options.run_dir = agent.run_dir();
    auto c = Client::Connect(options);
    _exit(!c.ok() && c.status().message().find("--allow-uid 4242") != std::string::npos ? 0 : 1);
  }
  const int status = child.Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(AgentLifecycle, SixtyFourClientsAreServedAtOnce) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  const int base_fds = CountFds(agent.pid());
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 64; ++i) {
    clients.push_back(ConnectTo(agent, 64 << 10));
    ASSERT_TRUE(clients.back());
  }
  std::vector<PendingCall> calls;
  for (auto& c : clients) calls.push_back(c->SubmitPing());
  for (auto& call : calls) {
    Reply r = call.Wait();
    EXPECT_TRUE(r.ok()) << r.status.ToString();
  }
  EXPECT_TRUE(WaitUntil([&] { return CountFds(agent.pid()) == base_fds + 64; }));
  EXPECT_EQ(CountShm(agent.pid()), 0);
  clients.clear();
  EXPECT_TRUE(WaitUntil([&] { return CountFds(agent.pid()) == base_fds; }));
}

TEST(AgentLifecycle, RandomizedStressFromSeveralClientProcesses) {
  AgentProcess agent(DegradedAgentArgs());  // valid calls answer MASTER_UNAVAILABLE
  ASSERT_TRUE(agent.started());
  std::vector<std::unique_ptr<ProcessGuard>> workers;
  std::vector<int> outs;
  for (int i = 0; i < 4; ++i) {
    int out = -1;
    workers.push_back(std::make_unique<ProcessGuard>(
        SpawnTestClient({"stress", agent.run_dir(), std::to_string(i + 1), "300", "3"}, &out)));
    outs.push_back(out);
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    const int status = workers[i]->Wait();
    close(outs[i]);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "stress client " << i;
  }
  EXPECT_TRUE(agent.Running());
}

TEST(AgentLifecycle, ReadinessIsNotifiedOnlyOnceServingAndStoppingOnSigterm) {
  TempDir dir;
  NotifySocket notify(dir.path() + "/notify");
  ASSERT_TRUE(notify.bound());
  const std::string run_dir = dir.path() + "/run";
  ProcessGuard agent(fork());
  if (agent.pid() == 0) {
    setenv("NOTIFY_SOCKET", (dir.path() + "/notify").c_str(), 1);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    execl(KVAGENT_BINARY, KVAGENT_BINARY, "--run-dir", run_dir.c_str(), "--pool-size", "64MiB",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  // First the pre-faulting progress (EXTEND_TIMEOUT_USEC, see ops.startup), then READY.
  std::string ready = notify.Next();
  while (ready.rfind("EXTEND_TIMEOUT_USEC=", 0) == 0) ready = notify.Next();
  EXPECT_EQ(ready.rfind("READY=1\nSTATUS=kvagent ready: standalone", 0), 0u) << ready;
  // Ready means serving: the socket is there and answers.
  ClientOptions options;
  options.run_dir = run_dir;
  options.arena_bytes = 1 << 20;
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_TRUE((*client)->Ping().ok());
  agent.Signal(SIGTERM);
  EXPECT_EQ(notify.Next(), "STOPPING=1");
  const int status = agent.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Runs kvagent with `args` to completion; returns its exit code (-1 if it did not exit).
int RunAgentToExit(std::vector<std::string> args) {
  args.insert(args.begin(), KVAGENT_BINARY);
  ProcessGuard child(SpawnQuiet(std::move(args)));
  const int status = child.Wait();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(AgentLifecycle, BadFlagsExitTwoBeforeTouchingAnything) {
  TempDir dir;
  const std::string run_dir = dir.path() + "/run";
  EXPECT_EQ(RunAgentToExit({"--run-dir", run_dir, "--standalone", "--master", "tcp://1.2.3.4:5"}),
            2);
  EXPECT_EQ(RunAgentToExit({"--run-dir", run_dir, "--master", "udp://nowhere"}), 2);
  for (const char* master :
       {"tcp://127.0.0.1:port", "tcp://:50051", "tcp://10.0.0.1:99999", "tcp://10.0.0.1:50051/x"}) {
    EXPECT_EQ(RunAgentToExit({"--run-dir", run_dir, "--master", master}), 2) << master;
  }
  EXPECT_EQ(RunAgentToExit({"--run-dir", run_dir, "--master", "tcp://127.0.0.1:5",
                            "--master-transport", "carrier-pigeon"}),
            2);
  // The framed transport: a kvmaster's tcp:// endpoint or a cluster found through etcd.
  EXPECT_EQ(RunAgentToExit({"--run-dir", run_dir, "--master", "ipc:///tmp/kvmaster.sock",
                            "--master-transport", "framed"}),
            2);
  EXPECT_EQ(RunAgentToExit({"--run-dir", run_dir, "--pool-size", "0"}), 2);
  EXPECT_EQ(RunAgentToExit({"--run-dir", run_dir, "--heartbeat-ms", "0"}), 2);
  EXPECT_NE(access(run_dir.c_str(), F_OK), 0);  // nothing was created
}

// On a node shared by users, one uid's clients stop at --max-clients-per-uid; other uids still
// attach while that uid is at its cap.
TEST(AgentLifecycle, OneUidsClientsStopAtTheirCapAndLeaveTheOtherSlotsToOthers) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch the client's uid";
  AgentProcess agent({"--max-clients-per-uid", "2", "--allow-uid", "65534"});
  ASSERT_TRUE(agent.started());
  TheThirdClientIsRefused(agent, "uid 0 already has 2 clients attached (--max-clients-per-uid 2)",
                          [&] {  // another uid is not held back
                            EXPECT_EQ(ConnectAs(65534, agent.run_dir()), 0);
                          });
  // A cap above --max-clients, or below 0, is refused at start.
  EXPECT_NE(RunAgentToExit({"--run-dir", agent.run_dir() + "-2", "--max-clients", "4",
                            "--max-clients-per-uid", "5"}),
            0);
  EXPECT_NE(RunAgentToExit({"--run-dir", agent.run_dir() + "-3", "--max-clients-per-uid", "-1"}),
            0);
}

// A client running as `uid` that asks for process memory, then puts a 64 KiB value from its
// own memory and gets it back into its own memory: 0 when that works without the grant (the
// bytes went through the arena), 1 when it works with it, other codes on failures.
int ProcessMemoryClientAs(uid_t uid, const std::string& run_dir) {
  return ClientAs(uid, run_dir, /*process_memory=*/true, [uid](Client& c) {
    const std::string value(64 << 10, 'p');
    std::vector<std::string> keys = {"process-memory-" + std::to_string(uid)};
    std::vector<Value> values = {Value(std::string_view(value))};
    Reply put = c.Put(keys, values);
    if (!put.ok() || put.keys[0].code != ErrorCode::kOk) return 14;
    std::string back(value.size(), '\0');
    MemoryRange target{back.data(), back.size()};
    std::vector<MemoryValue> targets = {MemoryValue(&target, 1)};
    Reply got = c.GetInto(keys, targets);
    if (!got.ok() || got.keys[0].code != ErrorCode::kOk || back != value) return 15;
    return c.process_memory() ? 1 : 0;
  });
}

// A grant of process memory is to a pid, and a process that execs a setuid program keeps it: an
// agent that may read and write any process (root here) would then read and write that
// program's memory. Such an agent grants only root clients, unless told every allowed user is
// trusted; the others' values go through their arena.
TEST(AgentLifecycle, ARootAgentGrantsProcessMemoryToOtherUsersOnlyWhenToldTheyAreTrusted) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch the client's uid";
  AgentProcess agent({"--allow-uid", "65534"});
  ASSERT_TRUE(agent.started());
  EXPECT_EQ(ProcessMemoryClientAs(65534, agent.run_dir()), 0);
  EXPECT_EQ(ProcessMemoryClientAs(0, agent.run_dir()), 1);  // root gains nothing by it
  AgentProcess trusting({"--allow-uid", "65534", "--process-memory-any-uid"});
  ASSERT_TRUE(trusting.started());
  EXPECT_EQ(ProcessMemoryClientAs(65534, trusting.run_dir()), 1);
}

}  // namespace
}  // namespace kvagent::testing

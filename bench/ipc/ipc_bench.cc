// ipc_bench: the SDK <-> agent shared-memory path against the usual IPC baselines, measured in
// the same run on the same machine.
//
// Setup: a real `kvagent` process (fork/exec of the built binary, --spin-us 50) pinned to the
// last CPU, this process pinned to CPU 0; every baseline uses the same two CPUs (a forked child
// on the last CPU). Figures:
//   ipc.rtt.polled.*   Ping round trips back to back: the agent is still spinning when the next
//                      request lands (busy-poll path).
//   ipc.rtt.asleep.*   Ping after a pause longer than the agent's spin budget: the agent sleeps
//                      in futex_waitv and must be woken (blocking path).
//   ipc.pipelined      Pings in flight 256 at a time from one thread (async submit + wait);
//                      best of three trials of 1 M requests (each trial is printed too).
//   ipc.rtt.zmq_ipc / uds / futex   ZMQ REQ/REP over ipc://, a unix socketpair echo, and a raw
//                      futex ping-pong between two processes (both sides sleep every time).
// The machine is shared: other builds running at the same time make every figure noisier.
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "kvagent/client.h"

namespace {

using Clock = std::chrono::steady_clock;

int LastCpu() {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 1 ? static_cast<int>(n - 1) : 0;
}

void PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

double Percentile(std::vector<double>& us, double p) {
  if (us.empty()) return 0;
  std::sort(us.begin(), us.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(us.size() - 1));
  return us[i];
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

void Bench(const char* name, double value, const char* unit) {
  std::printf("BENCH %s %.3f %s\n", name, value, unit);
  std::fflush(stdout);
}

// A child process killed and reaped on scope exit.
struct Child {
  pid_t pid = -1;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// ---- kvagent ------------------------------------------------------------------------------

struct AgentFixture {
  std::string dir;
  Child child;
  bool Start() {
    char pattern[] = "/tmp/kvagent-bench-XXXXXX";
    dir = mkdtemp(pattern);
    child.pid = fork();
    if (child.pid == 0) {
      PinTo(LastCpu());
      std::string run_dir = dir + "/run";
      execl(KVAGENT_BINARY, KVAGENT_BINARY, "--run-dir", run_dir.c_str(), "--spin-us", "50",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 10000; ++i) {
      if (std::filesystem::exists(dir + "/run/agent.sock")) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
  ~AgentFixture() {
    if (child.pid > 0) {
      kill(child.pid, SIGTERM);
      waitpid(child.pid, nullptr, 0);
      child.pid = -1;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

struct KvagentFigures {
  double polled_p50 = 0;
  double asleep_p50 = 0;
};

// `ipc_bench pipelined` runs only the pipelined figure (for profiling).
bool only_pipelined = false;

KvagentFigures BenchKvagent() {
  AgentFixture agent;
  if (!agent.Start()) {
    std::fprintf(stderr, "ipc_bench: kvagent did not start\n");
    std::exit(1);
  }
  kvagent::ClientOptions options;
  options.run_dir = agent.dir + "/run";
  options.arena_bytes = 1 << 20;
  options.spin = std::chrono::microseconds(200);
  auto connected = kvagent::Client::Connect(options);
  if (!connected.ok()) {
    std::fprintf(stderr, "ipc_bench: %s\n", connected.status().ToString().c_str());
    std::exit(1);
  }
  kvagent::Client& client = **connected;

  for (int i = 0; i < 20000; ++i) (void)client.Ping();
  const int rounds = only_pipelined ? 1 : 200000;
  std::vector<double> polled;
  polled.reserve(200000);
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = Clock::now();
    kvagent::Reply r = client.Ping();
    polled.push_back(Micros(Clock::now() - t0));
    if (!r.ok()) std::exit(1);
  }
  Bench("ipc.rtt.polled.p50", Percentile(polled, 0.50), "us");
  Bench("ipc.rtt.polled.p99", Percentile(polled, 0.99), "us");

  std::vector<double> asleep;
  for (int i = 0; i < (only_pipelined ? 1 : 2000); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(500));  // > the agent's 50 us spin
    const auto t0 = Clock::now();
    kvagent::Reply r = client.Ping();
    asleep.push_back(Micros(Clock::now() - t0));
    if (!r.ok()) std::exit(1);
  }
  Bench("ipc.rtt.asleep.p50", Percentile(asleep, 0.50), "us");
  Bench("ipc.rtt.asleep.p99", Percentile(asleep, 0.99), "us");

  // Three trials, the best reported: on a shared 2-vCPU machine a trial that loses its CPU to
  // another process for a while measures the scheduler, not the path.
  constexpr int kWindow = 256;
  constexpr int kRequests = 1000000;
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    std::deque<kvagent::PendingCall> window;
    int failures = 0;
    const auto t0 = Clock::now();
    for (int i = 0; i < kRequests; ++i) {
      if (window.size() == kWindow) {
        failures += !window.front().Wait().ok();
        window.pop_front();
      }
      window.push_back(client.SubmitPing());
    }
    while (!window.empty()) {
      failures += !window.front().Wait().ok();
      window.pop_front();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (failures != 0) std::fprintf(stderr, "ipc_bench: %d pipelined pings failed\n", failures);
    std::printf("# pipelined trial %d: %.0f req/s\n", trial, kRequests / seconds);
    best = std::max(best, kRequests / seconds);
  }
  Bench("ipc.pipelined", best, "req/s");
  return {Percentile(polled, 0.50), Percentile(asleep, 0.50)};
}

// ---- baselines ----------------------------------------------------------------------------

double BenchZmq() {
  char pattern[] = "/tmp/kvagent-bench-zmq-XXXXXX";
  const std::string dir = mkdtemp(pattern);
  const std::string endpoint = "ipc://" + dir + "/rep.sock";
  Child child;
  child.pid = fork();
  if (child.pid == 0) {
    PinTo(LastCpu());
    zmq::context_t ctx(1);
    zmq::socket_t rep(ctx, zmq::socket_type::rep);
    rep.bind(endpoint);
    while (true) {
      zmq::message_t m;
      if (!rep.recv(m)) break;
      rep.send(m, zmq::send_flags::none);
    }
    _exit(0);
  }
  zmq::context_t ctx(1);
  zmq::socket_t req(ctx, zmq::socket_type::req);
  req.connect(endpoint);
  std::vector<double> rtt;
  char payload[64] = {};
  for (int i = 0; i < 22000; ++i) {
    const auto t0 = Clock::now();
    req.send(zmq::buffer(payload, sizeof(payload)), zmq::send_flags::none);
    zmq::message_t reply;
    (void)req.recv(reply);
    if (i >= 2000) rtt.push_back(Micros(Clock::now() - t0));
  }
  req.close();
  ctx.close();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return Percentile(rtt, 0.50);
}

double BenchUnixSocket() {
  int fds[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, fds);
  Child child;
  child.pid = fork();
  if (child.pid == 0) {
    PinTo(LastCpu());
    close(fds[0]);
    char buf[64];
    while (read(fds[1], buf, sizeof(buf)) == sizeof(buf)) {
      if (write(fds[1], buf, sizeof(buf)) != sizeof(buf)) break;
    }
    _exit(0);
  }
  close(fds[1]);
  std::vector<double> rtt;
  char buf[64] = {};
  for (int i = 0; i < 22000; ++i) {
    const auto t0 = Clock::now();
    if (write(fds[0], buf, sizeof(buf)) != sizeof(buf)) break;
    size_t got = 0;
    while (got < sizeof(buf)) {
      ssize_t n = read(fds[0], buf + got, sizeof(buf) - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (i >= 2000) rtt.push_back(Micros(Clock::now() - t0));
  }
  close(fds[0]);
  return Percentile(rtt, 0.50);
}

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, nullptr, nullptr, 0);
}

// Both processes sleep on the word every time: FUTEX_WAIT until it is their turn.
double BenchFutex() {
  void* mem = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  auto* word = new (mem) std::atomic<uint32_t>(0);
  constexpr int kRounds = 22000;
  Child child;
  child.pid = fork();
  if (child.pid == 0) {
    PinTo(LastCpu());
    for (int i = 0; i < kRounds; ++i) {
      uint32_t v;
      while ((v = word->load()) != 1) Futex(word, FUTEX_WAIT, v);
      word->store(2);  // answered
      Futex(word, FUTEX_WAKE, 1);
    }
    _exit(0);
  }
  std::vector<double> rtt;
  for (int i = 0; i < kRounds; ++i) {
    const auto t0 = Clock::now();
    word->store(1);
    Futex(word, FUTEX_WAKE, 1);
    uint32_t v;
    while ((v = word->load()) != 2) Futex(word, FUTEX_WAIT, v);
    if (i >= 2000) rtt.push_back(Micros(Clock::now() - t0));
    word->store(0);
  }
  munmap(mem, 4096);
  return Percentile(rtt, 0.50);
}

}  // namespace

int main(int argc, char** argv) {
  only_pipelined = argc > 1 && std::string(argv[1]) == "pipelined";
  PinTo(0);
  std::printf(
      "# ipc_bench: kvagent pinned to CPU %d, client to CPU 0; shared machine, "
      "expect noise\n",
      LastCpu());
  const KvagentFigures ours = BenchKvagent();
  if (only_pipelined) return 0;
  const double zmq = BenchZmq();
  Bench("ipc.rtt.zmq_ipc.p50", zmq, "us");
  Bench("ipc.rtt.uds.p50", BenchUnixSocket(), "us");
  const double futex = BenchFutex();
  Bench("ipc.rtt.futex.p50", futex, "us");
  // Targets: polled >= 20x faster than ZMQ; asleep within 1.3x of the raw futex ping-pong.
  Bench("ipc.rtt.zmq_over_polled", zmq / ours.polled_p50, "x");
  Bench("ipc.rtt.asleep_over_futex", ours.asleep_p50 / futex, "x");
  return 0;
}

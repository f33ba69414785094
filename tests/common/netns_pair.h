// Two network namespaces joined by a veth pair, for tests of what crosses a network: created
// with `ip netns add` (root), addresses in 10.213.<n>.0/24, deleted with everything in them when
// the object goes, whatever the test's outcome. Processes run inside with `ip netns exec`.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

namespace kvagent::testing {

// Runs a command (searched in PATH) to completion, its output discarded; its exit status, or -1
// when it could not run.
inline int RunQuiet(const std::vector<std::string>& args) {
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// True when this process may create namespaces (root, and `ip netns` works).
inline bool CanUseNetns() { return geteuid() == 0 && RunQuiet({"ip", "netns", "list"}) == 0; }

class NamespacePair {
 public:
  NamespacePair() {
    std::random_device random;
    subnet_ = static_cast<int>(random() % 250) + 1;
    const std::string tag = std::to_string(getpid()) + "-" + std::to_string(subnet_);
    a_ = "kvt-" + tag + "a";
    b_ = "kvt-" + tag + "b";
    const std::string short_tag = std::to_string(random() % 100000);
    veth_a_ = "kvt" + short_tag + "a";
    veth_b_ = "kvt" + short_tag + "b";
    ok_ = RunQuiet({"ip", "netns", "add", a_}) == 0;
    created_a_ = ok_;
    ok_ = ok_ && RunQuiet({"ip", "netns", "add", b_}) == 0;
    created_b_ = ok_;
    // Created directly inside the namespaces: the root namespace never sees these links.
    ok_ = ok_ && RunQuiet({"ip", "link", "add", veth_a_, "netns", a_, "type", "veth", "peer",
                           "name", veth_b_, "netns", b_}) == 0;
    ok_ =
        ok_ && RunQuiet({"ip", "-n", a_, "addr", "add", address_a() + "/24", "dev", veth_a_}) == 0;
    ok_ =
        ok_ && RunQuiet({"ip", "-n", b_, "addr", "add", address_b() + "/24", "dev", veth_b_}) == 0;
    for (const auto& [ns, dev] : {std::pair{a_, veth_a_}, std::pair{b_, veth_b_}}) {
      ok_ = ok_ && RunQuiet({"ip", "-n", ns, "link", "set", dev, "up"}) == 0;
      ok_ = ok_ && RunQuiet({"ip", "-n", ns, "link", "set", "lo", "up"}) == 0;
    }
  }
  ~NamespacePair() {
    if (created_a_) RunQuiet({"ip", "netns", "del", a_});  // takes its veth end (and the pair)
    if (created_b_) RunQuiet({"ip", "netns", "del", b_});
  }
  NamespacePair(const NamespacePair&) = delete;
  NamespacePair& operator=(const NamespacePair&) = delete;

  bool ok() const { return ok_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  std::string address_a() const { return "10.213." + std::to_string(subnet_) + ".1"; }
  std::string address_b() const { return "10.213." + std::to_string(subnet_) + ".2"; }
  // An address in the pair's subnet that no interface has.
  std::string address_nobody() const { return "10.213." + std::to_string(subnet_) + ".9"; }

  // Cuts the link between the two (both ends down: packets in either direction are lost, no
  // connection is reset) or restores it.
  bool Cut() {
    return RunQuiet({"ip", "-n", b_, "link", "set", veth_b_, "down"}) == 0 &&
           RunQuiet({"ip", "-n", a_, "link", "set", veth_a_, "down"}) == 0;
  }
  bool Heal() {
    return RunQuiet({"ip", "-n", a_, "link", "set", veth_a_, "up"}) == 0 &&
           RunQuiet({"ip", "-n", b_, "link", "set", veth_b_, "up"}) == 0;
  }

  // Limits the link to `rate` each way (tc's token bucket filter, e.g. "4mbit"; this kernel has
  // no netem): a packet waits in the queue up to `queue` (e.g. "1500ms") for its turn, and a
  // packet past that is dropped. (TCP senders on these hosts keep most of their backlog in their
  // own socket buffers, TCP small queues, so the shared queue stays short: the link is slow,
  // not congested.) The namespaces take the queues with them.
  bool Slow(const std::string& rate, const std::string& queue) {
    for (const auto& [ns, dev] : {std::pair{a_, veth_a_}, std::pair{b_, veth_b_}}) {
      if (RunQuiet({"tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                    "burst", "32kb", "latency", queue}) != 0) {
        return false;
      }
    }
    return true;
  }

  // `args` prefixed to run inside namespace `ns`.
  static std::vector<std::string> In(const std::string& ns, std::vector<std::string> args) {
    args.insert(args.begin(), {"/usr/sbin/ip", "netns", "exec", ns});
    return args;
  }

 private:
  int subnet_ = 0;
  std::string a_, b_, veth_a_, veth_b_;
  bool ok_ = false;
  bool created_a_ = false;
  bool created_b_ = false;
};

}  // namespace kvagent::testing

// Test support for kvmaster high availability: kvmasters as members of an etcd cluster, the
// leader as etcd shows it, a network namespace joined to this one (to cut a member off from
// etcd alone), and agents that find their master through etcd. Every process, namespace and
// thread started here is stopped when its owner goes, pass or fail.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "etcd_process.h"
#include "integrity_support.h"
#include "kvagent/coord/cluster_address.h"
#include "kvagent/coord/etcd_client.h"
#include "kvagent/coord/records.h"
#include "netns_pair.h"

namespace kvagent::testing {

using namespace std::chrono_literals;

// The cluster's leader as etcd shows it now (nullopt: none, or not serving yet). `tls`, `auth`:
// etcd over TLS, as an etcd user.
inline std::optional<coord::Leader> LeaderOf(const std::string& etcd, const std::string& cluster,
                                             const coord::EtcdTls& tls = {},
                                             const coord::EtcdAuth& auth = {}) {
  auto client = coord::EtcdClient::Create({{etcd}, 1000ms, tls, auth});
  if (!client.ok()) return std::nullopt;
  auto kv = (*client)->Get(coord::ClusterKeys(cluster).leader());
  if (!kv.ok() || !kv->has_value()) return std::nullopt;
  auto record = coord::LeaderRecord::Decode((*kv)->value);
  if (!record.ok() || !record->serving()) return std::nullopt;
  return coord::Leader{static_cast<uint64_t>((*kv)->create_revision), std::move(*record)};
}

// A member's record (role, position), nullopt when it has none.
inline std::optional<coord::MemberRecord> MemberOf(const std::string& etcd,
                                                   const std::string& cluster,
                                                   const std::string& name,
                                                   const coord::EtcdTls& tls = {},
                                                   const coord::EtcdAuth& auth = {}) {
  auto client = coord::EtcdClient::Create({{etcd}, 1000ms, tls, auth});
  if (!client.ok()) return std::nullopt;
  auto kv = (*client)->Get(coord::ClusterKeys(cluster).member(name));
  if (!kv.ok() || !kv->has_value()) return std::nullopt;
  auto record = coord::MemberRecord::Decode((*kv)->value);
  if (!record.ok()) return std::nullopt;
  return *record;
}

// True once every thread of `pid` is stopped (SIGSTOP delivered: state T in /proc/PID/stat).
inline bool ProcessStopped(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T';
}

// A kvmaster started as a member of an etcd cluster (kvmaster --etcd --cluster --name), with a
// state dir of its own kept across restarts. Its log goes to <dir>/kvmaster.log.
class HaMaster {
 public:
  // `host`: where it listens (ports picked by the OS); `prefix`: a command it runs under.
  HaMaster(std::string name, std::string etcd, std::string cluster, Args extra = {},
           std::string host = "127.0.0.1", Args prefix = {})
      : name_(std::move(name)),
        etcd_(std::move(etcd)),
        cluster_(std::move(cluster)),
        extra_(std::move(extra)),
        host_(std::move(host)),
        prefix_(std::move(prefix)) {
    Start();
  }
  HaMaster(const HaMaster&) = delete;
  HaMaster& operator=(const HaMaster&) = delete;

  void Start() {
    const std::string any = "tcp://" + host_ + ":0";
    Args args = prefix_;
    const Args own = {KVMASTER_BINARY,
                      "--etcd",
                      etcd_,
                      "--cluster",
                      cluster_,
                      "--name",
                      name_,
                      "--state-dir",
                      dir_.path(),
                      "--listen",
                      any,
                      "--events",
                      any,
                      "--events-replay",
                      any,
                      "--ready-file",
                      dir_.path() + "/ready"};
    args.insert(args.end(), own.begin(), own.end());
    args.insert(args.end(), extra_.begin(), extra_.end());
    const pid_t pid = SpawnLogged(args, dir_.path() + "/kvmaster.log");
    process_.Reset(pid);
  }
  void Kill() { process_.Kill(); }
  void Signal(int sig) { process_.Signal(sig); }
  bool Restart() {
    process_.Kill();
    Start();
    return process_.Running();
  }
  bool running() { return process_.Running(); }
  pid_t pid() const { return process_.pid(); }
  const std::string& name() const { return name_; }
  std::string log_path() const { return dir_.path() + "/kvmaster.log"; }
  // The last lines of its log, for failure messages (the log goes with the test's temp dir).
  std::string LogTail(size_t lines = 15) const {
    std::ifstream in(log_path());
    std::vector<std::string> all;
    for (std::string line; std::getline(in, line);) all.push_back(line);
    std::string out = "\n--- " + name_ + ": " + log_path() + "\n";
    for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
      out += all[i] + "\n";
    }
    return out;
  }

 private:
  TempDir dir_;
  std::string name_, etcd_, cluster_;
  Args extra_;
  std::string host_;
  Args prefix_;
  ProcessGuard process_;
};

// A network namespace joined to this one by a veth pair: 10.214.N.1 on this side, 10.214.N.2
// inside, and a second address on this side, 10.214.N.3, for a service (etcd) that the inside
// reaches there. Block() makes the inside drop every packet to that service address (a
// blackhole route: a partition of the service alone, silent, while everything else still flows
// both ways); Unblock() heals it.
class NetnsLink {
 public:
  NetnsLink() {
    std::random_device random;
    subnet_ = static_cast<int>(random() % 250) + 1;
    const std::string tag = std::to_string(random() % 100000);
    ns_ = "kvha-" + std::to_string(getpid()) + "-" + tag;
    outer_ = "kvh" + tag + "o";
    inner_ = "kvh" + tag + "i";
    ok_ = RunQuiet({"ip", "netns", "add", ns_}) == 0;
    created_ = ok_;
    ok_ = ok_ && RunQuiet({"ip", "link", "add", outer_, "type", "veth", "peer", "name", inner_,
                           "netns", ns_}) == 0;
    ok_ = ok_ && RunQuiet({"ip", "addr", "add", outer() + "/24", "dev", outer_}) == 0;
    ok_ = ok_ && RunQuiet({"ip", "addr", "add", service() + "/24", "dev", outer_}) == 0;
    ok_ = ok_ && RunQuiet({"ip", "-n", ns_, "addr", "add", inner() + "/24", "dev", inner_}) == 0;
    ok_ = ok_ && RunQuiet({"ip", "link", "set", outer_, "up"}) == 0;
    ok_ = ok_ && RunQuiet({"ip", "-n", ns_, "link", "set", inner_, "up"}) == 0;
    ok_ = ok_ && RunQuiet({"ip", "-n", ns_, "link", "set", "lo", "up"}) == 0;
  }
  ~NetnsLink() {
    if (created_) RunQuiet({"ip", "netns", "del", ns_});  // takes the veth pair with it
  }
  NetnsLink(const NetnsLink&) = delete;
  NetnsLink& operator=(const NetnsLink&) = delete;

  bool ok() const { return ok_; }
  const std::string& ns() const { return ns_; }
  std::string outer() const { return "10.214." + std::to_string(subnet_) + ".1"; }
  std::string inner() const { return "10.214." + std::to_string(subnet_) + ".2"; }
  std::string service() const { return "10.214." + std::to_string(subnet_) + ".3"; }
  Args Prefix() const { return {"/usr/sbin/ip", "netns", "exec", ns_}; }

  bool Block() {
    return RunQuiet({"ip", "-n", ns_, "route", "add", "blackhole", service() + "/32"}) == 0;
  }
  bool Unblock() {
    return RunQuiet({"ip", "-n", ns_, "route", "del", "blackhole", service() + "/32"}) == 0;
  }

 private:
  int subnet_ = 0;
  std::string ns_, outer_, inner_;
  bool ok_ = false;
  bool created_ = false;
};

// Arguments for an agent that finds its master through etcd.
inline Args ClusterAgentArgs(const std::string& cluster_url) {
  return {"--master",
          cluster_url,
          "--data-listen",
          "127.0.0.1:0",
          "--heartbeat-ms",
          "200",
          "--master-timeout-ms",
          "1000",
          "--data-peer-timeout-ms",
          "1000",
          "--master-ready-wait-ms",
          "0"};
}

// A client of `agent` whose calls give up after `timeout` (load under faults).
inline std::unique_ptr<Client> ConnectClient(const NodeAgent& agent,
                                             std::chrono::milliseconds timeout) {
  ClientOptions options;
  options.run_dir = agent.run_dir();
  options.arena_bytes = 16 << 20;
  options.client_name = "ha-test";
  options.call_timeout = timeout;
  auto client = Client::Connect(options);
  return client.ok() ? std::move(*client) : nullptr;
}

// Puts PREFIX-0 .. PREFIX-(n-1) (2000 patterned bytes each), each retried until OK (an agent
// still finding its leader); "" when all were stored, else the last answer of the first that
// never was.
inline std::string PutPatterned(Client& c, const std::string& prefix, int n) {
  for (int i = 0; i < n; ++i) {
    const std::string key = prefix + "-" + std::to_string(i);
    KeyResult r;
    if (!WaitUntil([&] {
          r = PutValue(c, key, Pattern(key, 2000), 1);
          return r.code == ErrorCode::kOk;
        })) {
      return key + ": " + r.message;
    }
  }
  return "";
}

// The keys PutPatterned stored that do not read back with their bytes within `limit` each.
inline std::vector<std::string> UnreadablePatterned(Client& c, const std::string& prefix, int n,
                                                    std::chrono::milliseconds limit = 10s) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    const std::string key = prefix + "-" + std::to_string(i);
    if (!WaitUntil(
            [&] {
              const Read g = GetValue(c, key, 4096);
              return g.code == ErrorCode::kOk && g.bytes == Pattern(key, 2000);
            },
            limit)) {
      out.push_back(key);
    }
  }
  return out;
}

// True once the agent of `c` is registered with the master of `epoch` (within `limit`).
inline bool RegisteredWith(Client& c, uint64_t epoch, std::chrono::milliseconds limit = 30s) {
  return WaitUntil(
      [&] {
        const Reply st = c.Stat();
        return CounterOf(st, "agent.master_link.ready") == 1 &&
               CounterOf(st, "agent.master_link.epoch") == epoch;
      },
      limit);
}

}  // namespace kvagent::testing

// Test support for the request pipeline: a real kvmaster process (restartable on the same
// endpoints), SDK clients, deterministic value bytes, and the agent's counters. Every process
// started here is stopped (SIGKILL + waitpid) when its guard goes, pass or fail.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent_process.h"
#include "kvagent/client.h"
#include "kvagent/events/event_subscriber.h"
#include "process_guard.h"
#include "value_pattern.h"

#ifndef KVMASTER_BINARY
#error "KVMASTER_BINARY must name the kvmaster executable"
#endif

namespace kvagent::testing {

using Args = std::vector<std::string>;

inline Args Concat(Args a, const Args& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A kvmaster child on 127.0.0.1 with OS-picked ports (kept across Restart). With `framed`, it
// also serves the framed RPC transport (--framed-listen), which AgentArgs then points agents at.
class KvmasterProcess {
 public:
  explicit KvmasterProcess(std::vector<std::string> extra = {}, bool framed = false)
      : extra_(std::move(extra)), framed_(framed) {
    Launch("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "tcp://127.0.0.1:0");
  }

  // A standby of `primary` (kvmaster --follow) that, once promoted, serves on the primary's
  // endpoints. Does not wait: it is ready only after promotion (WaitServing).
  static std::unique_ptr<KvmasterProcess> StandbyOf(const KvmasterProcess& primary,
                                                    std::vector<std::string> extra) {
    std::unique_ptr<KvmasterProcess> p(new KvmasterProcess(NoLaunch{}));
    p->extra_ = Concat({"--follow", primary.rpc()}, extra);
    p->Spawn(primary.rpc(), primary.events(), primary.replay());
    return p;
  }
  // A standby of `primary` on endpoints of its own (OS-picked ports): once promoted, a second
  // master next to the first, as a virtual-IP or DNS deployment has. Does not wait (WaitServing).
  static std::unique_ptr<KvmasterProcess> FollowerOf(const KvmasterProcess& primary,
                                                     std::vector<std::string> extra) {
    return FollowerOf(primary.rpc(), std::move(extra));
  }
  // The same, of the master serving at `primary_rpc` (an HA cluster's leader, say).
  static std::unique_ptr<KvmasterProcess> FollowerOf(const std::string& primary_rpc,
                                                     std::vector<std::string> extra) {
    std::unique_ptr<KvmasterProcess> p(new KvmasterProcess(NoLaunch{}));
    p->extra_ = Concat({"--follow", primary_rpc}, extra);
    p->Spawn("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "tcp://127.0.0.1:0");
    return p;
  }
  // Waits (bounded) until the process serves; false when it exited or did not come up.
  bool WaitServing() {
    ReadReady();
    return started();
  }
  const std::string& dir() const { return dir_.path(); }

  bool started() const { return !rpc_.empty(); }
  const std::string& rpc() const { return rpc_; }
  const std::string& events() const { return events_; }
  const std::string& replay() const { return replay_; }
  const std::string& framed_rpc() const { return framed_rpc_; }  // empty without `framed`
  pid_t pid() const { return process_.pid(); }

  // Arguments for an agent that uses this master (and its event endpoints): through its framed
  // transport when started with `framed`, else through its ROUTER.
  std::vector<std::string> AgentArgs() const {
    if (framed_) {
      return {"--master",        framed_rpc_, "--master-transport",     "framed",
              "--master-events", events_,     "--master-events-replay", replay_};
    }
    // Without `framed`: ZMQ, though kvmaster serves its framed transport too (--framed-listen
    // auto), which an agent's default --master-transport auto would move to.
    return {"--master",        rpc_,    "--master-transport",     "zmq",
            "--master-events", events_, "--master-events-replay", replay_};
  }

  void Kill() { process_.Kill(); }
  void Signal(int sig) { process_.Signal(sig); }
  // Starts a new kvmaster on the same endpoints (after Kill). False when it did not come up.
  bool Restart() {
    process_.Kill();
    const std::string rpc = rpc_, events = events_, replay = replay_;
    rpc_.clear();
    // The old process's ports are free again once it is reaped; retry briefly in case the
    // kernel has not released them yet.
    for (int attempt = 0; attempt < 50 && rpc_.empty(); ++attempt) {
      Launch(rpc, events, replay);
      if (rpc_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return started();
  }

 private:
  struct NoLaunch {};
  explicit KvmasterProcess(NoLaunch) {}

  void Launch(const std::string& rpc, const std::string& events, const std::string& replay) {
    Spawn(rpc, events, replay);
    ReadReady();
  }

  void Spawn(const std::string& rpc, const std::string& events, const std::string& replay) {
    const std::string ready = dir_.path() + "/ready";
    unlink(ready.c_str());
    std::vector<std::string> args = {KVMASTER_BINARY, "--listen",     rpc,
                                     "--events",      events,         "--events-replay",
                                     replay,          "--ready-file", ready};
    if (framed_) {  // on its earlier port after a restart
      args.push_back("--framed-listen");
      args.push_back(framed_rpc_.empty() ? "tcp://127.0.0.1:0" : framed_rpc_);
    }
    args.insert(args.end(), extra_.begin(), extra_.end());
    process_.Reset(SpawnQuiet(std::move(args)));
  }

  void ReadReady() {
    const std::string ready = dir_.path() + "/ready";
    if (!WaitUntil([&] { return access(ready.c_str(), F_OK) == 0 || !process_.Running(); })) {
      return;
    }
    std::ifstream in(ready);
    std::string line;
    std::map<std::string, std::string> values;
    while (std::getline(in, line)) {
      const size_t eq = line.find('=');
      if (eq != std::string::npos) values[line.substr(0, eq)] = line.substr(eq + 1);
    }
    if (!process_.Running()) return;
    events_ = values["events"];
    replay_ = values["replay"];
    framed_rpc_ = values["framed"];
    rpc_ = values["rpc"];
  }

  TempDir dir_;
  std::vector<std::string> extra_;
  bool framed_ = false;
  ProcessGuard process_;
  std::string rpc_, events_, replay_, framed_rpc_;
};

// NAME= of a standby's --status-file (0 while the file or the line is missing).
inline uint64_t StatusFileValue(const std::string& file, const std::string& name) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "=", 0) == 0) return std::stoull(line.substr(name.size() + 1));
  }
  return 0;
}

inline std::unique_ptr<Client> Connect(const AgentProcess& agent, uint64_t arena = 32 << 20,
                                       const std::string& name = "pipeline-test") {
  ClientOptions options;
  options.run_dir = agent.run_dir();
  options.arena_bytes = arena;
  options.client_name = name;
  options.call_timeout = std::chrono::milliseconds(60000);
  auto client = Client::Connect(options);
  return client.ok() ? std::move(*client) : nullptr;
}

// The counter `name` of a Stat reply (0 when absent); `text` receives its text when given.
inline uint64_t CounterOf(const Reply& stat, const std::string& name, std::string* text = nullptr) {
  for (const auto& c : stat.counters) {
    if (c.name != name) continue;
    if (text != nullptr) *text = c.text;
    return c.value;
  }
  return 0;
}

// The BlockStored events (by object_key) an agent publishes on <run-dir>/events.sock, read from
// its start (replay from seq 0) until every key of `want` has been seen or `limit` passes. Also
// reports whether the stream started with AllBlocksCleared, as a new publisher's must.
struct SeenEvents {
  bool started_with_clear = false;
  std::map<std::string, events::BlockStored> stored;
};
inline SeenEvents CollectStored(const std::string& run_dir, const std::vector<std::string>& want,
                                std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  SeenEvents seen;
  events::EventSubscriberOptions o;
  o.endpoint = "ipc://" + run_dir + "/events.sock";
  o.replay_endpoint = "ipc://" + run_dir + "/events-replay.sock";
  o.from_seq = 0;
  o.decode = true;
  auto sub = events::EventSubscriber::Start(o);
  if (!sub.ok()) return seen;
  bool first = true;
  const auto end = std::chrono::steady_clock::now() + limit;
  auto missing = [&] {
    for (const auto& k : want) {
      if (seen.stored.count(k) == 0) return true;
    }
    return false;
  };
  while (missing() && std::chrono::steady_clock::now() < end) {
    auto d = (*sub)->Next(std::chrono::milliseconds(200));
    if (!d.ok() || d->kind != events::EventDelivery::Kind::kBatch || !d->batch) continue;
    for (const auto& ev : d->batch->events) {
      if (first) seen.started_with_clear = std::holds_alternative<events::AllBlocksCleared>(ev);
      first = false;
      if (const auto* s = std::get_if<events::BlockStored>(&ev); s && s->object_key) {
        seen.stored[*s->object_key] = *s;
      }
    }
  }
  return seen;
}

}  // namespace kvagent::testing

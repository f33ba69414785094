// kvagent: the node agent. In this issue: serves SDK clients over shared memory, answers Ping,
// and answers every other op MASTER_UNAVAILABLE (no master link yet).
#include <signal.h>
#include <unistd.h>

#include <glog/logging.h>

#include <cstdio>
#include <iostream>

#include "kvagent/agent/agent.h"
#include "kvagent/agent/no_master_handler.h"
#include "kvagent/common/flags.h"

namespace {

kvagent::Result<std::vector<uint32_t>> ParseIds(const std::vector<std::string>& texts,
                                                const char* flag) {
  std::vector<uint32_t> ids;
  for (const std::string& t : texts) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || v > 0xFFFFFFFFUL) {
      return kvagent::InvalidParams(std::string(flag) + ": '" + t + "' is not a numeric id");
    }
    ids.push_back(static_cast<uint32_t>(v));
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  kvagent::agent::AgentConfig config;
  int64_t max_clients = config.max_clients;
  int64_t spin_us = config.spin.count();
  std::vector<std::string> allow_uids;
  std::vector<std::string> allow_gids;
  kvagent::FlagSet flags("kvagent",
                         "the kvagent node agent: serves SDK clients on <run-dir>/agent.sock");
  flags.String("run-dir", &config.run_dir, "directory for agent.sock (created 0755 if missing)");
  flags.Size("max-arena-bytes", &config.max_arena_bytes, "cap on a client's data arena");
  flags.Size("ring-bytes", &config.ring_bytes, "default size of each client ring (power of two)");
  flags.Size("max-ring-bytes", &config.max_ring_bytes, "cap on a client's requested ring size");
  flags.Int("max-clients", &max_clients, "clients served at once (1..127)");
  flags.StringList("allow-uid", &allow_uids,
                   "uid allowed to attach (repeatable; default: the agent's uid and root)");
  flags.StringList("allow-gid", &allow_gids, "gid allowed to attach (repeatable)");
  flags.Int("spin-us", &spin_us, "microseconds the ring service spins after the last request");
  kvagent::Status parsed = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  auto uids = ParseIds(allow_uids, "--allow-uid");
  auto gids = ParseIds(allow_gids, "--allow-gid");
  if (parsed.ok() && !uids.ok()) parsed = uids.status();
  if (parsed.ok() && !gids.ok()) parsed = gids.status();
  if (parsed.ok() && spin_us < 0) parsed = kvagent::InvalidParams("--spin-us must be >= 0");
  if (!parsed.ok()) {
    std::cerr << "kvagent: " << parsed.message() << "\n";
    return 2;
  }
  config.max_clients = static_cast<int>(max_clients);
  config.spin = std::chrono::microseconds(spin_us);
  config.allow_uids = *uids;
  config.allow_gids = *gids;

  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  // Every thread inherits this mask, so SIGTERM/SIGINT reach only the sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto agent =
      kvagent::agent::Agent::Start(config, std::make_unique<kvagent::agent::NoMasterHandler>());
  if (!agent.ok()) {
    LOG(ERROR) << "kvagent cannot start: " << agent.status().ToString();
    return 1;
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << "; shutting down";
  (*agent)->Stop();
  return 0;
}

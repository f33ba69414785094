// kvagent: the node agent. Serves SDK clients over shared memory, batches their requests to a
// master — the embedded one (standalone, the default) or kvmaster (--master tcp://HOST:PORT) —
// and moves the bytes between client arenas and the node pools.
//
// main() parses and checks the flags (agent_flags.h), then starts the agent (running_agent.h
// says in which order) and serves until SIGTERM or SIGINT: STOPPING=1, clean exit 0. Exit 1
// when it cannot start, 2 for a bad flag.
#include <glog/logging.h>

#include <iostream>

#include "agent_flags.h"
#include "kvagent/common/flags.h"
#include "kvagent/common/heap_pages.h"
#include "kvagent/common/process_fds.h"
#include "kvagent/common/stop_signals.h"
#include "kvagent/common/version.h"
#include "running_agent.h"

int main(int argc, char** argv) {
  // The embedded master's metadata grows in the service thread's arena (heap_pages.h).
  kvagent::PreferHugePageHeap(argv, size_t{32} << 20);
  kvagent::agent::AgentFlags v;
  kvagent::FlagSet flags("kvagent",
                         "the kvagent node agent: serves SDK clients on <run-dir>/agent.sock");
  kvagent::agent::DeclareAgentFlags(flags, v);
  kvagent::Status parsed = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (flags.version_requested()) {
    std::cout << "kvagent " << kvagent::kVersion << "\n";
    return 0;
  }
  if (parsed.ok()) parsed = kvagent::agent::CheckAgentFlags(v);
  if (!parsed.ok()) {
    std::cerr << "kvagent: " << parsed.message() << "\n";
    return 2;
  }

  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // One descriptor per client, peer and event subscriber: as many as the hard limit lets.
  LOG(INFO) << "kvagent: " << kvagent::DescribeFdLimit(kvagent::RaiseFdLimit());
  const kvagent::StopSignals stop_signals;  // before any thread: they all inherit the mask
  const kvagent::FdUseWatch fd_watch("kvagent");
  kvagent::agent::RunningAgent agent(v);
  if (!agent.Start()) return 1;
  agent.ServeUntil(stop_signals);
  return 0;
}

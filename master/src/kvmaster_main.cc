// kvmaster: the cluster metadata service and KV-event source (see master_server.h).
//
// Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot start (endpoint in use, bad state dir),
// 2 for a bad flag.
#include <glog/logging.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "kvagent/common/flags.h"
#include "kvagent/common/heap_pages.h"
#include "kvagent/common/stop_signals.h"
#include "kvagent/master/master_server.h"

namespace {

// Writes the bound endpoints for whoever started us (tests, scripts), atomically.
bool WriteReadyFile(const std::string& path, const kvagent::master::MasterServer& server) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "rpc=" << server.endpoint() << "\n"
        << "events=" << server.events_endpoint() << "\n"
        << "replay=" << server.replay_endpoint() << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  kvagent::PreferHugePageHeap(argv);
  kvagent::master::MasterServerOptions opts;
  kvagent::master::MasterOptions& m = opts.master;
  std::string log_dir;
  std::string ready_file;
  int64_t tick_ms = opts.tick_ms;
  uint64_t replay_batches = opts.replay_batches;

  kvagent::FlagSet flags("kvmaster", "cluster metadata service and KV-event source of kvagent");
  flags.String("listen", &opts.listen, "ZMQ ROUTER endpoint for agent requests (master.fbs)");
  flags.String("events", &opts.events, "ZMQ PUB endpoint of the KV events (EVENTS.md)");
  flags.String("events-replay", &opts.events_replay,
               "ZMQ ROUTER endpoint answering event replay requests (empty: none)");
  flags.Uint("events-replay-batches", &replay_batches, "event batches kept for replay");
  flags.String("state-dir", &m.state_dir,
               "directory of the operation log; restores objects and tags at start (empty: "
               "metadata lives in memory only)");
  flags.Int("agent-ttl-ms", &m.agent_ttl_ms, "drop an agent silent for this long");
  flags.Int("lease-ttl-ms", &m.lease_ttl_ms, "read lease granted by BatchGet");
  flags.Int("put-timeout-ms", &m.put_timeout_ms,
            "an unfinished put older than this may be taken over");
  flags.Int("put-release-timeout-ms", &m.put_release_timeout_ms,
            "replicas of a taken-over put are freed this long after it started");
  flags.Int("soft-pin-ttl-ms", &m.soft_pin_ttl_ms, "default soft pin lifetime");
  flags.Double("high-watermark", &m.high_watermark, "pool use that starts eviction (0..1)");
  flags.Double("low-watermark", &m.low_watermark, "pool use eviction brings it down to (0..1)");
  flags.Size("max-part-bytes", &m.max_part_bytes,
             "values larger than this are stored as several parts");
  flags.Int("tick-ms", &tick_ms, "period of expiry, timeout and eviction checks");
  flags.String("log-dir", &log_dir, "write glog files here (default: stderr)");
  flags.String("ready-file", &ready_file,
               "once serving, write the bound endpoints here (rpc=, events=, replay=)");
  if (kvagent::Status st = flags.Parse(argc, argv); !st.ok()) {
    std::cerr << "kvmaster: " << st.message() << "\n";
    return 2;
  }
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (kvagent::Status st = kvagent::master::ValidateMasterOptions(m); !st.ok()) {
    std::cerr << "kvmaster: " << st.message() << " (see kvmaster --help)\n";
    return 2;
  }
  opts.tick_ms = static_cast<int>(tick_ms);
  opts.replay_batches = replay_batches;

  if (log_dir.empty()) {
    FLAGS_logtostderr = true;
  } else {
    FLAGS_log_dir = log_dir;
  }
  google::InitGoogleLogging(argv[0]);

  const kvagent::StopSignals stop_signals;  // before any thread: they all inherit the mask

  kvagent::master::SteadyClock clock;
  auto server = kvagent::master::MasterServer::Start(opts, &clock);
  if (!server.ok()) {
    LOG(ERROR) << "kvmaster cannot start: " << server.status().ToString();
    return 1;
  }
  LOG(INFO) << "kvmaster serving: requests on " << server.value()->endpoint() << ", events on "
            << server.value()->events_endpoint() << ", replay on "
            << server.value()->replay_endpoint()
            << (m.state_dir.empty() ? ", no persistence" : ", state in " + m.state_dir)
            << ", heap on " << kvagent::HeapPagesDescription();
  if (!ready_file.empty() && !WriteReadyFile(ready_file, *server.value())) {
    LOG(ERROR) << "cannot write --ready-file " << ready_file;
    return 1;
  }
  LOG(INFO) << "kvmaster: " << stop_signals.Wait() << ", shutting down";
  server.value().reset();
  LOG(INFO) << "kvmaster: stopped";
  return 0;
}

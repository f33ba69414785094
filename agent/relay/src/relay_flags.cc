#include "kvagent/relay/relay_flags.h"

namespace kvagent::relay {

void EventRelayFlags::Declare(FlagSet* flags) {
  flags->String("master-events", &master_events,
                "the master's KV-event PUB endpoint (default: the master's host, port 5557)");
  flags->String("master-events-replay", &master_events_replay,
                "the master's KV-event replay ROUTER (default: the master's host, port 5558)");
  flags->String("events-tcp", &events_tcp,
                "also publish the relayed KV events on this tcp endpoint (e.g. "
                "tcp://0.0.0.0:5557), same batches and seq as <run-dir>/events.sock");
}

std::optional<std::string> WithPort(std::string_view endpoint, int port) {
  constexpr std::string_view kTcp = "tcp://";
  if (endpoint.substr(0, kTcp.size()) != kTcp) return std::nullopt;
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string_view::npos || colon < kTcp.size()) return std::nullopt;
  const std::string_view host = endpoint.substr(kTcp.size(), colon - kTcp.size());
  if (host.empty() || (host.front() == '[') != (host.back() == ']')) return std::nullopt;
  return std::string(endpoint.substr(0, colon + 1)) + std::to_string(port);
}

Result<EventRelayOptions> EventRelayFlags::Options(std::string_view run_dir,
                                                   std::string_view master_endpoint) const {
  if (run_dir.empty()) return InvalidParams("event relay: --run-dir is empty; set a directory");
  EventRelayOptions o;
  const std::string dir(run_dir);
  o.endpoint = "ipc://" + dir + "/events.sock";
  o.replay_endpoint = "ipc://" + dir + "/events-replay.sock";
  if (!events_tcp.empty()) o.extra_endpoints.push_back(events_tcp);
  // A cluster found through etcd: the master link tells the relay each leader's endpoints.
  if (master_endpoint.rfind("etcd://", 0) == 0) {
    if (!master_events.empty() || !master_events_replay.empty()) {
      return InvalidParams(
          "event relay: --master-events and --master-events-replay do not go with an etcd:// "
          "--master: the relay follows the leader's endpoints as etcd shows them");
    }
    o.await_master = true;
    return o;
  }
  o.master_events = master_events;
  o.master_events_replay = master_events_replay;
  for (auto [target, flag, port] :
       {std::tuple{&o.master_events, "--master-events", kDefaultMasterEventsPort},
        std::tuple{&o.master_events_replay, "--master-events-replay", kDefaultMasterReplayPort}}) {
    if (!target->empty()) continue;
    std::optional<std::string> derived = WithPort(master_endpoint, port);
    if (!derived) {
      return InvalidParams(std::string("event relay: set ") + flag +
                           ": it cannot be derived from the master endpoint \"" +
                           std::string(master_endpoint) + "\" (only from tcp://HOST:PORT)");
    }
    *target = std::move(*derived);
  }
  return o;
}

}  // namespace kvagent::relay

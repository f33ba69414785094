#include "kvagent/relay/relay_flags.h"

#include <grp.h>

#include <cstdlib>
#include <vector>

namespace kvagent::relay {

void EventRelayFlags::Declare(FlagSet* flags) {
  flags->String("master-events", &master_events,
                "the master's KV-event PUB endpoint (default: what kvmaster tells when the agent "
                "registers)");
  flags->String("master-events-replay", &master_events_replay,
                "the master's KV-event replay ROUTER (default: what kvmaster tells when the agent "
                "registers)");
  flags->String("events-tcp", &events_tcp,
                "also publish the relayed KV events on this tcp endpoint (e.g. "
                "tcp://0.0.0.0:5560; kvmaster's own are 5557 and 5558), same batches and seq as "
                "<run-dir>/events.sock");
  flags->String("events-group", &events_group,
                "group (name or gid) whose members may read <run-dir>/events.sock and "
                "events-replay.sock (mode 0660); default: only the agent's user (0600)");
}

Result<std::optional<uint32_t>> ResolveEventsGroup(std::string_view group) {
  if (group.empty()) return std::optional<uint32_t>();
  const std::string name(group);
  char* end = nullptr;
  const unsigned long gid = std::strtoul(name.c_str(), &end, 10);
  if (*end == '\0' && gid <= 0xFFFFFFFEUL)
    return std::optional<uint32_t>(static_cast<uint32_t>(gid));
  std::vector<char> buffer(16384);
  struct group entry {};
  struct group* found = nullptr;
  const int rc = ::getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (rc == 0 && found != nullptr) return std::optional<uint32_t>(found->gr_gid);
  return InvalidParams("--events-group: no group named \"" + name +
                       "\" (create it with groupadd, or give a numeric gid)");
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

std::string ResolveAdvertised(std::string_view advertised, std::string_view master_endpoint) {
  constexpr std::string_view kTcp = "tcp://";
  if (advertised.substr(0, kTcp.size()) != kTcp) return std::string(advertised);
  const size_t colon = advertised.rfind(':');
  if (colon == std::string_view::npos || colon < kTcp.size()) return std::string(advertised);
  const std::string_view host = advertised.substr(kTcp.size(), colon - kTcp.size());
  if (host != "0.0.0.0" && host != "*" && host != "[::]" && host != "::") {
    return std::string(advertised);
  }
  int port = 0;
  const std::string_view port_text = advertised.substr(colon + 1);
  for (char c : port_text) {
    if (c < '0' || c > '9') return std::string(advertised);
    port = port * 10 + (c - '0');
  }
  // The master's own host as the agent reaches it; a master reached over ipc is on this host.
  if (auto on_master_host = WithPort(master_endpoint, port)) return *on_master_host;
  return "tcp://127.0.0.1:" + std::string(port_text);
}

Result<EventRelayOptions> EventRelayFlags::Options(std::string_view run_dir,
                                                   std::string_view master_endpoint) const {
  if (run_dir.empty()) return InvalidParams("event relay: --run-dir is empty; set a directory");
  EventRelayOptions o;
  const std::string dir(run_dir);
  o.endpoint = "ipc://" + dir + "/events.sock";
  o.replay_endpoint = "ipc://" + dir + "/events-replay.sock";
  if (!events_tcp.empty()) o.extra_endpoints.push_back(events_tcp);
  auto group = ResolveEventsGroup(events_group);
  if (!group.ok()) return group.status();
  o.ipc_group = *group;
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
  // Neither given: the master tells them at registration (the caller sets master_endpoints).
  for (auto [target, flag, port] :
       {std::tuple{&o.master_events, "--master-events", kDefaultMasterEventsPort},
        std::tuple{&o.master_events_replay, "--master-events-replay", kDefaultMasterReplayPort}}) {
    if (!target->empty() || (master_events.empty() && master_events_replay.empty())) continue;
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

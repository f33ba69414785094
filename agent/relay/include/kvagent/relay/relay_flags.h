// The relay's command-line flags / config keys, declared once so kvagent (and test tools)
// expose the same names, defaults and help text.
//
//   EventRelayFlags relay_flags;
//   relay_flags.Declare(&flags);                                   // before flags.Parse(...)
//   auto options = relay_flags.Options(run_dir, master_endpoint);  // after Parse
//   options->list_content = ...;                                   // the agent's ListKeys pager
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kvagent/common/flags.h"
#include "kvagent/common/status.h"
#include "kvagent/relay/event_relay.h"

namespace kvagent::relay {

inline constexpr int kDefaultMasterEventsPort = 5557;  // docs/events.md defaults
inline constexpr int kDefaultMasterReplayPort = 5558;

struct EventRelayFlags {
  std::string master_events;         // --master-events
  std::string master_events_replay;  // --master-events-replay
  std::string events_tcp;            // --events-tcp
  std::string events_group;          // --events-group: name or number

  // Declares the flags above on `flags`. `this` must outlive flags->Parse().
  void Declare(FlagSet* flags);

  // Options for a relay serving ipc://<run_dir>/events.sock and events-replay.sock (plus
  // --events-tcp), following the master whose RPC endpoint is `master_endpoint`. With neither
  // --master-events nor --master-events-replay both stay empty: the caller sets
  // master_endpoints to what the master tells at registration. With one of them, the other is
  // the master's host with port 5557 / 5558. INVALID_PARAMS naming the flag to set when it
  // cannot be derived (the master endpoint is not tcp://HOST:PORT) or run_dir is empty.
  // list_content is left for the caller.
  [[nodiscard]] Result<EventRelayOptions> Options(std::string_view run_dir,
                                                  std::string_view master_endpoint) const;
};

// An event endpoint as the master bound it, made connectable from the agent: a wildcard host
// (0.0.0.0, *, [::]) becomes the host of `master_endpoint` (127.0.0.1 when that is ipc://);
// anything else is returned as it is. ("tcp://0.0.0.0:6000", "tcp://10.0.0.5:50051") ->
// "tcp://10.0.0.5:6000".
std::string ResolveAdvertised(std::string_view advertised, std::string_view master_endpoint);
// --events-group resolved: a group name or a numeric gid; nullopt for "". INVALID_PARAMS for an
// unknown group.
[[nodiscard]] Result<std::optional<uint32_t>> ResolveEventsGroup(std::string_view group);

// "tcp://10.0.0.5:50051", 5557 -> "tcp://10.0.0.5:5557" (IPv6 "[::1]" hosts too); nullopt
// unless `endpoint` is tcp://HOST:PORT.
std::optional<std::string> WithPort(std::string_view endpoint, int port);

}  // namespace kvagent::relay

// What kvctl's agent commands share: parsing a command line the same way, connecting to the
// agent with a hint a person can act on, and reporting a failure as one line.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/client.h"
#include "kvagent/common/flags.h"
#include "kvagent/common/status.h"
#include "kvctl_commands.h"

namespace kvagent::kvctl {

// A subcommand's grammar: its name, the synopsis shown on bad usage and in --help, a summary,
// and how many positionals it takes.
struct CommandSpec {
  std::string_view name;      // "put"
  std::string_view synopsis;  // "put KEY (--value STR | --file PATH) [--session ID] ..."
  std::string_view summary;   // one or more lines for --help
  size_t min_positionals = 0;
  size_t max_positionals = 0;
};

// Parses argv with `flags` (declared by the caller) into `positionals`. Returns the exit status
// to return at once — 0 after printing --help to `out`, 2 after printing one usage line to
// `err` — or nullopt when the command should run.
std::optional<int> ParseCommandLine(const CommandSpec& spec, FlagSet* flags, int argc, char** argv,
                                    std::vector<std::string>* positionals, std::ostream& out,
                                    std::ostream& err);

// Prints "kvctl: <what>: <CODE>: <message>" on one line (newlines in the message become
// spaces) and returns kExitFailed.
int ReportFailure(std::ostream& err, std::string_view what, const Status& status);

// Prints "kvctl: <command>: <message>; usage: kvctl [--run-dir DIR] <synopsis>" and returns
// kExitUsage.
int ReportUsage(std::ostream& err, const CommandSpec& spec, std::string_view message);

// Connects to the agent in global.run_dir asking for an arena of `arena_bytes`. A missing or
// silent agent is AGENT_UNAVAILABLE naming the socket, with how to start kvagent or point kvctl
// elsewhere.
Result<std::unique_ptr<Client>> ConnectAgent(const GlobalOptions& global, uint64_t arena_bytes);

// CallOptions carrying kvctl's --timeout-ms.
CallOptions CallWithTimeout(const GlobalOptions& global);

// The request-level status of `reply`, or else the first key's failure (as a Status), or OK.
// A Put's OBJECT_ALREADY_EXISTS counts as success here.
Status FirstFailure(const Reply& reply);

}  // namespace kvagent::kvctl

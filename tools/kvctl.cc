// kvctl: the operator's command line for a kvagent node.
//
//   kvctl [--run-dir DIR] [--timeout-ms MS] COMMAND [ARGS]
//
// Global flags come before the command; each command parses its own (kvctl_commands.h,
// kvctl_events.h). Exit status: 0 success, 1 failure (one line on stderr: what failed and what
// to do), 2 bad usage (one line naming the problem, with the synopsis).
#include <signal.h>

#include <iostream>
#include <string>
#include <string_view>

#include "kvagent/common/flags.h"
#include "kvagent/common/version.h"
#include "kvctl_commands.h"
#include "kvctl_events.h"

namespace {

using kvagent::kvctl::GlobalOptions;
using kvagent::kvctl::kExitOk;
using kvagent::kvctl::kExitUsage;

constexpr std::string_view kUsage =
    "Usage: kvctl [--run-dir DIR] [--timeout-ms MS] COMMAND [ARGS]\n"
    "The operator's command line for the kvagent on this node (its socket: DIR/agent.sock).\n"
    "\n"
    "Commands:\n"
    "  put KEY (--value STR | --file PATH) [--session ID] [--replicas N] [--hard-pin]\n"
    "      [--soft-pin-ttl-ms N]   store a value (an existing key is kept: prints \"exists\", 0)\n"
    "  get KEY [--out PATH]        the value's bytes to standard output (or PATH)\n"
    "  rm KEY [--force]            remove a key\n"
    "  ls [--prefix P] [--limit N] stored keys: KEY<TAB>SIZE<TAB>SESSION per line\n"
    "  stat [--raw]                the agent's and the master's counters\n"
    "  ping [--wait-ms MS]         is the agent there? (round-trip time; says when degraded)\n"
    "  sessions [--session ID] [--top N] [--json]\n"
    "                              blocks and bytes the cluster stores per session ID now\n"
    "  bench [--op put|get|both] [--value-bytes N] [--keys-per-request N] [--seconds S]\n"
    "                              measure puts and gets through the SDK (removes its keys)\n"
    "  events tail [--json] [--session ID] [--count N] [--from-seq N]\n"
    "                              follow the KV events (which session stored which block)\n"
    "  cluster --master etcd://HOST:PORT/CLUSTER [--wait-ms MS]\n"
    "                              the kvmasters of a cluster: leader, epoch, members\n"
    "  secret generate|fingerprint FILE\n"
    "                              write a new cluster secret / check one and print its "
    "fingerprint\n"
    "\n"
    "Global options:\n"
    "  --run-dir DIR      the agent's run directory (default: /run/kvagent)\n"
    "  --timeout-ms MS    give up on the agent after this long (default: 10000)\n"
    "  --version          print the version and exit\n"
    "\n"
    "`kvctl COMMAND --help` shows a command's options. Exit status: 0 success; 1 failure, with\n"
    "one line on stderr saying what failed and what to do; 2 bad usage.\n";

// Index of the command in argv: the first argument that is not a global flag or its value.
// Global flags take a value unless written --name=value (or are --help).
int CommandIndex(int argc, char** argv) {
  int i = 1;
  while (i < argc) {
    const std::string_view a = argv[i];
    if (a.rfind("--", 0) != 0 && a != "-h") return i;
    i += (a == "--help" || a == "-h" || a == "--version" || a.find('=') != std::string_view::npos)
             ? 1
             : 2;
  }
  return argc;
}

int UsageError(const std::string& message) {
  std::cerr << "kvctl: " << message
            << "; usage: kvctl [--run-dir DIR] [--timeout-ms MS] COMMAND [ARGS] (see kvctl "
               "--help)\n";
  return kExitUsage;
}

int RunEvents(const GlobalOptions& global, int argc, char** argv) {
  const std::string_view sub = argc > 1 ? argv[1] : "";
  if (sub == "tail") {
    return kvagent::kvctl::EventsTailMain(argc - 1, argv + 1, global.run_dir, std::cout, std::cerr);
  }
  if (sub == "--help" || sub == "-h") {
    std::cout << "Usage: kvctl [--run-dir DIR] events tail [options]\n"
                 "`kvctl events tail --help` shows its options.\n";
    return kExitOk;
  }
  std::cerr << "kvctl events: "
            << (sub.empty() ? "missing subcommand"
                            : "unknown subcommand '" + std::string(sub) + "'")
            << "; usage: kvctl [--run-dir DIR] events tail [--json] [--session ID] [--count N] "
               "[--from-seq N]\n";
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  // A reader that goes away (`kvctl get k | head -c 10`) ends kvctl quietly, as with cat.
  signal(SIGPIPE, SIG_DFL);
  const int command = CommandIndex(argc, argv);
  GlobalOptions global;
  int64_t timeout_ms = global.timeout.count();
  kvagent::FlagSet flags("kvctl", "the operator's command line for a kvagent node");
  flags.String("run-dir", &global.run_dir, "the agent's run directory");
  flags.Int("timeout-ms", &timeout_ms, "give up on the agent after this long");
  if (kvagent::Status st = flags.Parse(command, argv); !st.ok()) return UsageError(st.message());
  if (flags.help_requested() || (command < argc && std::string_view(argv[command]) == "help")) {
    std::cout << kUsage;
    return kExitOk;
  }
  if (flags.version_requested()) {
    std::cout << "kvctl " << kvagent::kVersion << "\n";
    return kExitOk;
  }
  if (command >= argc) return UsageError("missing command");
  if (timeout_ms <= 0) return UsageError("--timeout-ms must be positive");
  global.timeout = std::chrono::milliseconds(timeout_ms);

  const std::string_view name = argv[command];
  const int sub_argc = argc - command;
  char** sub_argv = argv + command;
  using Command = int (*)(const GlobalOptions&, int, char**, std::ostream&, std::ostream&);
  constexpr std::pair<std::string_view, Command> kCommands[] = {
      {"put", kvagent::kvctl::PutCommand},
      {"get", kvagent::kvctl::GetCommand},
      {"rm", kvagent::kvctl::RmCommand},
      {"ls", kvagent::kvctl::LsCommand},
      {"stat", kvagent::kvctl::StatCommand},
      {"ping", kvagent::kvctl::PingCommand},
      {"bench", kvagent::kvctl::BenchCommand},
      {"secret", kvagent::kvctl::SecretCommand},
      {"sessions", kvagent::kvctl::SessionsCommand},
      {"cluster", kvagent::kvctl::ClusterCommand},
  };
  for (const auto& [command_name, run] : kCommands) {
    if (name == command_name) return run(global, sub_argc, sub_argv, std::cout, std::cerr);
  }
  if (name == "events") return RunEvents(global, sub_argc, sub_argv);
  return UsageError("unknown command '" + std::string(name) + "'");
}

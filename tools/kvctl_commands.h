// kvctl's subcommands that talk to the agent through the SDK (put, get, rm, ls, stat, ping,
// bench),
// each as a function of its own arguments, so that kvctl.cc only dispatches.
//
// Every command follows one contract:
//   - argv[0] is the command's name, argv[1..] its positionals and flags;
//   - output a person or a script reads goes to `out` (for `get`: the value's bytes, exactly);
//   - on failure exactly ONE line goes to `err`: "kvctl: <command> [KEY]: <CODE>: <message>",
//     where the message says what to do;
//   - the result is the exit status: 0 success, 1 failure, 2 bad usage (the line then names the
//     bad argument and shows the command's synopsis). `--help` prints the usage to `out`, 0.
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace kvagent::kvctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// What every command gets from kvctl's global flags.
struct GlobalOptions {
  std::string run_dir = "/run/kvagent";      // --run-dir: where the agent's agent.sock is
  std::chrono::milliseconds timeout{10000};  // --timeout-ms: connect and each call
  std::string program = "kvctl";             // for messages
};

int PutCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
               std::ostream& err);
int GetCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
               std::ostream& err);
int RmCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
              std::ostream& err);
int LsCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
              std::ostream& err);
int StatCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
                std::ostream& err);
int PingCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
                std::ostream& err);
int SessionsCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
                    std::ostream& err);
int BenchCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
                 std::ostream& err);
// `cluster --master etcd://...` (kvctl_cluster.cc): the kvmasters of a cluster as etcd shows
// them; needs no agent.
int ClusterCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
                   std::ostream& err);
// `secret generate|fingerprint FILE` (kvctl_secret.cc): needs no agent.
int SecretCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
                  std::ostream& err);

// `key` as ls prints it: bytes below 0x20, 0x7f and the backslash become \xNN escapes, so one
// key is always one field on one line (UTF-8 text passes unchanged).
std::string PrintableKey(std::string_view key);

}  // namespace kvagent::kvctl

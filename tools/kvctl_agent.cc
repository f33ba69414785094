#include "kvctl_agent.h"
#include "kvagent/common/errno_text.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvagent::kvctl {
namespace {

// "" when something accepts a connection on the unix socket `path`, else why not (strerror).
std::string ProbeUnixSocket(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return "the path is too long for a unix socket";
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoText(errno);
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int error = errno;
  ::close(fd);
  return rc == 0 ? "" : ErrnoText(error);
}

}  // namespace

std::optional<int> ParseCommandLine(const CommandSpec& spec, FlagSet* flags, int argc, char** argv,
                                    std::vector<std::string>* positionals, std::ostream& out,
                                    std::ostream& err) {
  const Status parsed = flags->Parse(argc, argv, positionals);
  if (flags->help_requested()) {
    // FlagSet's usage names the command without its positionals; ours leads with the synopsis.
    const std::string usage = flags->Usage();
    const size_t options = usage.find("Options:");
    out << "Usage: kvctl [--run-dir DIR] " << spec.synopsis << "\n"
        << spec.summary << "\n\n"
        << (options == std::string::npos ? usage : usage.substr(options));
    return kExitOk;
  }
  if (!parsed.ok()) return ReportUsage(err, spec, parsed.message());
  if (positionals->size() < spec.min_positionals) {
    return ReportUsage(err, spec, "missing argument");
  }
  if (positionals->size() > spec.max_positionals) {
    return ReportUsage(err, spec,
                       "unexpected argument '" + (*positionals)[spec.max_positionals] + "'");
  }
  return std::nullopt;
}

int ReportFailure(std::ostream& err, std::string_view what, const Status& status) {
  std::string line = "kvctl: " + std::string(what) + ": " + status.ToString();
  std::replace(line.begin(), line.end(), '\n', ' ');
  err << line << "\n";
  return kExitFailed;
}

int ReportUsage(std::ostream& err, const CommandSpec& spec, std::string_view message) {
  err << "kvctl " << spec.name << ": " << message << "; usage: kvctl [--run-dir DIR] "
      << spec.synopsis << "\n";
  return kExitUsage;
}

Result<std::unique_ptr<Client>> ConnectAgent(const GlobalOptions& global, uint64_t arena_bytes) {
  ClientOptions options;
  options.run_dir = global.run_dir;
  options.client_name = "kvctl:" + std::to_string(getpid());
  options.arena_bytes = arena_bytes;
  options.connect_timeout = std::min(global.timeout, std::chrono::milliseconds(5000));
  options.call_timeout = global.timeout;
  auto client = Client::Connect(options);
  if (client.ok() || client.status().code() != ErrorCode::kAgentUnavailable) return client;
  // When nobody accepts on the socket, the SDK's message is written for programs (it names
  // ClientOptions); a person at a shell needs the socket, why, and the two ways out. An agent
  // that accepted and then refused us said why itself: keep its message.
  const std::string socket = global.run_dir + "/agent.sock";
  const std::string why = ProbeUnixSocket(socket);
  if (why.empty()) return client;
  return Status(ErrorCode::kAgentUnavailable,
                "no agent answers on " + socket + " (" + why +
                    "); is kvagent running? start it with `kvagent --run-dir " + global.run_dir +
                    "`, or point kvctl at its run directory with --run-dir DIR");
}

CallOptions CallWithTimeout(const GlobalOptions& global) {
  CallOptions call;
  call.timeout = global.timeout;
  return call;
}

Status FirstFailure(const Reply& reply) {
  if (!reply.ok()) return reply.status;
  for (const KeyResult& key : reply.keys) {
    if (!key.ok()) return Status(key.code, key.message);
  }
  return Status::Ok();
}

}  // namespace kvagent::kvctl

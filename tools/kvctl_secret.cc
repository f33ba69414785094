// `kvctl secret generate FILE` and `kvctl secret fingerprint FILE`: provisioning the cluster
// secret every member of a cluster reads with --cluster-secret-file (common/cluster_secret.h).
#include <string>
#include <string_view>

#include "kvagent/common/cluster_secret.h"
#include "kvctl_commands.h"

namespace kvagent::kvctl {
namespace {

constexpr std::string_view kSecretUsage =
    "Usage: kvctl secret generate FILE      write a new random cluster secret to FILE (mode 0600;\n"
    "                                       never overwrites)\n"
    "       kvctl secret fingerprint FILE   check FILE as a member would and print its\n"
    "                                       fingerprint (the same on every node of a cluster)\n";

}  // namespace

int SecretCommand(const GlobalOptions&, int argc, char** argv, std::ostream& out,
                  std::ostream& err) {
  const std::string_view sub = argc > 1 ? argv[1] : "";
  if (sub == "--help" || sub == "-h") {
    out << kSecretUsage;
    return kExitOk;
  }
  if ((sub != "generate" && sub != "fingerprint") || argc != 3) {
    err << "kvctl secret: "
        << (sub.empty() ? std::string("missing subcommand")
            : argc != 3 ? "expected exactly one FILE"
                        : "unknown subcommand '" + std::string(sub) + "'")
        << "; usage: kvctl secret generate|fingerprint FILE\n";
    return kExitUsage;
  }
  const std::string path = argv[2];
  if (sub == "generate") {
    if (Status st = GenerateClusterSecretFile(path); !st.ok()) {
      err << "kvctl secret generate: " << st.ToString() << "\n";
      return kExitFailed;
    }
  }
  Result<ClusterSecret> secret = ClusterSecret::LoadFromFile(path);
  if (!secret.ok()) {
    err << "kvctl secret " << sub << ": " << secret.status().ToString() << "\n";
    return kExitFailed;
  }
  out << (sub == "generate" ? "wrote " : "") << path << ": fingerprint " << secret->Fingerprint()
      << "\n";
  return kExitOk;
}

}  // namespace kvagent::kvctl

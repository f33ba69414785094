// The flags every binary that joins a cluster's network planes shares: --cluster-secret-file
// and --insecure-no-auth, and the rule that goes with them (docs/operations.md, "Security"):
//
//   with a secret, the ZMQ planes use CURVE with keys derived from it (zmq/curve_auth.h);
//   without one, a binary refuses to listen on, or connect to, an address other hosts can reach
//   (anything but loopback, ipc:// and inproc://), unless --insecure-no-auth says the network
//   is trusted: an unauthenticated kvmaster on 0.0.0.0 lets anyone who reaches it read every
//   key and session ID, remove everything, or register as an agent.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/flags.h"
#include "kvagent/common/status.h"

namespace kvagent {

// "tcp://127.0.0.1:50051", "tcp://localhost:1", "tcp://[::1]:1", "ipc://...", "inproc://...":
// true; an address other hosts can reach ("tcp://0.0.0.0:...", "tcp://*:...", "tcp://10.1.2.3:..."
// or a host name): false. What may run without a cluster secret (docs/operations.md).
bool IsLocalEndpoint(const std::string& endpoint);

struct ClusterAuthFlags {
  std::string secret_file;        // --cluster-secret-file
  bool insecure_no_auth = false;  // --insecure-no-auth

  // Declares both flags on `flags`; `this` must outlive flags->Parse().
  void Declare(FlagSet* flags);

  // The secret, or nullopt when no file was given. INVALID_PARAMS naming the file and the fix
  // when it is unusable, or when both flags are given.
  [[nodiscard]] Result<std::optional<ClusterSecret>> Load() const;

  // OK when `endpoint` (the value of `flag`) may be used: a secret is loaded, the endpoint is
  // local, or --insecure-no-auth was given. INVALID_PARAMS saying what to do otherwise.
  [[nodiscard]] Status CheckEndpoint(const std::string& endpoint, std::string_view flag,
                                     bool have_secret) const;
};

}  // namespace kvagent

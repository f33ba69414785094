// Reading a file that holds a secret (the cluster secret, etcd's password): only when nobody but
// its owner may read it, and it is small.
#pragma once

#include <cstddef>
#include <string>

#include "kvagent/common/status.h"

namespace kvagent {

// The content of `path`, at most `max_bytes`. INVALID_PARAMS, naming `what` (e.g. "cluster
// secret file /etc/kvagent/cluster-secret") and saying what to do, when it cannot be opened, is
// not a regular file, may be read or written by group or others (mode & 077), is owned by
// neither this process's user nor root, or is larger.
Result<std::string> ReadPrivateFile(const std::string& path, const std::string& what,
                                    size_t max_bytes);

// Wipes `s` (sodium_memzero) and empties it: for a copy of a secret that is no longer needed.
void WipeString(std::string& s);

}  // namespace kvagent

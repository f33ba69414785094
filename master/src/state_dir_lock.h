// One kvmaster per state dir. A second kvmaster on the same --state-dir would append its records
// to the first's operation log, between the first's, and each would replace the log with its
// own snapshot when it compacts: acknowledged changes of both lost, the log damaged. kvmaster
// takes a POSIX record lock on <state-dir>/kvmaster.lock for its whole life (as a standby, an
// HA member or the serving master: one process), before it reads anything there; a second one
// does not start, and says which process holds the dir.
//
// The lock goes with the process however it ends (SIGKILL included), so a restart on the same
// dir never waits for it; a forked child (the snapshot writer) does not hold it. Nothing else in
// the process may open the lock file: closing any descriptor of a file drops the process's POSIX
// locks on it.
#pragma once

#include <string>

#include "kvagent/common/status.h"
#include "kvagent/common/unique_fd.h"

namespace kvagent::master {

// Creates `dir` when missing and locks it for this process: the descriptor holds the lock until
// it is closed. INVALID_PARAMS when another process holds it (naming its pid) or the dir cannot
// be created or written.
Result<UniqueFd> LockStateDir(const std::string& dir);

}  // namespace kvagent::master

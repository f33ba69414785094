// The agent key (master.fbs RegisterAgent.agent_key) kept in the run dir, so that a restarted
// agent proves to kvmaster that it is the agent that held its name (a new incarnation with the
// same key is a restart; with another key, another process, which kvmaster refuses while the
// name's agent runs). The file is the run dir's `agent.key`: 16 hexadecimal digits and a
// newline, mode 0600, created once (written aside and renamed into place).
#pragma once

#include <cstdint>
#include <string>

#include "kvagent/common/status.h"

namespace kvagent::agent {

inline constexpr const char* kAgentKeyFile = "agent.key";

struct AgentKey {
  uint64_t value = 0;
  // Empty when the key is in the file; else why a new key could not be written there (the run
  // dir is full or read-only): the key then lives in this process only, and a restart of the
  // agent is taken for another process until its previous registration is silent for the TTL.
  std::string unsaved;
};

// The key in `run_dir`/agent.key, or a new one (from the kernel's random source, never 0)
// written there when the file does not exist. A file that is not a key (damaged, not a regular
// file) or that others may read is an error naming it and the fix; nothing is changed then.
Result<AgentKey> LoadOrCreateAgentKey(const std::string& run_dir);

}  // namespace kvagent::agent

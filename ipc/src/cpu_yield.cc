#include "kvagent/ipc/cpu_yield.h"

#include <sched.h>

namespace kvagent::ipc {

YieldPolicy& ThisThreadsYieldPolicy() {
  thread_local YieldPolicy policy;
  return policy;
}

void SchedYield() { sched_yield(); }

}  // namespace kvagent::ipc

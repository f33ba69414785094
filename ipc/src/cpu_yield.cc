#include "kvagent/ipc/cpu_yield.h"

#include <sched.h>

namespace kvagent::ipc {

YieldPolicy& ThisThreadsYieldPolicy() {
  thread_local YieldPolicy policy;
  return policy;
}

bool YieldCpu() {
  YieldPolicy& policy = ThisThreadsYieldPolicy();
  const auto before = YieldPolicy::Clock::now();
  if (!policy.MayYield(before)) return false;
  sched_yield();
  const auto after = YieldPolicy::Clock::now();
  policy.Yielded(after - before, after);
  return true;
}

}  // namespace kvagent::ipc

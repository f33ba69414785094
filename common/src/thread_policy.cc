#include "kvagent/common/thread_policy.h"

#include <pthread.h>
#include <sched.h>

namespace kvagent {

bool MarkThisThreadBackground() {
#ifdef SCHED_BATCH
  sched_param param{};
  param.sched_priority = 0;  // the only priority of the non-real-time policies
  return pthread_setschedparam(pthread_self(), SCHED_BATCH, &param) == 0;
#else
  return false;
#endif
}

}  // namespace kvagent

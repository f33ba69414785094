// Scheduling classes of the daemons' threads.
#pragma once

namespace kvagent {

// Marks the calling thread as background work (Linux SCHED_BATCH): it keeps its full share of
// CPU time, but its wake-ups no longer preempt the thread running on that CPU. For threads whose
// work may wait a scheduler tick (event publishing, the event relay) beside threads whose every
// microsecond shows in a request's latency (the agent's ring service, kvmaster's loop): an
// agent pinned to one CPU otherwise lost its ring thread for the publisher's burst once a
// millisecond (docs/benchmarks.md). False, changing nothing, where the policy cannot be set.
bool MarkThisThreadBackground();

}  // namespace kvagent

// MasterPort: what the agent's request pipeline needs from a master, local or remote.
//
// Two implementations: EmbeddedMaster (agent/src/embedded_master.h; `kvagent --standalone`, the
// default: the master library runs on the agent's service thread) and RemoteMaster
// (agent/master_link/; `kvagent --master tcp://HOST:PORT`: one ZMQ DEALER owned by a link
// thread). The pipeline speaks master.fbs to both, so one code path serves both modes.
//
// Threading: every method runs on the agent's service thread (the one that calls the
// RequestHandler), except where a method says otherwise. ready(), Describe() and AppendStats()
// must be safe on any thread (the metrics endpoint reads them). Replies reach that thread through
// the PostFn given to Bind(), never on another thread.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvagent/common/status.h"

namespace kvagent::agent {

// Runs a task on the agent's service thread (thread-safe, never blocks). After the service
// stopped it does nothing.
using PostFn = std::function<void(std::function<void()> task)>;

// The reply to one Call: the master.fbs Reply bytes, safe to read without further checks (the
// remote port runs the FlatBuffers Verifier and matches the request_id; the embedded one built
// them in-process), valid only while the callback runs; or MASTER_UNAVAILABLE / TIMEOUT with
// a message that says what to do. A non-OK request-level status inside the Reply is the
// master's answer and arrives as bytes.
using MasterReplyFn = std::function<void(Result<std::span<const uint8_t>> reply)>;

// Who this agent is at the master right now.
struct MasterIdentity {
  uint32_t agent_id = 0;  // 0 while not registered
  uint32_t pool_id = 0;   // the node pool's id at the master; 0 while not mounted
  // This agent's key (master.fbs RegisterAgent): every request to the master carries it.
  uint64_t agent_key = 0;
};

class MasterPort {
 public:
  using Clock = std::chrono::steady_clock;

  virtual ~MasterPort() = default;

  // Called once, on the service thread, before the first Call: how replies reach that thread.
  virtual void Bind(PostFn post) = 0;

  // Sends `request` (a finished master.fbs Request whose request_id is non-zero, below 2^62 and
  // unique among this port's pending calls; a port keeps the ids above for itself) and
  // arranges for `done` to run exactly once on the service thread: possibly before
  // Call returns (the embedded master answers at once; a port that knows the master is
  // unreachable fails at once), otherwise later. A Call made from inside a `done` never runs
  // its own `done` before the outer one has returned, so a reply span stays valid for the whole
  // callback. Exception to "exactly once": after Stop(), pending callbacks are destroyed
  // without running.
  virtual void Call(flatbuffers::DetachedBuffer request, MasterReplyFn done) = 0;

  // Call for an idempotent request whose outcome the caller must learn (a write's End): while
  // the link to the master is down, or when it drops with the request in flight, the port keeps
  // the request and sends it again once registered again, until `retry_until`; only then does
  // `done` get MASTER_UNAVAILABLE. The embedded master answers at once, as Call.
  virtual void CallUntilAnswered(flatbuffers::DetachedBuffer request, MasterReplyFn done,
                                 Clock::time_point /*retry_until*/) {
    Call(std::move(request), std::move(done));
  }

  // True when Call can reach a registered master now (a Call may still fail later).
  virtual bool ready() const = 0;
  // Valid while ready(); the master may assign new ids after it restarted.
  virtual MasterIdentity identity() const = 0;
  // One line for logs and `kvctl stat`, e.g. "standalone (embedded master)" or
  // "kvmaster tcp://10.0.0.1:50051: ready, agent 3, pool 3".
  virtual std::string Describe() const = 0;
  // Counters for `kvctl stat` (names without a prefix; the pipeline adds "agent.master_link.").
  virtual void AppendStats(std::vector<std::pair<std::string, uint64_t>>* /*out*/) const {}

  // Replies that arrived for this thread's calls, taken in here rather than posted by the
  // thread that would read them (a remote master's framed connection): runs their callbacks now
  // and returns true when it ran any. Called while calls are out; cheap when there is nothing.
  virtual bool TakeReplies() { return false; }
  // The service thread is about to sleep: whoever read for it before reads again.
  virtual void StopTakingReplies() {}

  // Periodic work on the service thread (the embedded master's Tick and heartbeat).
  virtual Clock::time_point NextDeadline() const { return Clock::time_point::max(); }
  virtual void OnTimer(Clock::time_point /*now*/) {}

  // Stops everything that posts to the service thread (joins the link thread); pending Calls are
  // dropped without their callbacks. Called on the service thread as it exits. Idempotent.
  virtual void Stop() {}
};

}  // namespace kvagent::agent

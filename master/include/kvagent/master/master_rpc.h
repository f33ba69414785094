// MasterRpc: master.fbs messages in, replies out, for one MasterService.
//
// The same handler serves kvmaster's ROUTER and an in-process caller (kvagent --standalone):
// give it the bytes of a Request, get the bytes of the Reply. Every request goes through the
// FlatBuffers Verifier first (a misaligned buffer is copied first); a buffer that fails, an unknown
// body, or a batch the service rejects gets a Reply with a non-OK status and a message, is counted
// in the service's bad_requests, and changes nothing. Never throws, never aborts on input.
//
// Single-threaded like the service it drives. Keeps its scratch vectors and FlatBufferBuilder
// across calls so a busy master does not allocate per request once warm.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvagent/master/master_service.h"

namespace kvagent::master {

class MasterRpc {
 public:
  // `service` must outlive this object.
  explicit MasterRpc(MasterService* service);
  ~MasterRpc();
  MasterRpc(const MasterRpc&) = delete;
  MasterRpc& operator=(const MasterRpc&) = delete;

  // Handles one Request buffer and returns the Reply buffer. The returned bytes stay valid
  // until the next call. The bytes are checked first (the FlatBuffers Verifier, then their
  // shape: request_check.h): whatever they hold, a bad request gets an INVALID_PARAMS reply.
  // `may_detach`: the caller's transport can send a Replicate's records as a message part of
  // their own (ZMQ); a Replicate that asks for that (detached_records) then gets a reply without
  // them, and last().detached holds them.
  std::span<const uint8_t> Handle(std::span<const uint8_t> request, bool may_detach = false);

  // The same for a Request this process built itself with the generated builders (the agent's
  // embedded master): such bytes cross no trust boundary, and the checks that guard against
  // hostile bytes are skipped (~95 ns of a ~800 ns single-key call on the development VM). Never
  // for bytes that came from a socket, a file or shared memory.
  std::span<const uint8_t> HandleOwn(std::span<const uint8_t> request);

  // The counters of the Stats reply (`kvctl stat` shows them as "master.*"): the service's,
  // then the extra ones. Same thread as Handle.
  std::vector<std::pair<std::string, uint64_t>> StatCounters() const;
  // The same into `out` (cleared first), reusing its memory: kvmaster's loop fills one list
  // every tick, where a new list (over 1 KiB) made glibc merge every small free chunk of the
  // heap each time (malloc_consolidate: ~5 % of the loop's time under a stream of commits).
  void StatCounters(std::vector<std::pair<std::string, uint64_t>>* out) const;

  // The event endpoints told to agents in RegisterAgentReply (MasterServer sets what its
  // publisher bound). Unset: none told.
  void set_event_endpoints(std::string events, std::string replay) {
    events_endpoint_ = std::move(events);
    events_replay_endpoint_ = std::move(replay);
  }
  // The framed RPC endpoint told to agents in RegisterAgentReply (MasterServer sets what its
  // framed server bound). Unset: none told.
  void set_framed_endpoint(std::string framed) { framed_endpoint_ = std::move(framed); }

  // Extra counters appended to the Stats reply (e.g. the event publisher's). Optional.
  using ExtraStats = std::function<void(std::vector<std::pair<std::string, uint64_t>>*)>;
  void set_extra_stats(ExtraStats fn) { extra_stats_ = std::move(fn); }

  // High availability: asked before every request; while it returns false, every request but
  // Replicate is answered MASTER_UNAVAILABLE with Reply.not_serving and changes nothing.
  // Optional (unset: always serving).
  void set_may_serve(std::function<bool()> fn) { may_serve_ = std::move(fn); }

  // Snapshots for followers built in the background (MasterService::ReadReplication): a
  // Replicate whose snapshot is not built yet is answered MASTER_UNAVAILABLE ("being built; ask
  // again") with last().replicate_pending, which the server parks instead of sending.
  void set_background_snapshots(bool on) { background_snapshots_ = on; }

  // The most record bytes a Replicate reply carries inline and detached (types.h: the defaults
  // are what the reply and a follower's socket can hold); tests lower them.
  void set_replication_limits(uint64_t inline_bytes, uint64_t detached_bytes) {
    max_inline_replication_ = inline_bytes;
    max_detached_replication_ = detached_bytes;
  }

  // What the last Handle call was, for the server (long polls, follower acknowledgements).
  struct LastRequest {
    uint8_t type = 0;                // master.fbs Body (0: not a valid request)
    bool refused = false;            // answered not_serving
    bool agent_key_refused = false;  // acted for an agent without its agent key
    bool replicate = false;          // a Replicate request ...
    bool replicate_empty = false;    // ... answered with no record: nothing new after after_seq
    bool replicate_pending = false;  // ... its snapshot is being built (background snapshots)
    uint64_t after_seq = 0;
    uint64_t master_epoch = 0;
    uint32_t wait_ms = 0;
    std::string follower;
    bool electable = false;  // Replicate.electable
    // The records of a Replicate reply that go after it as a part of their own (the reply's
    // detached_bytes), and what keeps them valid: held by the transport until they are sent.
    std::string_view detached;
    std::shared_ptr<const void> detached_owner;
  };
  const LastRequest& last() const { return last_; }

 private:
  class Scratch;
  class Call;  // one request: a step per body type (master_rpc.cc)
  // `request`, or an aligned copy of it in the scratch space.
  std::span<const uint8_t> Aligned(std::span<const uint8_t> request);
  std::span<const uint8_t> Serve(std::span<const uint8_t> request, bool own);
  MasterService* service_;
  std::unique_ptr<Scratch> scratch_;
  ExtraStats extra_stats_;
  std::function<bool()> may_serve_;
  bool background_snapshots_ = false;
  bool may_detach_ = false;  // of the call being handled
  uint64_t max_inline_replication_ = kMaxInlineReplicationBytes;
  uint64_t max_detached_replication_ = kMaxDetachedReplicationBytes;
  LastRequest last_;
  std::string events_endpoint_;
  std::string framed_endpoint_;
  std::string events_replay_endpoint_;
};

}  // namespace kvagent::master

// What kvmasters publish in etcd (JSON values; unknown fields are ignored, so newer masters can
// add some): the leader's endpoints under the leader key, and each member's role and position
// under members/NAME. See cluster_address.h for the keys.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvagent/common/status.h"

namespace kvagent::coord {

// The leader key's value.
struct LeaderRecord {
  std::string name;    // the member that leads
  std::string rpc;     // its ROUTER for agents (master.fbs); empty while it is still starting
  std::string events;  // its event PUB (docs/events.md)
  std::string replay;  // its event replay ROUTER (may be empty)
  // Its framed RPC endpoint (kvmaster --framed-listen) for agents with --master-transport
  // framed; empty when it serves none. Written only when set.
  std::string framed;

  // A leader is usable once it has published where it serves.
  bool serving() const { return !rpc.empty(); }
  std::string Encode() const;
  // INTERNAL when `json` is not a leader record.
  static Result<LeaderRecord> Decode(std::string_view json);
};

// The elected leader as etcd shows it.
struct Leader {
  // The leader key's create revision: a new, larger number for every term (etcd revisions only
  // grow), carried by every reply of that term's master (master.fbs master_epoch).
  uint64_t epoch = 0;
  LeaderRecord record;
};

// A member's value. Members publish where their copy of the state stands, so that after a
// leader is gone the member with the most of its log is elected (MemberPosition).
struct MemberRecord {
  std::string name;
  std::string role;          // "leader", "follower", "candidate"
  uint64_t epoch = 0;        // the term whose log it holds (a leader: its own)
  uint64_t applied_seq = 0;  // the record of that term's log it holds up to
  int64_t election = 0;      // the revision at which the leader key it saw last was gone
                             // (0: not part of an election)
  std::string rpc;           // its own endpoint while it leads (informational)

  std::string Encode() const;
  static Result<MemberRecord> Decode(std::string_view json);
};

// Ordering of positions: a later term first, then more of it; the name breaks ties so that all
// members agree on one best.
bool BetterPosition(const MemberRecord& a, const MemberRecord& b);

}  // namespace kvagent::coord

// Private to the relay: what its own stream has told its consumers is stored.
//
// Per object key, the fingerprint and block hashes of the BlockStored that announced it, kept
// from every batch the relay publishes. A re-announce compares the store's content with it and
// publishes only the differences: BlockStored for an object that is new or changed (after a
// BlockRemoved of the old one when it changed), and at the end one BlockRemoved per object the
// content no longer lists. A consumer's index is corrected in place, without AllBlocksCleared,
// so a failover that lost acknowledged puts (asynchronous replication) reaches a router as one
// BlockRemoved per lost put, and a master restart costs the routers nothing but the difference.
//
// The relay starts without an index it can vouch for (its consumers' state is unknown): its
// first re-announce is AllBlocksCleared plus the whole content, as is any re-announce after a
// batch it could not read.
//
// Memory: one entry per stored object of the cluster, the object key plus ~100 bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "event_digest.h"
#include "kvagent/events/kv_event.h"

namespace kvagent::relay {

class DownstreamIndex {
 public:
  // Whether the index describes what consumers were told (false before the first complete
  // re-announce and after a batch that could not be read).
  bool valid() const { return valid_; }
  size_t size() const { return entries_.size(); }

  // A master batch, as is: applied, and true when consumers can read it (the relay then
  // publishes it). False when they cannot (the relay leaves it out): the index is as it was,
  // or, when the batch failed after some of its events, no longer valid (the next re-announce
  // clears).
  bool ApplyPayload(std::string_view payload);
  // Forgets everything: consumers are about to see AllBlocksCleared.
  void Clear();

  // A re-announce by differences. BeginScan; then, per listed object, Listed appends what to
  // publish for it to `out` (nothing when consumers already have it) and applies it; then
  // EndScan returns a BlockRemoved per object no page listed, and applies them. A scan that
  // starts over simply begins again: what was published so far is in the index.
  void BeginScan();
  void Listed(events::BlockStored object, std::vector<events::KvEvent>* out);
  std::vector<events::KvEvent> EndScan();
  // Marks the index valid: consumers now hold exactly what it holds (after a clearing
  // re-announce published everything).
  void Vouch() { valid_ = true; }

  // The fingerprint of an announcement: equal for equal events, whichever way they were read.
  static uint64_t Fingerprint(const EventDigest& e);

 private:
  struct Entry {
    uint64_t fingerprint = 0;
    uint64_t scan = 0;  // the last scan that listed it
    std::vector<events::BlockHash> block_hashes;
    std::string medium;
  };
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  void Apply(const EventDigest& e);
  void Store(const EventDigest& e);

  std::unordered_map<std::string, Entry, KeyHash, std::equal_to<>> entries_;
  uint64_t scan_ = 0;
  bool valid_ = false;
};

}  // namespace kvagent::relay

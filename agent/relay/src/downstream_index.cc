// DownstreamIndex: see downstream_index.h.
#include "downstream_index.h"

#include <functional>
#include <variant>

namespace kvagent::relay {
namespace {

// 64-bit mixing of the fields (a fingerprint, not a cryptographic hash: a collision would only
// leave a changed object unannounced, with odds of 2^-64 per change).
class Mix {
 public:
  void Add(uint64_t v) {
    h_ ^= v + 0x9e3779b97f4a7c15ULL + (h_ << 6) + (h_ >> 2);
    h_ *= 0xff51afd7ed558ccdULL;
    h_ ^= h_ >> 33;
  }
  // What the wire says of a hash: its 64 bits and whether it is written negative (a non-negative
  // Signed hash is written, and decoded, like an Unsigned one).
  void Add(const events::BlockHash& h) {
    Add(h.bits);
    Add(h.is_signed && static_cast<int64_t>(h.bits) < 0 ? 1 : 0);
  }
  void Add(std::string_view s) {
    Add(s.size());
    Add(std::hash<std::string_view>{}(s));
  }
  void Add(const std::optional<std::string_view>& s) {
    if (!s) return Add(uint64_t{0x5a5a});
    Add(*s);
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0x84222325cbf29ce4ULL;
};

}  // namespace

uint64_t DownstreamIndex::Fingerprint(const EventDigest& e) {
  Mix m;
  m.Add(e.block_hashes.size());
  for (const events::BlockHash& h : e.block_hashes) m.Add(h);
  m.Add(e.parent_block_hash ? 1 : 0);
  if (e.parent_block_hash) m.Add(*e.parent_block_hash);
  m.Add(e.token_count);
  m.Add(e.token_hash);
  m.Add(e.block_size);
  m.Add(e.lora_id ? 1 : 0);
  if (e.lora_id) m.Add(static_cast<uint64_t>(*e.lora_id));
  m.Add(e.medium);
  m.Add(e.lora_name);
  m.Add(e.session_id && !e.session_id->empty() ? e.session_id : std::nullopt);
  m.Add(e.group_idx ? 1 : 0);
  if (e.group_idx) m.Add(static_cast<uint64_t>(*e.group_idx));
  return m.value();
}

void DownstreamIndex::Store(const EventDigest& e) {
  if (!e.object_key) return;  // nothing this project publishes; nothing to correct later
  auto it = entries_.find(*e.object_key);
  if (it == entries_.end()) it = entries_.emplace(std::string(*e.object_key), Entry()).first;
  Entry& entry = it->second;
  entry.fingerprint = Fingerprint(e);
  entry.scan = scan_;
  entry.block_hashes.assign(e.block_hashes.begin(), e.block_hashes.end());
  if (entry.medium != e.medium) entry.medium = std::string(e.medium);
}

void DownstreamIndex::Apply(const EventDigest& e) {
  switch (e.type) {
    case EventDigest::Type::kStored:
      return Store(e);
    case EventDigest::Type::kRemoved:
      if (e.object_key) {
        auto it = entries_.find(*e.object_key);
        if (it != entries_.end()) entries_.erase(it);
      }
      return;
    case EventDigest::Type::kCleared:
      entries_.clear();
      return;
  }
}

bool DownstreamIndex::ApplyPayload(std::string_view payload) {
  size_t applied = 0;
  if (ForEachEvent(payload, [&](const EventDigest& e) {
        Apply(e);
        ++applied;
      })) {
    return true;
  }
  // Read halfway: the index holds changes consumers will never see, so it no longer says what
  // they hold; the next re-announce clears and starts afresh.
  if (applied > 0) valid_ = false;
  return false;
}

void DownstreamIndex::Clear() { entries_.clear(); }

void DownstreamIndex::BeginScan() { ++scan_; }

void DownstreamIndex::Listed(events::BlockStored object, std::vector<events::KvEvent>* out) {
  if (!object.object_key) return;
  const EventDigest digest = DigestOf(object);
  auto it = entries_.find(*object.object_key);
  if (it != entries_.end() && it->second.fingerprint == Fingerprint(digest)) {
    it->second.scan = scan_;  // consumers have it as it is
    return;
  }
  if (it != entries_.end()) {  // changed: the old blocks go first
    out->emplace_back(
        events::BlockRemoved{it->second.block_hashes, it->second.medium, object.object_key});
  }
  Store(digest);
  out->emplace_back(std::move(object));
}

std::vector<events::KvEvent> DownstreamIndex::EndScan() {
  std::vector<events::KvEvent> gone;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.scan == scan_) {
      ++it;
      continue;
    }
    gone.emplace_back(
        events::BlockRemoved{std::move(it->second.block_hashes), it->second.medium, it->first});
    it = entries_.erase(it);
  }
  return gone;
}

}  // namespace kvagent::relay

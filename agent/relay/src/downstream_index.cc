// DownstreamIndex: see downstream_index.h.
#include "downstream_index.h"

#include <functional>
#include <variant>

namespace kvagent::relay {
namespace {

// Appends what the wire says of a hash: its 64 bits and whether it is written negative (a
// non-negative Signed hash is written, and decoded, like an Unsigned one).
void AppendHash(std::string* out, const events::BlockHash& h) {
  out->append(reinterpret_cast<const char*>(&h.bits), sizeof h.bits);
  out->push_back(h.is_signed && static_cast<int64_t>(h.bits) < 0 ? '-' : '+');
}

void AppendText(std::string* out, const std::optional<std::string>& s) {
  if (!s) {
    out->push_back('\0');
    return;
  }
  const uint64_t n = s->size();
  out->push_back('\1');
  out->append(reinterpret_cast<const char*>(&n), sizeof n);
  out->append(*s);
}

}  // namespace

uint64_t DownstreamIndex::Fingerprint(const events::BlockStored& e) {
  std::string bytes;
  bytes.reserve(64 + 9 * e.block_hashes.size() + 4 * e.token_ids.size());
  const uint64_t count = e.block_hashes.size();
  bytes.append(reinterpret_cast<const char*>(&count), sizeof count);
  for (const events::BlockHash& h : e.block_hashes) AppendHash(&bytes, h);
  bytes.push_back(e.parent_block_hash ? '\1' : '\0');
  if (e.parent_block_hash) AppendHash(&bytes, *e.parent_block_hash);
  const uint64_t tokens = e.token_ids.size();
  bytes.append(reinterpret_cast<const char*>(&tokens), sizeof tokens);
  bytes.append(reinterpret_cast<const char*>(e.token_ids.data()), 4 * e.token_ids.size());
  bytes.append(reinterpret_cast<const char*>(&e.block_size), sizeof e.block_size);
  bytes.push_back(e.lora_id ? '\1' : '\0');
  if (e.lora_id) bytes.append(reinterpret_cast<const char*>(&*e.lora_id), sizeof *e.lora_id);
  AppendText(&bytes, e.medium);
  AppendText(&bytes, e.lora_name);
  AppendText(&bytes, e.session_id && !e.session_id->empty() ? e.session_id : std::nullopt);
  bytes.push_back(e.group_idx ? '\1' : '\0');
  if (e.group_idx) bytes.append(reinterpret_cast<const char*>(&*e.group_idx), sizeof *e.group_idx);
  return std::hash<std::string_view>{}(bytes);
}

void DownstreamIndex::Store(const events::BlockStored& e) {
  if (!e.object_key) return;  // nothing this project publishes; nothing to correct later
  Entry& entry = entries_[*e.object_key];
  entry.fingerprint = Fingerprint(e);
  entry.scan = scan_;
  entry.block_hashes = e.block_hashes;
  entry.medium = e.medium;
}

void DownstreamIndex::Apply(const events::KvEvent& event) {
  if (const auto* stored = std::get_if<events::BlockStored>(&event)) {
    Store(*stored);
  } else if (const auto* removed = std::get_if<events::BlockRemoved>(&event)) {
    if (removed->object_key) entries_.erase(*removed->object_key);
  } else {
    entries_.clear();  // AllBlocksCleared
  }
}

void DownstreamIndex::ApplyPayload(std::string_view payload) {
  Result<events::EventBatch> batch = events::DecodeEventBatch(payload);
  if (!batch.ok()) {
    // Consumers rejected it too (they decode as strictly): the index cannot say what they
    // hold any more. The next re-announce clears and starts afresh.
    valid_ = false;
    return;
  }
  for (const events::KvEvent& e : batch->events) Apply(e);
}

void DownstreamIndex::Clear() { entries_.clear(); }

void DownstreamIndex::BeginScan() { ++scan_; }

void DownstreamIndex::Listed(events::BlockStored object, std::vector<events::KvEvent>* out) {
  if (!object.object_key) return;
  auto it = entries_.find(*object.object_key);
  if (it != entries_.end() && it->second.fingerprint == Fingerprint(object)) {
    it->second.scan = scan_;  // consumers have it as it is
    return;
  }
  if (it != entries_.end()) {  // changed: the old blocks go first
    out->emplace_back(
        events::BlockRemoved{it->second.block_hashes, it->second.medium, object.object_key});
  }
  Store(object);
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

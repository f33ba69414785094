#include "kvagent/master/session_tags.h"

#include <algorithm>
#include <cassert>

namespace kvagent::master {

SessionTags::SessionTags() { entries_.emplace_back(); }

TagId SessionTags::Acquire(std::string_view session_id) {
  if (session_id.empty()) return kUntagged;
  if (auto it = by_name_.find(session_id); it != by_name_.end()) {
    ++entries_[it->second].refs;
    return it->second;
  }
  TagId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<TagId>(entries_.size());
    entries_.emplace_back();
  }
  entries_[id].name.assign(session_id);
  entries_[id].refs = 1;
  by_name_.emplace(std::string(session_id), id);
  return id;
}

void SessionTags::AddRef(TagId id) {
  if (id == kUntagged) return;
  assert(id < entries_.size() && entries_[id].refs > 0);
  ++entries_[id].refs;
}

void SessionTags::Release(TagId id) {
  if (id == kUntagged) return;
  assert(id < entries_.size() && entries_[id].refs > 0);
  Entry& e = entries_[id];
  if (--e.refs > 0) return;
  by_name_.erase(by_name_.find(std::string_view(e.name)));
  e.name.clear();
  e.name.shrink_to_fit();
  free_ids_.push_back(id);
}

void SessionTags::Stored(TagId id, uint64_t bytes) {
  if (id == kUntagged) return;
  assert(id < entries_.size() && entries_[id].refs > 0);
  ++entries_[id].blocks;
  entries_[id].bytes += bytes;
}

void SessionTags::Unstored(TagId id, uint64_t bytes) {
  if (id == kUntagged) return;
  assert(id < entries_.size() && entries_[id].blocks > 0 && entries_[id].bytes >= bytes);
  --entries_[id].blocks;
  entries_[id].bytes -= bytes;
}

SessionTags::Usage SessionTags::UsageOf(std::string_view session_id) const {
  auto it = by_name_.find(session_id);
  if (it == by_name_.end()) return Usage{session_id, 0, 0};
  const Entry& e = entries_[it->second];
  return Usage{e.name, e.blocks, e.bytes};
}

uint64_t SessionTags::Page(uint64_t cursor, uint32_t limit, std::vector<Usage>* out) const {
  uint64_t id = std::max<uint64_t>(cursor, 1);  // entries_[0] is the untagged sentinel
  const uint64_t look_until = id + 4 * uint64_t{limit} + 1024;
  uint32_t added = 0;
  for (; id < entries_.size() && added < limit && id < look_until; ++id) {
    const Entry& e = entries_[id];
    if (e.refs == 0 || e.blocks == 0) continue;
    out->push_back(Usage{e.name, e.blocks, e.bytes});
    ++added;
  }
  return id < entries_.size() ? id : 0;
}

std::string_view SessionTags::Name(TagId id) const {
  if (id >= entries_.size()) return {};
  return entries_[id].name;
}

bool SessionTags::Contains(std::string_view session_id) const {
  return by_name_.find(session_id) != by_name_.end();
}

}  // namespace kvagent::master

#include "kvagent/master/session_tags.h"

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

std::string_view SessionTags::Name(TagId id) const {
  if (id >= entries_.size()) return {};
  return entries_[id].name;
}

bool SessionTags::Contains(std::string_view session_id) const {
  return by_name_.find(session_id) != by_name_.end();
}

}  // namespace kvagent::master

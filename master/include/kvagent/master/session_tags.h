// SessionTags: the interned table of session IDs (SEMANTICS.md "Session attribution").
//
// An object pays a 4-byte TagId instead of a string. Each distinct session ID is stored once
// with a reference count: one reference per object (or in-flight write) holding it; the entry
// goes away with its last reference, so a revoked put leaves no tag behind (rule 3).
// TagId 0 is "untagged" and is never counted. Not thread-safe: owned by the master's thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvagent::master {

using TagId = uint32_t;
inline constexpr TagId kUntagged = 0;

class SessionTags {
 public:
  SessionTags();
  SessionTags(const SessionTags&) = delete;
  SessionTags& operator=(const SessionTags&) = delete;

  // Takes a reference on `session_id` and returns its id; "" returns kUntagged (no reference).
  // The caller must have validated the ID (common/validate.h).
  [[nodiscard]] TagId Acquire(std::string_view session_id);

  // Takes one more reference on an id the caller already holds (kUntagged: no-op).
  void AddRef(TagId id);

  // Drops one reference; the entry is erased with its last one (kUntagged: no-op).
  void Release(TagId id);

  // The session ID of `id` ("" for kUntagged). The view is valid while the id is referenced.
  std::string_view Name(TagId id) const;

  // Distinct session IDs currently referenced.
  size_t size() const { return by_name_.size(); }
  // True when `session_id` is referenced by at least one object or write.
  bool Contains(std::string_view session_id) const;

 private:
  struct Entry {
    std::string name;
    uint64_t refs = 0;
  };
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<Entry> entries_;  // index = TagId; entries_[0] is the untagged sentinel
  std::vector<TagId> free_ids_;
  std::unordered_map<std::string, TagId, Hash, std::equal_to<>> by_name_;
};

}  // namespace kvagent::master

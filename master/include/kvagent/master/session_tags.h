// SessionTags: the interned table of session IDs (docs/semantics.md, "Sessions").
//
// An object pays a 4-byte TagId instead of a string. Each distinct session ID is stored once
// with a reference count: one reference per object (or in-flight write) holding it; the entry
// goes away with its last reference, so a revoked put leaves no tag behind (rule 3).
// TagId 0 is "untagged" and is never counted. Not thread-safe: owned by the master's thread.
//
// Next to the reference count, each session keeps what the cluster stores for it now: blocks
// (readable objects tagged with it) and their bytes, updated by the metadata store where an
// object becomes readable (Stored) or stops being so (Unstored). `kvctl sessions` reads them
// without scanning objects: one session in O(1), all of them in pages.
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

  // An object tagged `id` of `bytes` became readable / stopped being readable (kUntagged: no-op).
  // The caller holds a reference on `id` meanwhile.
  void Stored(TagId id, uint64_t bytes);
  void Unstored(TagId id, uint64_t bytes);

  struct Usage {
    std::string_view session_id;  // valid while the session is referenced
    uint64_t blocks = 0;
    uint64_t bytes = 0;
  };
  // What is stored for `session_id` now (zeros when nothing is).
  Usage UsageOf(std::string_view session_id) const;
  // Appends sessions with at least one stored block, in tag order from `cursor` (0 to start),
  // until `limit` were appended or about 4 * limit + 1024 tags were looked at; returns the
  // cursor to go on with, 0 when every tag was seen.
  uint64_t Page(uint64_t cursor, uint32_t limit, std::vector<Usage>* out) const;

  // Distinct session IDs currently referenced.
  size_t size() const { return by_name_.size(); }
  // True when `session_id` is referenced by at least one object or write.
  bool Contains(std::string_view session_id) const;

 private:
  struct Entry {
    std::string name;
    uint64_t refs = 0;
    uint64_t blocks = 0;  // readable objects with this tag
    uint64_t bytes = 0;   // their value bytes
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

// ObjectTable: the key -> object index of the master, an open-addressing hash table.
//
// Why not std::unordered_map: at a million keys every lookup there walks a bucket pointer, a
// predecessor node and the node itself (three cache misses), every node carries a next pointer
// and a cached hash, and ListKeys cannot page through it across a rehash. Here:
//   - slots are one 64-bit word: a 16-bit hash fingerprint over a 48-bit entry pointer
//     (user-space pointers fit in 47 bits on x86-64 and AArch64; checked at insert), 0 = empty,
//     1 = tombstone. A miss usually touches one cache line; a hit adds the entry itself.
//   - an entry (key + Object) is one heap allocation whose address never changes, so the
//     intrusive LRU links and the callers' ObjectEntry* stay valid across growth.
//   - linear probing, home slot = the top bits of the hash, so home slots are in hash order.
//     Scan() pages by hash *value* rather than slot position, which stays correct when the
//     table grows or is rebuilt between pages: every key present during the whole scan is
//     returned exactly once.
// Load (live + tombstones) stays at most 7/8; above it the table doubles (or, when mostly
// tombstones, is rebuilt at the same size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvagent::master {

struct Object;
using ObjectEntry = std::pair<const std::string, Object>;

class ObjectTable {
 public:
  ObjectTable();
  ~ObjectTable();  // deletes every entry
  ObjectTable(const ObjectTable&) = delete;
  ObjectTable& operator=(const ObjectTable&) = delete;

  // The entry of `key`, or nullptr.
  ObjectEntry* Find(std::string_view key) const;
  // f(i, Find(key_at(i))) for i in [0, n), in order. A batch's lookups each miss the cache
  // twice (the slot, then the entry); here every key's hash is taken first, and each key's slot
  // and entry are asked of the CPU a few keys ahead, so the misses of a batch overlap instead of
  // queueing. f must not insert or erase.
  template <typename KeyAt, typename F>
  void FindEach(size_t n, KeyAt&& key_at, F&& f) const {
    constexpr size_t kSlotAhead = 8, kEntryAhead = 4;
    hashes_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      hashes_[i] = Hash(key_at(i));
      if (i < kSlotAhead) PrefetchSlot(hashes_[i]);
    }
    for (size_t i = 0; i < n; ++i) {
      if (i + kSlotAhead < n) PrefetchSlot(hashes_[i + kSlotAhead]);
      if (i + kEntryAhead < n) PrefetchEntry(hashes_[i + kEntryAhead]);
      f(i, FindHashed(key_at(i), hashes_[i]));
    }
  }
  // The entry of `key`; a new default-constructed one (second = true) when there was none.
  std::pair<ObjectEntry*, bool> FindOrInsert(std::string_view key);
  // Removes and deletes `e` (which must be in the table).
  void Erase(ObjectEntry* e);

  size_t size() const { return live_; }
  size_t capacity() const { return capacity_; }

  // Calls f(ObjectEntry&) for every entry. f must not insert or erase.
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t i = 0; i < capacity_; ++i) {
      if (slots_[i] > kTombstone) f(*EntryOf(slots_[i]));
    }
  }

  // One page of a scan in hash order: appends the entries whose hash h satisfies
  // from <= h < next, where next covers about `limit` home slots, and returns next (0 when the
  // page reached the end of the hash space).
  uint64_t Scan(uint64_t from, size_t limit, std::vector<ObjectEntry*>* out) const;

  static uint64_t Hash(std::string_view key);

 private:
  static constexpr uint64_t kEmpty = 0;
  static constexpr uint64_t kTombstone = 1;
  static constexpr uint64_t kPointerMask = (uint64_t{1} << 48) - 1;

  static ObjectEntry* EntryOf(uint64_t slot) {
    return reinterpret_cast<ObjectEntry*>(slot & kPointerMask);
  }
  static uint64_t Fingerprint(uint64_t hash) { return (hash & 0xffff) << 48; }
  size_t Home(uint64_t hash) const { return static_cast<size_t>(hash >> shift_); }
  size_t SlotOf(const ObjectEntry* e) const;
  ObjectEntry* FindHashed(std::string_view key, uint64_t h) const;
  void PrefetchSlot(uint64_t h) const { __builtin_prefetch(&slots_[Home(h)]); }
  // The entry in the key's home slot, when its fingerprint matches (the common case: linear
  // probing keeps most keys in their home slot).
  void PrefetchEntry(uint64_t h) const {
    const uint64_t s = slots_[Home(h)];
    if (s > kTombstone && (s & ~kPointerMask) == Fingerprint(h)) {
      __builtin_prefetch(reinterpret_cast<const void*>(s & kPointerMask));
    }
  }
  void Rebuild(size_t capacity);

  std::unique_ptr<uint64_t[]> slots_;
  size_t capacity_ = 0;  // a power of two
  unsigned shift_ = 0;   // 64 - log2(capacity_)
  size_t live_ = 0;
  size_t tombstones_ = 0;
  mutable std::vector<uint64_t> hashes_;  // FindEach's scratch (the table is single-threaded)
};

}  // namespace kvagent::master

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
// tombstones, is rebuilt at the same size). Growth is incremental, so that no call pays for the
// whole table (rehashing 1.8 M entries at once stalled the master for 0.1-0.2 s, plus 60 ms to
// zero the new array): the doubled array is prepared from 5/8 load on (PrepareGrowth), and at
// 7/8 the entries start moving over from the old one, kMoveStep old slots with every insert.
// While a move is under way a key is in exactly one of the two arrays; lookups try the new
// one, then the old, whose moved slots are tombstones so that its probe chains stay whole. The
// move ends long before the new array can fill: a doubled table takes 7/8 of its old capacity
// in inserts before it grows again, the move capacity / kMoveStep.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "entry_slabs.h"

namespace kvagent::master {

struct Object;
using ObjectEntry = std::pair<const std::string, Object>;

class ObjectTable {
 public:
  // `move_step`: old slots visited per insert while a growth's move is under way (tests use
  // small steps to see every interleaving).
  explicit ObjectTable(size_t move_step = kMoveStep);
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
  // Old slots a growth still has to go through (0 when no move is under way). For tests.
  size_t slots_left_to_move() const { return old_ ? old_capacity_ - moved_ : 0; }

  // Old slots visited per insert while a move is under way, by default: ~55 entries, 1-3 us.
  static constexpr size_t kMoveStep = 64;

  // Calls f(ObjectEntry&) for every entry. f must not insert or erase.
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t i = 0; i < capacity_; ++i) {
      if (slots_[i] > kTombstone) f(*EntryOf(slots_[i]));
    }
    for (size_t i = moved_; old_ && i < old_capacity_; ++i) {
      if (old_[i] > kTombstone) f(*EntryOf(old_[i]));
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
  // The slot of `e` in `slots` (capacity a power of two, home slot = hash >> shift), or
  // `capacity` when it is not there.
  static size_t SlotIn(const uint64_t* slots, size_t capacity, unsigned shift,
                       const ObjectEntry* e);
  // The entry of `key` (hash h) in `slots`, or nullptr.
  static ObjectEntry* FindIn(const uint64_t* slots, size_t capacity, unsigned shift,
                             std::string_view key, uint64_t h);
  static void ScanIn(const uint64_t* slots, size_t capacity, unsigned shift, uint64_t from,
                     uint64_t next, std::vector<ObjectEntry*>* out);
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
  // Starts a move into a new array of `capacity` (finishing any move under way first).
  void StartRebuild(size_t capacity);
  // Moves the live entries of the next `slots` old slots into the new array.
  void MoveSome(size_t slots);
  // From 5/8 load on, while no move is under way: the doubled array is allocated and its pages
  // faulted in a few bytes per insert, so that no single insert pays for many of them at once
  // (the move's first inserts land in random slots of the whole array).
  void PrepareGrowth();

  // Slot arrays come from calloc: zero without a memset when the memory is fresh (glibc maps
  // arrays of 32 MiB and more on their own), so their pages are faulted in as PrepareGrowth,
  // the move and the inserts first touch them, not all in one call (32 MiB of slots zeroed up
  // front took 60 ms on the test VM, where a first touch costs ~3.5 ms per 2 MiB huge page).
  struct FreeSlots {
    void operator()(uint64_t* p) const { std::free(p); }
  };
  using SlotArray = std::unique_ptr<uint64_t[], FreeSlots>;
  static SlotArray AllocateSlots(size_t capacity);

  SlotArray slots_;
  size_t capacity_ = 0;    // a power of two
  unsigned shift_ = 0;     // 64 - log2(capacity_)
  size_t live_ = 0;        // entries in both arrays
  size_t tombstones_ = 0;  // in slots_ only
  // The array being moved out of, while a growth is under way; its slots below moved_ are
  // done (tombstones or empty).
  SlotArray old_;
  size_t old_capacity_ = 0;
  unsigned old_shift_ = 0;
  size_t moved_ = 0;
  size_t move_step_;
  // The next, doubled array (PrepareGrowth), of next_capacity_ slots; its first
  // next_touched_bytes_ have been written once.
  SlotArray next_;
  size_t next_capacity_ = 0;
  size_t next_touched_bytes_ = 0;
  mutable std::vector<uint64_t> hashes_;  // FindEach's scratch (the table is single-threaded)
  EntrySlabs<ObjectEntry> entries_;       // the entries' memory; destroyed after them
};

}  // namespace kvagent::master

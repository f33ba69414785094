#include "object_table.h"

#include <glog/logging.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <functional>
#include <new>

#include "metadata_store.h"

namespace kvagent::master {

namespace {
constexpr size_t kInitialCapacity = 64;
// Tables below this many slots grow without PrepareGrowth: their arrays are small enough to
// fault in at once.
constexpr size_t kPrepareFrom = size_t{1} << 16;
}  // namespace

ObjectTable::ObjectTable(size_t move_step) : move_step_(std::max<size_t>(move_step, 1)) {
  StartRebuild(kInitialCapacity);
}

ObjectTable::~ObjectTable() {
  ForEach([this](ObjectEntry& e) { entries_.Delete(&e); });
}

uint64_t ObjectTable::Hash(std::string_view key) {
  // std::hash (64-bit murmur) then a multiplicative mix: the home slot uses the top bits.
  const uint64_t h = std::hash<std::string_view>{}(key)*0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

ObjectEntry* ObjectTable::Find(std::string_view key) const { return FindHashed(key, Hash(key)); }

ObjectEntry* ObjectTable::FindIn(const uint64_t* slots, size_t capacity, unsigned shift,
                                 std::string_view key, uint64_t h) {
  const uint64_t fingerprint = Fingerprint(h);
  const size_t mask = capacity - 1;
  for (size_t i = static_cast<size_t>(h >> shift);; i = (i + 1) & mask) {
    const uint64_t s = slots[i];
    if (s == kEmpty) return nullptr;
    if (s != kTombstone && (s & ~kPointerMask) == fingerprint && EntryOf(s)->first == key) {
      return EntryOf(s);
    }
  }
}

ObjectEntry* ObjectTable::FindHashed(std::string_view key, uint64_t h) const {
  ObjectEntry* e = FindIn(slots_.get(), capacity_, shift_, key, h);
  if (e == nullptr && old_) e = FindIn(old_.get(), old_capacity_, old_shift_, key, h);
  return e;
}

std::pair<ObjectEntry*, bool> ObjectTable::FindOrInsert(std::string_view key) {
  const uint64_t h = Hash(key);
  const uint64_t fingerprint = Fingerprint(h);
  const size_t mask = capacity_ - 1;
  size_t insert_at = capacity_;  // first tombstone on the probe path, if any
  size_t i = Home(h);
  for (;; i = (i + 1) & mask) {
    const uint64_t s = slots_[i];
    if (s == kEmpty) break;
    if (s == kTombstone) {
      if (insert_at == capacity_) insert_at = i;
    } else if ((s & ~kPointerMask) == fingerprint && EntryOf(s)->first == key) {
      return {EntryOf(s), false};
    }
  }
  if (old_) {
    if (ObjectEntry* e = FindIn(old_.get(), old_capacity_, old_shift_, key, h)) return {e, false};
  }
  if (insert_at == capacity_) {
    insert_at = i;
  } else {
    --tombstones_;
  }
  ObjectEntry* e =
      entries_.New(std::piecewise_construct, std::forward_as_tuple(key), std::forward_as_tuple());
  const auto bits = reinterpret_cast<uint64_t>(e);
  CHECK_EQ(bits & ~kPointerMask, 0u)
      << "heap address above 2^48: no room for ObjectTable's fingerprint";
  slots_[insert_at] = fingerprint | bits;
  ++live_;
  if (old_) {
    MoveSome(move_step_);
  } else if ((live_ + tombstones_) * 8 > capacity_ * 5 && capacity_ >= kPrepareFrom) {
    PrepareGrowth();
  }
  if ((live_ + tombstones_) * 8 > capacity_ * 7) {
    StartRebuild(live_ * 2 >= capacity_ ? capacity_ * 2 : capacity_);
  }
  return {e, true};
}

size_t ObjectTable::SlotIn(const uint64_t* slots, size_t capacity, unsigned shift,
                           const ObjectEntry* e) {
  const size_t mask = capacity - 1;
  const auto bits = reinterpret_cast<uint64_t>(e);
  for (size_t i = static_cast<size_t>(Hash(e->first) >> shift);; i = (i + 1) & mask) {
    if (slots[i] == kEmpty) return capacity;
    if (slots[i] > kTombstone && (slots[i] & kPointerMask) == bits) return i;
  }
}

void ObjectTable::Erase(ObjectEntry* e) {
  if (const size_t i = SlotIn(slots_.get(), capacity_, shift_, e); i != capacity_) {
    slots_[i] = kTombstone;
    ++tombstones_;
  } else {
    const size_t j = old_ ? SlotIn(old_.get(), old_capacity_, old_shift_, e) : old_capacity_;
    CHECK_NE(j, old_capacity_) << "ObjectTable::Erase of an entry that is not in the table";
    old_[j] = kTombstone;  // the old array's chains must stay whole until the move ends
  }
  --live_;
  entries_.Delete(e);
}

ObjectTable::SlotArray ObjectTable::AllocateSlots(size_t capacity) {
  void* p = std::calloc(capacity, sizeof(uint64_t));
  if (p == nullptr) throw std::bad_alloc();
  return SlotArray(static_cast<uint64_t*>(p));
}

void ObjectTable::PrepareGrowth() {
  if (live_ * 2 < capacity_) return;  // mostly tombstones: the rebuild will keep the size
  if (!next_) {
    next_capacity_ = capacity_ * 2;
    next_ = AllocateSlots(next_capacity_);
    next_touched_bytes_ = 0;
  }
  // The inserts from 5/8 to 7/8 load (capacity / 4 of them) touch the doubled array's 16 bytes
  // per slot once: 64 bytes each, a page every 64 inserts.
  const size_t bytes = next_capacity_ * sizeof(uint64_t);
  const size_t page = 4096;
  if (next_touched_bytes_ >= bytes) return;
  const size_t before = next_touched_bytes_;
  next_touched_bytes_ = std::min(bytes, before + 64);
  // The pages that start in [before, next_touched_bytes_): usually none, one every 64 calls.
  // A write, so that the page itself comes in (a read would map the shared zero page).
  auto* base = reinterpret_cast<volatile uint8_t*>(next_.get());
  for (size_t at = (before + page - 1) / page * page; at < next_touched_bytes_; at += page) {
    base[at] = 0;
  }
}

void ObjectTable::StartRebuild(size_t capacity) {
  if (old_) MoveSome(old_capacity_ - moved_);
  old_ = std::move(slots_);
  old_capacity_ = capacity_;
  old_shift_ = shift_;
  moved_ = 0;
  if (next_ && next_capacity_ == capacity) {
    slots_ = std::move(next_);  // prepared: zero, its pages faulted in
  } else {
    slots_ = AllocateSlots(capacity);  // zero: all empty
  }
  next_.reset();
  next_capacity_ = 0;
  capacity_ = capacity;
  shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
  tombstones_ = 0;
  if (old_capacity_ == 0) old_.reset();  // the first array: nothing to move
}

void ObjectTable::MoveSome(size_t slots) {
  // Each live entry's key is hashed again: a cache miss for the entry, another for a key longer
  // than the string's inline buffer, a third for the new slot. In groups of kGroup, each step
  // asks for all the group's lines before it needs the first, so the misses overlap.
  constexpr size_t kGroup = 32;
  uint64_t group[kGroup];
  uint64_t hashes[kGroup];
  const size_t mask = capacity_ - 1;
  const size_t end = std::min(old_capacity_, moved_ + slots);
  while (moved_ < end) {
    size_t n = 0;
    for (; moved_ < end && n < kGroup; ++moved_) {
      const uint64_t s = old_[moved_];
      if (s <= kTombstone) continue;
      old_[moved_] = kTombstone;
      group[n++] = s;
      __builtin_prefetch(EntryOf(s));
    }
    for (size_t k = 0; k < n; ++k) __builtin_prefetch(EntryOf(group[k])->first.data());
    for (size_t k = 0; k < n; ++k) {
      hashes[k] = Hash(EntryOf(group[k])->first);
      __builtin_prefetch(&slots_[Home(hashes[k])], 1);
    }
    for (size_t k = 0; k < n; ++k) {
      size_t i = Home(hashes[k]);
      while (slots_[i] > kTombstone) i = (i + 1) & mask;
      if (slots_[i] == kTombstone) --tombstones_;
      slots_[i] = group[k];
    }
  }
  if (moved_ == old_capacity_) {
    old_.reset();
    old_capacity_ = 0;
    moved_ = 0;
  }
}

void ObjectTable::ScanIn(const uint64_t* slots, size_t capacity, unsigned shift, uint64_t from,
                         uint64_t next, std::vector<ObjectEntry*>* out) {
  // The home slots of hashes in [from, next) (next = 0: to the end of the hash space).
  const size_t first = static_cast<size_t>(from >> shift);
  const size_t end = next == 0 ? capacity : static_cast<size_t>(((next - 1) >> shift) + 1);
  // Entries with a home in [first, end) sit between their home and the first empty slot after
  // it, possibly wrapped past the end of the array: walk until an empty slot at or after end.
  const size_t mask = capacity - 1;
  size_t i = first;
  for (size_t steps = 0; steps < capacity; ++steps, i = (i + 1) & mask) {
    const uint64_t s = slots[i];
    const bool past_range = steps >= end - first;
    if (s == kEmpty) {
      if (past_range) break;
      continue;
    }
    if (s == kTombstone) continue;
    ObjectEntry* e = EntryOf(s);
    const uint64_t h = Hash(e->first);
    if (h >= from && (next == 0 || h < next)) out->push_back(e);
  }
}

uint64_t ObjectTable::Scan(uint64_t from, size_t limit, std::vector<ObjectEntry*>* out) const {
  const size_t first = Home(from);
  const size_t end = first + std::min(std::max<size_t>(limit, 1), capacity_ - first);
  const uint64_t next = end == capacity_ ? 0 : uint64_t{end} << shift_;
  ScanIn(slots_.get(), capacity_, shift_, from, next, out);
  if (old_) ScanIn(old_.get(), old_capacity_, old_shift_, from, next, out);
  return next;
}

}  // namespace kvagent::master

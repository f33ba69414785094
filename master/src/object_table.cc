#include "object_table.h"

#include <glog/logging.h>

#include <bit>
#include <functional>

#include "metadata_store.h"

namespace kvagent::master {

namespace {
constexpr size_t kInitialCapacity = 64;
}  // namespace

ObjectTable::ObjectTable() { Rebuild(kInitialCapacity); }

ObjectTable::~ObjectTable() {
  for (size_t i = 0; i < capacity_; ++i) {
    if (slots_[i] > kTombstone) delete EntryOf(slots_[i]);
  }
}

uint64_t ObjectTable::Hash(std::string_view key) {
  // std::hash (64-bit murmur) then a multiplicative mix: the home slot uses the top bits.
  const uint64_t h = std::hash<std::string_view>{}(key)*0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

ObjectEntry* ObjectTable::Find(std::string_view key) const { return FindHashed(key, Hash(key)); }

ObjectEntry* ObjectTable::FindHashed(std::string_view key, uint64_t h) const {
  const uint64_t fingerprint = Fingerprint(h);
  const size_t mask = capacity_ - 1;
  for (size_t i = Home(h);; i = (i + 1) & mask) {
    const uint64_t s = slots_[i];
    if (s == kEmpty) return nullptr;
    if (s != kTombstone && (s & ~kPointerMask) == fingerprint && EntryOf(s)->first == key) {
      return EntryOf(s);
    }
  }
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
  if (insert_at == capacity_) {
    insert_at = i;
  } else {
    --tombstones_;
  }
  auto* e = new ObjectEntry(std::piecewise_construct, std::forward_as_tuple(key),
                            std::forward_as_tuple());
  const auto bits = reinterpret_cast<uint64_t>(e);
  CHECK_EQ(bits & ~kPointerMask, 0u)
      << "heap address above 2^48: no room for ObjectTable's fingerprint";
  slots_[insert_at] = fingerprint | bits;
  ++live_;
  if ((live_ + tombstones_) * 8 > capacity_ * 7) {
    Rebuild(live_ * 2 >= capacity_ ? capacity_ * 2 : capacity_);
  }
  return {e, true};
}

size_t ObjectTable::SlotOf(const ObjectEntry* e) const {
  const size_t mask = capacity_ - 1;
  const auto bits = reinterpret_cast<uint64_t>(e);
  for (size_t i = Home(Hash(e->first));; i = (i + 1) & mask) {
    if ((slots_[i] & kPointerMask) == bits && slots_[i] > kTombstone) return i;
    CHECK_NE(slots_[i], kEmpty) << "ObjectTable::Erase of an entry that is not in the table";
  }
}

void ObjectTable::Erase(ObjectEntry* e) {
  slots_[SlotOf(e)] = kTombstone;
  ++tombstones_;
  --live_;
  delete e;
}

void ObjectTable::Rebuild(size_t capacity) {
  std::unique_ptr<uint64_t[]> old = std::move(slots_);
  const size_t old_capacity = capacity_;
  slots_ = std::make_unique<uint64_t[]>(capacity);  // zero: all empty
  capacity_ = capacity;
  shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
  tombstones_ = 0;
  // Each live entry's key is hashed again: a cache miss for the entry, another for a key longer
  // than the string's inline buffer, a third for the new slot. One entry at a time, a table of
  // millions stalled the master for half a second per doubling (4 M slots: 549 ms on the test
  // VM); in groups of kGroup, each step asks for all the group's lines before it needs the
  // first, so the misses overlap.
  constexpr size_t kGroup = 32;
  uint64_t group[kGroup];
  uint64_t hashes[kGroup];
  const size_t mask = capacity_ - 1;
  for (size_t j = 0; j < old_capacity;) {
    size_t n = 0;
    for (; j < old_capacity && n < kGroup; ++j) {
      if (old[j] <= kTombstone) continue;
      group[n++] = old[j];
      __builtin_prefetch(EntryOf(old[j]));
    }
    for (size_t k = 0; k < n; ++k) __builtin_prefetch(EntryOf(group[k])->first.data());
    for (size_t k = 0; k < n; ++k) {
      hashes[k] = Hash(EntryOf(group[k])->first);
      __builtin_prefetch(&slots_[Home(hashes[k])], 1);
    }
    for (size_t k = 0; k < n; ++k) {
      size_t i = Home(hashes[k]);
      while (slots_[i] != kEmpty) i = (i + 1) & mask;
      slots_[i] = group[k];
    }
  }
}

uint64_t ObjectTable::Scan(uint64_t from, size_t limit, std::vector<ObjectEntry*>* out) const {
  const size_t first = Home(from);
  const size_t end = first + std::min(std::max<size_t>(limit, 1), capacity_ - first);
  const bool last_page = end == capacity_;
  const uint64_t next = last_page ? 0 : uint64_t{end} << shift_;
  // Entries with a home in [first, end) sit between their home and the first empty slot after
  // it, possibly wrapped past the end of the array: walk until an empty slot at or after end.
  const size_t mask = capacity_ - 1;
  size_t i = first;
  for (size_t steps = 0; steps < capacity_; ++steps, i = (i + 1) & mask) {
    const uint64_t s = slots_[i];
    const bool past_range = steps >= end - first;
    if (s == kEmpty) {
      if (past_range) break;
      continue;
    }
    if (s == kTombstone) continue;
    ObjectEntry* e = EntryOf(s);
    const uint64_t h = Hash(e->first);
    if (h >= from && (last_page || h < next)) out->push_back(e);
  }
  return next;
}

}  // namespace kvagent::master

// EntrySlabs: the memory of ObjectTable's entries, in 32 KiB slabs.
//
// malloc gives every allocation an 8-byte header and rounds it up to 16 bytes: a 128-byte entry
// (the key's std::string and its Object) took a 144-byte chunk, 16 bytes a key more than before
// the object gained its version (master_bench's master.bytes_per_key: 171 B against 155). From a
// slab an entry costs its own size and a slab's 64-byte header shared by 255 entries.
//
// New hands out the free slot of the lowest address (the first free slot of the lowest slab that
// has one), so entries made one after another lie one after another, also after the keys were
// removed in any order: a batch's keys, inserted together, are then read together from a few
// lines and pages. (A last-freed-first list scattered them after a RemoveAll, which frees in hash
// order: e2e_bench's 128-key gets ran at 0.60x the rate.)
//
// Sanitizer builds allocate every entry on its own (new and delete), so that AddressSanitizer
// still catches a use of an erased entry.
//
// Single-threaded, as the table. T may be incomplete where the class is named (object_table.h);
// the members are instantiated where T is complete.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <new>
#include <set>
#include <utility>
#include <vector>

namespace kvagent::master {

template <typename T>
class EntrySlabs {
 public:
  static constexpr size_t kSlabBytes = 32 * 1024;  // also the slabs' alignment
  static constexpr size_t kHeaderBytes = 64;

  EntrySlabs() = default;
  ~EntrySlabs() {
    for (Slab* slab : slabs_) ::operator delete(slab, std::align_val_t(kSlabBytes));
  }
  EntrySlabs(const EntrySlabs&) = delete;
  EntrySlabs& operator=(const EntrySlabs&) = delete;

  // Entries one slab holds.
  static constexpr size_t PerSlab() {
    return std::min<size_t>(256, (kSlabBytes - kHeaderBytes) / SlotBytes());  // 256: the bitmap
  }

  // A T constructed from `args` (what `new T(args...)` would make).
  template <typename... Args>
  T* New(Args&&... args) {
#if defined(__SANITIZE_ADDRESS__)
    return new T(std::forward<Args>(args)...);
#else
    if (open_.empty()) Grow();
    Slab* slab = *open_.begin();
    const size_t i = slab->FirstFree();
    slab->Take(i);
    if (slab->Full()) open_.erase(open_.begin());
    void* slot = SlotOf(slab, i);
    try {
      return new (slot) T(std::forward<Args>(args)...);
    } catch (...) {
      Give(slot);
      throw;
    }
#endif
  }

  // Destroys `t` (from New) and frees its slot.
  void Delete(T* t) {
#if defined(__SANITIZE_ADDRESS__)
    delete t;
#else
    t->~T();
    Give(t);
#endif
  }

 private:
  static constexpr size_t SlotBytes() {
    const size_t align = alignof(T);
    return (sizeof(T) + align - 1) / align * align;
  }

  // The header at the start of each slab: which of its slots are free (bit set).
  struct Slab {
    uint64_t free[4] = {};
    size_t FirstFree() const {
      for (size_t w = 0;; ++w) {
        if (free[w] != 0) return w * 64 + static_cast<size_t>(std::countr_zero(free[w]));
      }
    }
    void Take(size_t i) { free[i / 64] &= ~(uint64_t{1} << (i % 64)); }
    void Give(size_t i) { free[i / 64] |= uint64_t{1} << (i % 64); }
    bool Full() const { return (free[0] | free[1] | free[2] | free[3]) == 0; }
  };

  static void* SlotOf(Slab* slab, size_t i) {
    return reinterpret_cast<unsigned char*>(slab) + kHeaderBytes + i * SlotBytes();
  }

  void Give(void* slot) {
    const auto at = reinterpret_cast<uintptr_t>(slot);
    auto* slab = reinterpret_cast<Slab*>(at & ~uintptr_t{kSlabBytes - 1});
    const bool was_full = slab->Full();
    slab->Give((at - reinterpret_cast<uintptr_t>(slab) - kHeaderBytes) / SlotBytes());
    if (was_full) open_.insert(slab);
  }

  void Grow() {
    static_assert(alignof(T) <= kHeaderBytes && sizeof(Slab) <= kHeaderBytes);
    static_assert(PerSlab() >= 1);
    slabs_.reserve(slabs_.size() + 1);  // so that the push below cannot throw
    void* memory = ::operator new(kSlabBytes, std::align_val_t(kSlabBytes));
    auto* slab = new (memory) Slab();
    slabs_.push_back(slab);
    for (size_t i = 0; i < PerSlab(); ++i) slab->Give(i);
    open_.insert(slab);
  }

  std::vector<Slab*> slabs_;
  std::set<Slab*> open_;  // the slabs with a free slot, by address
};

}  // namespace kvagent::master

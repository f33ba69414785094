// EntrySlabs: the memory of ObjectTable's entries, kPerSlab entries at a time.
//
// malloc gives every allocation an 8-byte header and rounds it up to 16 bytes: a 128-byte entry
// (the key's std::string and its Object) took a 144-byte chunk, 16 bytes a key more than before
// the object gained its version (master_bench's master.bytes_per_key: 171 B against 155). From a
// slab an entry costs its own size. Freed entries are handed out again first, the last freed
// first; the slabs are given back when the table is destroyed.
//
// Sanitizer builds allocate every entry on its own (new and delete), so that AddressSanitizer
// still catches a use of an erased entry.
//
// Single-threaded, as the table. T may be incomplete where the class is named (object_table.h);
// the members are instantiated where T is complete.
#pragma once

#include <algorithm>
#include <cstddef>
#include <new>
#include <utility>
#include <vector>

namespace kvagent::master {

template <typename T>
class EntrySlabs {
 public:
  static constexpr size_t kPerSlab = 256;

  EntrySlabs() = default;
  ~EntrySlabs() {
    for (void* slab : slabs_) ::operator delete(slab);
  }
  EntrySlabs(const EntrySlabs&) = delete;
  EntrySlabs& operator=(const EntrySlabs&) = delete;

  // A T constructed from `args` (what `new T(args...)` would make).
  template <typename... Args>
  T* New(Args&&... args) {
#if defined(__SANITIZE_ADDRESS__)
    return new T(std::forward<Args>(args)...);
#else
    if (free_ == nullptr) Grow();
    void* slot = free_;
    free_ = *static_cast<void**>(slot);
    try {
      return new (slot) T(std::forward<Args>(args)...);
    } catch (...) {
      Give(slot);
      throw;
    }
#endif
  }

  // Destroys `t` (from New) and keeps its memory for the next New.
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
    const size_t bytes = std::max(sizeof(T), sizeof(void*));
    const size_t align = std::max(alignof(T), alignof(void*));
    return (bytes + align - 1) / align * align;
  }

  void Give(void* slot) {
    *static_cast<void**>(slot) = free_;
    free_ = slot;
  }

  void Grow() {
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
    slabs_.reserve(slabs_.size() + 1);  // so that the push below cannot throw
    auto* slab = static_cast<unsigned char*>(::operator new(SlotBytes() * kPerSlab));
    slabs_.push_back(slab);
    for (size_t i = kPerSlab; i-- > 0;) Give(slab + i * SlotBytes());
  }

  std::vector<void*> slabs_;
  void* free_ = nullptr;  // the first free slot; each free slot holds the next
};

}  // namespace kvagent::master

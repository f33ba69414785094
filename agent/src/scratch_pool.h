// The containers a batch fills and drops, kept for the next batch of its kind: a single-key call
// then allocates none of them (each allocation costs ~100 instructions in malloc and free, and a
// put or get made ~20 of them).
//
// A batch names its recycled members in one std::tie (its Recycled()); `Scratch` is the tuple of
// their types. Its ScratchLease swaps them in when the batch is made and out, cleared, when it is
// destroyed: a member not named there is an ordinary member, fresh for every batch. Service
// thread only.
#pragma once

#include <cstddef>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

namespace kvagent::agent {

// What the service thread keeps of the containers its batches drop: at most kMaxSpareSets spare
// sets of a kind, none that grew past kMaxSpareElements elements (a batch of thousands of keys).
inline constexpr size_t kMaxSpareSets = 16;
inline constexpr size_t kMaxSpareElements = 1024;

template <typename Scratch>
class ScratchPool {
 public:
  // A spare set of containers, every one empty (new when none is spare).
  std::unique_ptr<Scratch> Take() {
    if (spare_.empty()) return std::make_unique<Scratch>();
    std::unique_ptr<Scratch> s = std::move(spare_.back());
    spare_.pop_back();
    return s;
  }
  // Keeps `s` cleared for a later Take, unless enough are spare or it grew large (a batch of
  // thousands of keys): those are freed.
  void Give(std::unique_ptr<Scratch> s) {
    if (s == nullptr || spare_.size() >= kMaxSpareSets) return;
    bool large = false;
    std::apply([&large](auto&... c) { ((large |= c.capacity() > kMaxSpareElements), ...); }, *s);
    if (large) return;
    std::apply([](auto&... c) { (c.clear(), ...); }, *s);
    spare_.push_back(std::move(s));
  }
  size_t spare() const { return spare_.size(); }

 private:
  std::vector<std::unique_ptr<Scratch>> spare_;
};

template <typename Scratch>
struct ScratchRefs;
template <typename... C>
struct ScratchRefs<std::tuple<C...>> {
  using type = std::tuple<C&...>;  // what std::tie of the members gives
};

// Lends a batch its recycled members for its lifetime: declared after them, it is made after
// and destroyed before them.
template <typename Scratch>
class ScratchLease {
 public:
  using Members = typename ScratchRefs<Scratch>::type;
  // `pool` may be null: the members stay as they are (empty).
  ScratchLease(ScratchPool<Scratch>* pool, Members members)
      : pool_(pool), members_(members), scratch_(pool != nullptr ? pool->Take() : nullptr) {
    if (scratch_ != nullptr) Swap();
  }
  ~ScratchLease() {
    if (scratch_ == nullptr) return;
    Swap();
    pool_->Give(std::move(scratch_));
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;

 private:
  void Swap() {
    [this]<size_t... I>(std::index_sequence<I...>) {
      (std::get<I>(members_).swap(std::get<I>(*scratch_)), ...);
    }
    (std::make_index_sequence<std::tuple_size_v<Scratch>>());
  }

  ScratchPool<Scratch>* const pool_;
  const Members members_;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace kvagent::agent

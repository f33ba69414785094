// Which live pool takes a replica that the writer's own pools do not: of the pools that fit it
// and sit on an agent the key's other replicas do not use, the one with the most free bytes (the
// lower pool id among equals). The scan of every live pool this replaces cost O(pools) per
// replicated key; a tournament tree over the live pools makes a search visit O((k + 1) log pools)
// nodes, for the k better pools it has to pass over (on an agent already used, or too fragmented
// to fit the part), and an allocation or a free in a pool only marks it: the next search first
// recomputes the marked pools' paths, so a workload without such searches pays a flag per change.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvagent::master {

struct Pool;

class PlacementIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // The candidates, in the order ties go by (pool id ascending); sets each pool's `slot` (and
  // resets none: the caller sets the slot of pools it leaves out to kNone). The pools must stay
  // where they are until the next Reset.
  void Reset(std::span<Pool* const> pools);

  // The free bytes of the pool at `slot` (Pool::slot) changed; kNone: not a candidate, nothing.
  void Touched(uint32_t slot) {
    if (slot == kNone || marked_[slot]) return;
    marked_[slot] = 1;
    touched_.push_back(slot);
  }

  // The best candidate for which fits(const Pool&) holds, or nullptr.
  template <class Fits>
  Pool* Best(Fits&& fits) {
    Flush();
    uint32_t best = kNone;
    if (!pools_.empty()) Search(1, fits, &best);
    return best == kNone ? nullptr : pools_[best];
  }

  // Nodes a search looked at since the index was made (for the complexity test).
  uint64_t nodes_visited() const { return visited_; }

 private:
  // Whether the pool at slot a goes before the one at slot b (kNone goes after every pool).
  bool Better(uint32_t a, uint32_t b) const;
  void Recompute(size_t node);
  void Flush();

  template <class Fits>
  void Search(size_t node, Fits& fits, uint32_t* best) {
    ++visited_;
    const uint32_t here = tree_[node];
    if (here == kNone || (*best != kNone && !Better(here, *best))) return;  // nothing better below
    if (node >= leaves_) {
      if (fits(*pools_[here])) *best = here;
      return;
    }
    const size_t first = tree_[2 * node] == here ? 2 * node : 2 * node + 1;
    Search(first, fits, best);
    Search(first ^ 1, fits, best);
  }

  std::vector<Pool*> pools_;
  size_t leaves_ = 0;           // a power of two >= pools_.size(); leaf i is node leaves_ + i
  std::vector<uint32_t> tree_;  // per node, the slot of the best pool below it (kNone: none)
  std::vector<uint8_t> marked_;
  std::vector<uint32_t> touched_;
  uint64_t visited_ = 0;
};

}  // namespace kvagent::master

#include "placement_index.h"

#include "metadata_store.h"

namespace kvagent::master {

void PlacementIndex::Reset(std::span<Pool* const> pools) {
  pools_.assign(pools.begin(), pools.end());
  leaves_ = 1;
  while (leaves_ < pools_.size()) leaves_ *= 2;
  tree_.assign(2 * leaves_, kNone);
  marked_.assign(pools_.size(), 0);
  touched_.clear();
  for (uint32_t i = 0; i < pools_.size(); ++i) {
    pools_[i]->slot = i;
    tree_[leaves_ + i] = i;
  }
  for (size_t node = leaves_ - 1; node >= 1; --node) Recompute(node);
}

bool PlacementIndex::Better(uint32_t a, uint32_t b) const {
  if (a == kNone) return false;
  if (b == kNone) return true;
  const uint64_t fa = pools_[a]->allocator.free_bytes();
  const uint64_t fb = pools_[b]->allocator.free_bytes();
  return fa != fb ? fa > fb : pools_[a]->id < pools_[b]->id;
}

void PlacementIndex::Recompute(size_t node) {
  const uint32_t l = tree_[2 * node], r = tree_[2 * node + 1];
  tree_[node] = Better(r, l) ? r : l;
}

void PlacementIndex::Flush() {
  for (uint32_t slot : touched_) {
    marked_[slot] = 0;
    for (size_t node = (leaves_ + slot) / 2; node >= 1; node /= 2) Recompute(node);
  }
  touched_.clear();
}

}  // namespace kvagent::master

// PoolFence: which data-plane operations may still touch this node's pool.
//
// Every read or write of the pool names the pool it was placed in (the pool incarnation: a new
// one per agent process) and the master that placed it (the master epoch: that master's
// incarnation); a write also names the write it serves (the write id the master gave at
// WriteStart). The fence refuses:
//   - any op for another pool incarnation: the placement was for a pool that no longer exists
//     (this agent restarted), so its offsets mean nothing here;
//   - any op stamped with another master epoch than the one this pool is registered with now: a
//     master that restarted, or a deposed one, must not read or write through its old view;
//   - a write whose id is below the master's write watermark (every such write has ended) or
//     that the master fenced (revoked, timed out, taken over): its space may belong to another
//     value by now.
// The master frees the space of an abandoned write only after this agent acknowledged the fence
// (heartbeat), and the agent acknowledges only after Apply returned and the data plane cut off
// any payload of a fenced write already arriving (TransferEngine::Refence). A batch's local
// copies into the pool hold LocalWrites while they copy, so Apply waits for them.
//
// Thread-safe: the data plane checks from its thread, the pipeline copies from the service
// thread, the master link applies fences from its thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <unordered_set>

#include "kvagent/common/status.h"

namespace kvagent::transfer {

class PoolFence {
 public:
  explicit PoolFence(uint64_t pool_incarnation) : incarnation_(pool_incarnation) {}
  PoolFence(const PoolFence&) = delete;
  PoolFence& operator=(const PoolFence&) = delete;

  uint64_t pool_incarnation() const { return incarnation_; }
  uint64_t epoch() const;

  // The master this pool is registered with now (its incarnation). A new epoch forgets the
  // previous one's fences and refuses its ops from now on (waits for local writes in progress).
  void SetEpoch(uint64_t epoch);

  // The master `epoch` fenced every write below `watermark` and those in `fenced`. Ignored (false)
  // when `epoch` is not the current one. Waits for local writes in progress.
  bool Apply(uint64_t epoch, uint64_t watermark, std::span<const uint64_t> fenced);

  // OK, or TRANSFER_FAILED saying why the op is refused. `incarnation` 0: not checked; `epoch`
  // 0: not checked while the pool has no epoch (a caller that does not know them, e.g. tools
  // and tests of the data plane alone), refused once it has one.
  Status CheckRead(uint64_t incarnation, uint64_t epoch) const;
  Status CheckWrite(uint64_t incarnation, uint64_t epoch, uint64_t write_id) const;

  // Copies into the pool by this agent itself (a put's local replicas), one batch at a time:
  // each copy is first admitted (refused like a peer's write), and from the first admission
  // until the LocalWrites is destroyed, Apply and SetEpoch wait for the copy in progress. One
  // hold per batch, not per copy: taking and releasing the fence are locked instructions, and a
  // locked instruction waits for the streaming stores of the copy before it (per 4 KiB key, ~9 %
  // of a batched put's time). When an Apply or SetEpoch is waiting, the next Admit makes the
  // batch's copies so far visible (FenceStreamingStores), lets it in, and judges its copy by
  // the new fences: a fence waits for one copy, not for a whole batch (128 MiB of 1 MiB values:
  // ~10 ms).
  class LocalWrites {
   public:
    LocalWrites() = default;  // no fence: admits every copy
    LocalWrites(LocalWrites&&) = default;
    LocalWrites& operator=(LocalWrites&&) = default;

    // OK, or TRANSFER_FAILED: a copy for write `write_id` of master `epoch` may not land.
    Status Admit(uint64_t epoch, uint64_t write_id);

   private:
    friend class PoolFence;
    explicit LocalWrites(const PoolFence* fence)
        : fence_(fence), lock_(fence->mu_, std::defer_lock) {}
    const PoolFence* fence_ = nullptr;
    std::shared_lock<std::shared_mutex> lock_;
  };
  LocalWrites BeginLocalWrites() const { return LocalWrites(this); }

  // Writes refused so far (for stats).
  uint64_t refused() const;

 private:
  Status CheckLocked(uint64_t incarnation, uint64_t epoch, uint64_t write_id, bool write) const;

  const uint64_t incarnation_;
  mutable std::shared_mutex mu_;
  uint64_t epoch_ = 0;
  uint64_t watermark_ = 0;
  std::unordered_set<uint64_t> fenced_;  // ids >= watermark_ that may not land
  mutable std::atomic<uint64_t> refused_{0};
  // Apply and SetEpoch calls waiting for mu_: a batch's LocalWrites lets them in (Admit).
  mutable std::atomic<uint32_t> fences_waiting_{0};
  // Takes mu_ exclusively, counted in fences_waiting_ while it waits.
  std::unique_lock<std::shared_mutex> LockForFence();
};

}  // namespace kvagent::transfer

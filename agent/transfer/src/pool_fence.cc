#include "kvagent/transfer/pool_fence.h"

#include <mutex>

#include "kvagent/common/checksum.h"

namespace kvagent::transfer {

uint64_t PoolFence::epoch() const {
  std::shared_lock lock(mu_);
  return epoch_;
}

std::unique_lock<std::shared_mutex> PoolFence::LockForFence() {
  fences_waiting_.fetch_add(1, std::memory_order_acq_rel);
  std::unique_lock lock(mu_);
  fences_waiting_.fetch_sub(1, std::memory_order_acq_rel);
  fences_waiting_.notify_all();
  return lock;
}

void PoolFence::SetEpoch(uint64_t epoch) {
  auto lock = LockForFence();
  if (epoch == epoch_) return;
  epoch_ = epoch;
  watermark_ = 0;
  fenced_.clear();
}

bool PoolFence::Apply(uint64_t epoch, uint64_t watermark, std::span<const uint64_t> fenced) {
  auto lock = LockForFence();
  if (epoch != epoch_) return false;
  if (watermark > watermark_) {
    watermark_ = watermark;
    std::erase_if(fenced_, [&](uint64_t id) { return id < watermark_; });
  }
  for (uint64_t id : fenced) {
    if (id >= watermark_) fenced_.insert(id);
  }
  return true;
}

Status PoolFence::CheckLocked(uint64_t incarnation, uint64_t epoch, uint64_t write_id,
                              bool write) const {
  auto refuse = [&](const std::string& why) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return Status(ErrorCode::kTransferFailed, why);
  };
  if (incarnation != 0 && incarnation != incarnation_) {
    return refuse("the placement names pool incarnation " + std::to_string(incarnation) +
                  " but this agent's pool is incarnation " + std::to_string(incarnation_) +
                  " (the agent restarted: the value is gone)");
  }
  if (epoch == 0 && epoch_ != 0) {
    // "Not checked" is for a pool no master knows (tools, tests of the data plane alone): once
    // one does, an op without an epoch would pass every fence, the write fences too.
    return refuse("the op names no master epoch but this pool is registered with epoch " +
                  std::to_string(epoch_) + ": refused");
  }
  if (epoch != 0 && epoch != epoch_) {
    return refuse("the placement comes from master epoch " + std::to_string(epoch) +
                  " but this pool is registered with epoch " + std::to_string(epoch_) +
                  " (the master restarted or was replaced): ask the master again");
  }
  if (write && epoch != 0 && (write_id < watermark_ || fenced_.count(write_id) != 0)) {
    return refuse("write " + std::to_string(write_id) +
                  " was abandoned (revoked, timed out or taken over) and its space may hold "
                  "another value by now: refused");
  }
  return Status::Ok();
}

Status PoolFence::CheckRead(uint64_t incarnation, uint64_t epoch) const {
  std::shared_lock lock(mu_);
  return CheckLocked(incarnation, epoch, 0, false);
}

Status PoolFence::CheckWrite(uint64_t incarnation, uint64_t epoch, uint64_t write_id) const {
  std::shared_lock lock(mu_);
  return CheckLocked(incarnation, epoch, write_id, true);
}

Status PoolFence::LocalWrites::Admit(uint64_t epoch, uint64_t write_id) {
  if (fence_ == nullptr) return Status::Ok();
  if (lock_.owns_lock() && fence_->fences_waiting_.load(std::memory_order_acquire) != 0) {
    // A fence waits: the copies so far reach memory, then it goes first (the rwlock may let a
    // reader in before a waiting writer, so this one waits until the fence has the lock).
    FenceStreamingStores();
    lock_.unlock();
    for (uint32_t waiting;
         (waiting = fence_->fences_waiting_.load(std::memory_order_acquire)) != 0;) {
      fence_->fences_waiting_.wait(waiting, std::memory_order_acquire);
    }
  }
  if (!lock_.owns_lock()) lock_.lock();
  return fence_->CheckLocked(0, epoch, write_id, true);
}

uint64_t PoolFence::refused() const { return refused_.load(std::memory_order_relaxed); }

}  // namespace kvagent::transfer

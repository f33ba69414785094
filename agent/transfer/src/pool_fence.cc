#include "kvagent/transfer/pool_fence.h"

#include <mutex>

namespace kvagent::transfer {

uint64_t PoolFence::epoch() const {
  std::shared_lock lock(mu_);
  return epoch_;
}

void PoolFence::SetEpoch(uint64_t epoch) {
  std::unique_lock lock(mu_);
  if (epoch == epoch_) return;
  epoch_ = epoch;
  watermark_ = 0;
  fenced_.clear();
}

bool PoolFence::Apply(uint64_t epoch, uint64_t watermark, std::span<const uint64_t> fenced) {
  std::unique_lock lock(mu_);
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
  if (!lock_.owns_lock()) lock_.lock();
  return fence_->CheckLocked(0, epoch, write_id, true);
}

uint64_t PoolFence::refused() const { return refused_.load(std::memory_order_relaxed); }

}  // namespace kvagent::transfer

#include "batch.h"

namespace kvagent::transfer {

Batch::Batch(size_t count, TransferCallback done, EngineCounters* counters)
    : results_(count), remaining_(count), done_(std::move(done)), counters_(counters) {}

void Batch::Complete(size_t index, Status status, uint64_t bytes, TransferKind kind) {
  if (status.ok()) {
    EngineCounters::Add(counters_->ops_ok);
    EngineCounters::Add(
        kind == TransferKind::kWrite ? counters_->bytes_written : counters_->bytes_read, bytes);
  } else {
    EngineCounters::Add(counters_->ops_failed);
    if (status.code() == ErrorCode::kTimeout) EngineCounters::Add(counters_->ops_timed_out);
  }
  results_[index] = std::move(status);
  if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    TransferCallback done = std::move(done_);
    done(std::move(results_));
  }
}

void Batch::CompleteEmpty() {
  TransferCallback done = std::move(done_);
  done({});
}

std::string PendingOp::Describe() const {
  return std::string(kind == TransferKind::kWrite ? "WRITE of " : "READ of ") +
         std::to_string(length) + " bytes " + (kind == TransferKind::kWrite ? "to " : "from ") +
         peer_text + " at offset " + std::to_string(remote_offset);
}

}  // namespace kvagent::transfer

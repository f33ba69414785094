// DataPlane: what the request pipeline needs of the data plane — the agent's TransferEngine
// (transfer_engine.h), or a test double in the pipeline's unit tests. Same contracts as the
// TransferEngine methods of the same names: Submit calls `done` exactly once, on another thread
// than the caller's (never inside Submit), with one Status per op in order.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kvagent/common/status.h"
#include "kvagent/transfer/transfer_engine.h"

namespace kvagent::agent {

class DataPlane {
 public:
  virtual ~DataPlane() = default;
  // True when `endpoint` is this agent's own data server (its bytes are a local memcpy).
  virtual bool IsLocal(std::string_view endpoint) const = 0;
  [[nodiscard]] virtual Status RegisterMemory(void* addr, uint64_t length) = 0;
  [[nodiscard]] virtual Status UnregisterMemory(void* addr) = 0;
  virtual void Submit(std::vector<transfer::TransferOp> ops, transfer::TransferCallback done) = 0;
  // For `kvctl stat`.
  virtual std::string endpoint() const = 0;
  virtual transfer::TransferStats stats() const = 0;
};

// The agent's data plane: forwards to a TransferEngine (which must outlive it).
class EngineDataPlane final : public DataPlane {
 public:
  explicit EngineDataPlane(transfer::TransferEngine* engine) : engine_(engine) {}
  bool IsLocal(std::string_view endpoint) const override { return engine_->IsLocal(endpoint); }
  Status RegisterMemory(void* addr, uint64_t length) override {
    return engine_->RegisterMemory(addr, length);
  }
  Status UnregisterMemory(void* addr) override { return engine_->UnregisterMemory(addr); }
  void Submit(std::vector<transfer::TransferOp> ops, transfer::TransferCallback done) override {
    engine_->Submit(std::move(ops), std::move(done));
  }
  std::string endpoint() const override { return engine_->endpoint(); }
  transfer::TransferStats stats() const override { return engine_->stats(); }

 private:
  transfer::TransferEngine* engine_;
};

}  // namespace kvagent::agent

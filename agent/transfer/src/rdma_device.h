// RdmaDevice: what the RDMA transport holds per device (rdma_cm's ibv_context): a protection
// domain, a completion channel, the node pool's memory region (registered once, remote
// WRITE/READ allowed) and the memory regions of the local ranges given to RegisterMemory.
//
// NOTE: this code has never run against a device. The build machine has no RDMA hardware and
// no rdma kernel modules; it is compiled and reviewed only. See rdma_transport.cc.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kvagent/common/status.h"

namespace kvagent::transfer {

class RdmaDevice {
 public:
  // Allocates the PD and a non-blocking completion channel on `verbs` (owned by rdma_cm's
  // device list, which must outlive this object). INTERNAL with errno on failure.
  [[nodiscard]] static Result<std::unique_ptr<RdmaDevice>> Open(ibv_context* verbs);

  // Deregisters every MR, then frees the channel and the PD. Every QP and CQ created on this
  // device must be gone first.
  ~RdmaDevice();
  RdmaDevice(const RdmaDevice&) = delete;
  RdmaDevice& operator=(const RdmaDevice&) = delete;

  // Registers the node pool with LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ, after checking
  // max_mr_size. Logs how long the registration took. INTERNAL with the memlock hint on failure.
  [[nodiscard]] Status RegisterPool(uint8_t* base, uint64_t size);
  // Registers a local range (client arena) with LOCAL_WRITE only: it is the source of WRITEs
  // and the destination of READs, never touched by peers.
  [[nodiscard]] Status RegisterLocal(void* addr, uint64_t length);
  void DeregisterLocal(void* addr);
  // The lkey covering [addr, addr + length) (pool or local range), or nullopt-like false.
  bool FindLkey(const void* addr, uint64_t length, uint32_t* lkey) const;

  ibv_context* verbs() const { return verbs_; }
  ibv_pd* pd() const { return pd_; }
  ibv_comp_channel* channel() const { return channel_; }
  const ibv_device_attr& attr() const { return attr_; }
  const std::string& name() const { return name_; }
  uint32_t pool_rkey() const { return pool_mr_->rkey; }

 private:
  RdmaDevice(ibv_context* verbs, std::string name);

  ibv_context* verbs_;
  std::string name_;
  ibv_device_attr attr_{};
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_mr* pool_mr_ = nullptr;
  mutable std::mutex mutex_;                // guards local_mrs_ (RegisterMemory runs on callers)
  std::map<uintptr_t, ibv_mr*> local_mrs_;  // by start address
};

}  // namespace kvagent::transfer

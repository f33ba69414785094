// NOTE: compiled and reviewed, never run: the build machine has no RDMA device.
#include "rdma_device.h"

#include <fcntl.h>
#include <glog/logging.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "kvagent/common/errno_text.h"
#include "kvagent/transfer/node_pool.h"
#include "kvagent/transfer/rdma_probe.h"

namespace kvagent::transfer {
namespace {

std::string RegistrationFailure(const std::string& what, const std::string& device, int err) {
  std::string message = "ibv_reg_mr of " + what + " on " + device + " failed: " + ErrnoText(err);
  if (err == ENOMEM || err == EPERM) {
    message += "; RLIMIT_MEMLOCK is " + FormatBytes(CurrentMemlockLimit()) +
               ": set LimitMEMLOCK=infinity in kvagent.service (or `ulimit -l unlimited`), or "
               "use --data-transport=tcp";
  }
  return message;
}

}  // namespace

Result<std::unique_ptr<RdmaDevice>> RdmaDevice::Open(ibv_context* verbs) {
  const char* name = ibv_get_device_name(verbs->device);
  std::unique_ptr<RdmaDevice> device(new RdmaDevice(verbs, name != nullptr ? name : "rdma"));
  if (ibv_query_device(verbs, &device->attr_) != 0) {
    return Internal("ibv_query_device(" + device->name_ + ") failed: " + ErrnoText(errno));
  }
  device->pd_ = ibv_alloc_pd(verbs);
  if (device->pd_ == nullptr) {
    return Internal("ibv_alloc_pd(" + device->name_ + ") failed: " + ErrnoText(errno));
  }
  device->channel_ = ibv_create_comp_channel(verbs);
  if (device->channel_ == nullptr) {
    return Internal("ibv_create_comp_channel(" + device->name_ + ") failed: " + ErrnoText(errno));
  }
  // The transport's epoll loop reads completion events until EAGAIN.
  const int flags = fcntl(device->channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(device->channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return Internal("cannot make the completion channel of " + device->name_ +
                    " non-blocking: " + ErrnoText(errno));
  }
  return device;
}

RdmaDevice::RdmaDevice(ibv_context* verbs, std::string name)
    : verbs_(verbs), name_(std::move(name)) {}

RdmaDevice::~RdmaDevice() {
  for (auto& [start, mr] : local_mrs_) ibv_dereg_mr(mr);
  if (pool_mr_ != nullptr) ibv_dereg_mr(pool_mr_);
  if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
}

Status RdmaDevice::RegisterPool(uint8_t* base, uint64_t size) {
  KVAGENT_RETURN_IF_ERROR(CheckRegistrationSize(size, attr_.max_mr_size, name_));
  const auto start = std::chrono::steady_clock::now();
  pool_mr_ = ibv_reg_mr(pd_, base, size,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (pool_mr_ == nullptr) {
    return Internal(RegistrationFailure("the " + FormatBytes(size) + " node pool", name_, errno));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  LOG(INFO) << "RDMA: registered the " << FormatBytes(size) << " node pool with " << name_ << " in "
            << seconds << " s (rkey 0x" << std::hex << pool_mr_->rkey << ")";
  return Status::Ok();
}

Status RdmaDevice::RegisterLocal(void* addr, uint64_t length) {
  KVAGENT_RETURN_IF_ERROR(CheckRegistrationSize(length, attr_.max_mr_size, name_));
  ibv_mr* mr = ibv_reg_mr(pd_, addr, length, IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) {
    return Internal(RegistrationFailure(FormatBytes(length) + " of local memory", name_, errno));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  local_mrs_.emplace(reinterpret_cast<uintptr_t>(addr), mr);
  return Status::Ok();
}

void RdmaDevice::DeregisterLocal(void* addr) {
  ibv_mr* mr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = local_mrs_.find(reinterpret_cast<uintptr_t>(addr));
    if (it == local_mrs_.end()) return;
    mr = it->second;
    local_mrs_.erase(it);
  }
  ibv_dereg_mr(mr);
}

bool RdmaDevice::FindLkey(const void* addr, uint64_t length, uint32_t* lkey) const {
  const auto start = reinterpret_cast<uintptr_t>(addr);
  const auto inside = [&](const ibv_mr* mr) {
    const auto base = reinterpret_cast<uintptr_t>(mr->addr);
    return start >= base && length <= mr->length && start - base <= mr->length - length;
  };
  if (pool_mr_ != nullptr && inside(pool_mr_)) {
    *lkey = pool_mr_->lkey;
    return true;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = local_mrs_.upper_bound(start);
  if (it == local_mrs_.begin()) return false;
  --it;
  if (!inside(it->second)) return false;
  *lkey = it->second->lkey;
  return true;
}

}  // namespace kvagent::transfer

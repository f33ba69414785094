#include "kvagent/transfer/rdma_probe.h"
#include "kvagent/common/errno_text.h"

#include <infiniband/verbs.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include "kvagent/transfer/node_pool.h"

namespace kvagent::transfer {
namespace {

constexpr int kCapIpcLockBit = 14;  // linux/capability.h CAP_IPC_LOCK

uint64_t EffectiveMaxMessage(uint64_t max_message) {
  if (max_message == 0) return kMaxWorkRequestBytes;
  return std::min(max_message, kMaxWorkRequestBytes);
}

}  // namespace

RdmaProbe ProbeRdmaDevices() {
  RdmaProbe probe;
  int count = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) {
    probe.list_errno = errno;
    return probe;
  }
  for (int i = 0; i < count; ++i) {
    const char* name = ibv_get_device_name(list[i]);
    probe.devices.emplace_back(name != nullptr ? name : "unnamed");
  }
  ibv_free_device_list(list);
  return probe;
}

std::string NoRdmaDeviceLine(const RdmaProbe& probe) {
  std::string why = probe.list_errno == 0
                        ? "ibv_get_device_list returned 0"
                        : "ibv_get_device_list failed: " + ErrnoText(probe.list_errno);
  return "RDMA: no device found (" + why + "); using TCP for the data plane";
}

Status CheckMemlockForRegistration(uint64_t bytes, uint64_t memlock_limit, bool cap_ipc_lock) {
  if (cap_ipc_lock || memlock_limit == std::numeric_limits<uint64_t>::max() ||
      bytes <= memlock_limit) {
    return Status::Ok();
  }
  return Internal("RDMA registration pins " + FormatBytes(bytes) + " but RLIMIT_MEMLOCK is " +
                  FormatBytes(memlock_limit) +
                  "; set LimitMEMLOCK=infinity in kvagent.service (or `ulimit -l unlimited` "
                  "before starting kvagent), or use --data-transport=tcp");
}

Status CheckRegistrationSize(uint64_t bytes, uint64_t max_mr_size, const std::string& device) {
  if (bytes <= max_mr_size) return Status::Ok();
  return Internal("RDMA device " + device + " registers at most " + FormatBytes(max_mr_size) +
                  " per memory region but the range is " + FormatBytes(bytes) +
                  "; lower --pool-size");
}

uint64_t CurrentMemlockLimit() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return std::numeric_limits<uint64_t>::max();
  }
  return limit.rlim_cur;
}

bool HasCapIpcLock() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    const uint64_t caps = std::stoull(line.substr(7), nullptr, 16);
    return (caps >> kCapIpcLockBit) & 1;
  }
  return false;
}

uint64_t WorkRequestCount(uint64_t length, uint64_t max_message) {
  const uint64_t chunk = EffectiveMaxMessage(max_message);
  return length / chunk + (length % chunk != 0 ? 1 : 0);
}

uint64_t WorkRequestLength(uint64_t length, uint64_t max_message, uint64_t index) {
  const uint64_t chunk = EffectiveMaxMessage(max_message);
  const uint64_t start = index * chunk;
  if (start >= length) return 0;
  return std::min(chunk, length - start);
}

}  // namespace kvagent::transfer

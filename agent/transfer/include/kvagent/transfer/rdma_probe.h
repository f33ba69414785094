// RDMA device discovery and the registration rules the RDMA transport applies before it touches
// a NIC. Pure functions (everything except ProbeRdmaDevices) so they are tested on machines
// without RDMA hardware.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvagent/common/status.h"

namespace kvagent::transfer {

struct RdmaProbe {
  std::vector<std::string> devices;  // ibv_get_device_name of every device, in list order
  int list_errno = 0;  // errno when ibv_get_device_list returned NULL (e.g. ENOSYS: no verbs)
  bool found() const { return !devices.empty(); }
};

// Asks libibverbs for the device list (ibv_get_device_list) and frees it again. Never opens a
// device. Safe on machines without RDMA support: returns an empty probe.
RdmaProbe ProbeRdmaDevices();

// The one log line the engine prints when it falls back to TCP for lack of a device, e.g.
// "RDMA: no device found (ibv_get_device_list returned 0); using TCP for the data plane".
std::string NoRdmaDeviceLine(const RdmaProbe& probe);

// Whether pinning `bytes` (the pool once per device, plus arenas) fits the memlock limit.
// `memlock_limit` is RLIMIT_MEMLOCK's soft limit in bytes (UINT64_MAX for unlimited);
// `cap_ipc_lock` exempts the process from the limit. INTERNAL with the fix (LimitMEMLOCK=infinity
// in kvagent.service, `ulimit -l unlimited`, or --data-transport=tcp) when it does not fit.
[[nodiscard]] Status CheckMemlockForRegistration(uint64_t bytes, uint64_t memlock_limit,
                                                 bool cap_ipc_lock);

// Whether one memory region of `bytes` is within the device's max_mr_size (ibv_device_attr).
// INTERNAL naming both sizes and suggesting a smaller --pool-size when it is not.
[[nodiscard]] Status CheckRegistrationSize(uint64_t bytes, uint64_t max_mr_size,
                                           const std::string& device);

// The current RLIMIT_MEMLOCK soft limit (UINT64_MAX when unlimited) and whether the process has
// CAP_IPC_LOCK in its effective set: the inputs of CheckMemlockForRegistration.
uint64_t CurrentMemlockLimit();
bool HasCapIpcLock();

// Splits an op of `length` bytes into work requests of at most `max_message` bytes (the port's
// max_msg_sz, capped at 1 GiB): returns the number of work requests; the last one carries the
// remainder. `max_message` 0 is treated as 1 GiB.
uint64_t WorkRequestCount(uint64_t length, uint64_t max_message);
uint64_t WorkRequestLength(uint64_t length, uint64_t max_message, uint64_t index);

inline constexpr uint64_t kMaxWorkRequestBytes = uint64_t{1} << 30;

}  // namespace kvagent::transfer

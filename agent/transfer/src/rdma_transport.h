// RdmaTransport: the data plane over RDMA (rdma-core verbs + librdmacm), used when the node has
// an RDMA device. Server side: the node pool is registered once per device and peers write and
// read it with one-sided RDMA WRITE/READ; the CPU only accepts connections. Client side: one RC
// QP per peer, set up with rdma_cm; the peer's pool address, size and rkey arrive in the accept's
// private data, so every op is bounds-checked here before a work request is posted (the NIC
// would otherwise fail the QP on a remote access error).
//
// NOTE: this transport has never run. The build machine has no RDMA device and no rdma kernel
// modules (no rdma_rxe/siw either), so it is compiled and reviewed only; the tests cover device
// discovery, the fallback to TCP and the pure registration rules. Run it first on a node with
// a device (or Soft-RoCE: `rdma link add rxe0 type rxe netdev <if>`) before relying on it.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "batch.h"
#include "kvagent/transfer/endpoint.h"
#include "kvagent/transfer/node_pool.h"
#include "kvagent/transfer/pool_fence.h"

namespace kvagent::transfer {

class RdmaTransport {
 public:
  // Opens every rdma_cm device, registers `pool` with each, listens on `listen` and starts the
  // transport thread. INTERNAL naming the step and errno (with the memlock hint where it
  // applies) on failure. `pool` must outlive the transport.
  // `fence` (may be null): its pool incarnation is announced to peers when they connect.
  [[nodiscard]] static Result<std::unique_ptr<RdmaTransport>> Start(
      NodePool* pool, const PoolFence* fence, const ListenAddress& listen,
      std::chrono::milliseconds peer_timeout, EngineCounters* counters);

  // Fails outstanding ops ("engine shutting down"), destroys every QP, CQ, MR and PD.
  ~RdmaTransport();
  RdmaTransport(const RdmaTransport&) = delete;
  RdmaTransport& operator=(const RdmaTransport&) = delete;

  uint16_t port() const;  // the rdma_cm listen port (RDMA_PS_TCP port space)

  // Thread-safe: hands `ops` (all with rdma:// peers) to the transport thread.
  void Submit(std::vector<PendingOp> ops);

  // Registers / deregisters a local range on every device (see TransferEngine::RegisterMemory).
  [[nodiscard]] Status RegisterMemory(void* addr, uint64_t length);
  void UnregisterMemory(void* addr);

  class State;

 private:
  explicit RdmaTransport(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kvagent::transfer

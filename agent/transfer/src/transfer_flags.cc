#include "kvagent/transfer/transfer_flags.h"

#include <chrono>

#include "kvagent/transfer/endpoint.h"

namespace kvagent::transfer {

void TransferFlags::Declare(FlagSet* flags) {
  flags->Size("pool-size", &pool_size,
              "bytes of this node's memory pool (mounted at the master); allocated "
              "and pre-faulted at start");
  flags->Bool("pool-huge-pages", &pool_huge_pages,
              "back the pool with 2 MiB pages: hugetlb when reserved (vm.nr_hugepages), else "
              "transparent huge pages");
  flags->Bool("pool-mlock", &pool_mlock,
              "lock the pool in memory; needs LimitMEMLOCK=infinity (or CAP_IPC_LOCK)");
  flags->String("data-listen", &data_listen,
                "host:port of the data server peers write to and read from (port 0: any) "
                "(default: 0.0.0.0:0 with --master; 127.0.0.1:0 standalone, which has no peers)");
  flags->String("data-advertise-host", &data_advertise_host,
                "address peers use to reach the data server (default: the listen host, or the "
                "first non-loopback IPv4 address); with RDMA, the RDMA interface's address");
  flags->String("data-transport", &data_transport,
                "auto (RDMA when a device exists, else TCP), tcp, or rdma");
  flags->Int("data-peer-timeout-ms", &data_peer_timeout_ms,
             "a data-plane op fails when its peer moves no bytes for this long; its key tries "
             "the next replica, else fails with TRANSFER_FAILED (\"TIMEOUT: ...\")");
}

Result<NodePoolOptions> TransferFlags::PoolOptions() const {
  if (pool_size == 0) return InvalidParams("--pool-size must be at least one page, e.g. 1GiB");
  return NodePoolOptions{
      .size_bytes = pool_size, .huge_pages = pool_huge_pages, .mlock = pool_mlock};
}

Result<TransferEngineOptions> TransferFlags::EngineOptions() const {
  Result<TransportMode> mode = ParseTransportMode(data_transport);
  if (!mode.ok()) return mode.status();
  Result<ListenAddress> listen = ParseListenAddress(data_listen);
  if (!listen.ok()) return InvalidParams("--data-listen: " + listen.status().message());
  if (data_peer_timeout_ms <= 0) {
    return InvalidParams("--data-peer-timeout-ms must be positive (got " +
                         std::to_string(data_peer_timeout_ms) + ")");
  }
  TransferEngineOptions options;
  options.listen_address = data_listen;
  options.advertise_host = data_advertise_host;
  options.transport = *mode;
  options.peer_timeout = std::chrono::milliseconds(data_peer_timeout_ms);
  return options;
}

}  // namespace kvagent::transfer

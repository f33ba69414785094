// The node pool's and the data plane's command-line flags / config keys, declared in one place
// so that kvagent (and test tools) expose the same names, defaults and help text.
//
//   TransferFlags transfer;
//   transfer.Declare(&flags);                       // before flags.Parse(...)
//   auto pool_options = transfer.PoolOptions();     // after Parse; INVALID_PARAMS on bad values
//   auto engine_options = transfer.EngineOptions();
#pragma once

#include <cstdint>
#include <string>

#include "kvagent/common/flags.h"
#include "kvagent/common/status.h"
#include "kvagent/transfer/node_pool.h"
#include "kvagent/transfer/transfer_engine.h"

namespace kvagent::transfer {

struct TransferFlags {
  uint64_t pool_size = kDefaultPoolBytes;  // --pool-size
  bool pool_huge_pages = true;             // --pool-huge-pages
  bool pool_mlock = false;                 // --pool-mlock
  std::string data_listen = "0.0.0.0:0";   // --data-listen
  std::string data_advertise_host;         // --data-advertise-host
  std::string data_transport = "auto";     // --data-transport
  int64_t data_peer_timeout_ms = 5000;     // --data-peer-timeout-ms

  // Declares every flag above on `flags`, with its current value as the default. `this` must
  // outlive flags->Parse().
  void Declare(FlagSet* flags);

  // The options the flags describe. INVALID_PARAMS naming the flag for a zero pool size, an
  // unknown transport, a malformed listen address or a non-positive timeout.
  [[nodiscard]] Result<NodePoolOptions> PoolOptions() const;
  [[nodiscard]] Result<TransferEngineOptions> EngineOptions() const;
};

}  // namespace kvagent::transfer

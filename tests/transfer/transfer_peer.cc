// transfer_peer: a node pool + transfer engine in its own process, for tests that put peers in
// separate network namespaces.
//
//   transfer_peer serve --data-listen 0.0.0.0:0 [--pool-size 64MiB]
//       prints "ENDPOINT <endpoint>" and serves until its stdin reaches end of file
//   transfer_peer check --peer tcp://10.213.7.2:41234 [--data-listen 0.0.0.0:0]
//       writes values of 1 B, 4 KiB, 1 MiB and 16 MiB to the peer, reads each back, compares
//       byte for byte; prints "OK <size>" per value; exit status 0 when all match
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvagent/common/flags.h"
#include "kvagent/transfer/node_pool.h"
#include "kvagent/transfer/transfer_engine.h"
#include "kvagent/transfer/transfer_flags.h"

namespace {

using kvagent::transfer::NodePool;
using kvagent::transfer::TransferEngine;
using kvagent::transfer::TransferKind;

int Fail(const std::string& what) {
  std::fprintf(stderr, "transfer_peer: %s\n", what.c_str());
  return 1;
}

int Check(TransferEngine& engine, NodePool& pool, const std::string& peer) {
  const uint64_t sizes[] = {1, 4096, uint64_t{1} << 20, uint64_t{16} << 20};
  uint64_t remote = 0;
  for (uint64_t size : sizes) {
    uint8_t* out = pool.base();
    uint8_t* back = pool.base() + (uint64_t{32} << 20);
    std::mt19937 gen(static_cast<uint32_t>(size));
    for (uint64_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(gen());
    std::memset(back, 0, size);
    auto wrote = engine.TransferAndWait({{TransferKind::kWrite, peer, remote, out, size}});
    if (!wrote[0].ok()) return Fail("write: " + wrote[0].ToString());
    auto read = engine.TransferAndWait({{TransferKind::kRead, peer, remote, back, size}});
    if (!read[0].ok()) return Fail("read: " + read[0].ToString());
    if (std::memcmp(out, back, size) != 0)
      return Fail("bytes differ for size " + std::to_string(size));
    std::printf("OK %llu\n", static_cast<unsigned long long>(size));
    remote += size;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string peer;
  kvagent::transfer::TransferFlags transfer;
  transfer.pool_size = uint64_t{64} << 20;
  transfer.pool_huge_pages = false;
  transfer.data_transport = "tcp";
  kvagent::FlagSet flags("transfer_peer", "serve | check: a data-plane peer for tests");
  transfer.Declare(&flags);
  flags.String("peer", &peer, "check: the endpoint to write to and read from");
  std::vector<std::string> mode;
  kvagent::Status parsed = flags.Parse(argc, argv, &mode);
  if (!parsed.ok() || mode.size() != 1 || (mode[0] != "serve" && mode[0] != "check")) {
    return Fail(parsed.ok() ? "usage: transfer_peer serve|check [flags]" : parsed.ToString());
  }
  auto pool_options = transfer.PoolOptions();
  auto engine_options = transfer.EngineOptions();
  if (!pool_options.ok()) return Fail(pool_options.status().ToString());
  if (!engine_options.ok()) return Fail(engine_options.status().ToString());
  auto pool = NodePool::Create(*pool_options);
  if (!pool.ok()) return Fail(pool.status().ToString());
  auto engine = TransferEngine::Create(**pool, *engine_options);
  if (!engine.ok()) return Fail(engine.status().ToString());

  if (mode[0] == "check") return Check(**engine, **pool, peer);
  std::printf("ENDPOINT %s\n", (*engine)->endpoint().c_str());
  std::fflush(stdout);
  char sink[64];
  while (read(STDIN_FILENO, sink, sizeof(sink)) > 0) {
  }
  return 0;
}

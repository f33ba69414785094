// kvmaster's request decoding and handling (master/src/master_rpc.cc + request_check.cc) on an
// in-process MasterService with two agents and pools: any bytes an RPC peer can send. Must
// never crash, hit UB, or build a reply out of proportion to the request.
#include <glog/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvagent/master/master_rpc.h"
#include "kvagent/master/master_service.h"

namespace {

using namespace kvagent::master;

struct World {
  ManualClock clock;
  std::unique_ptr<MasterService> service;
  std::unique_ptr<MasterRpc> rpc;
  uint64_t runs = 0;

  void Reset() {
    MasterOptions options;
    options.replication_log_bytes = 1 << 20;
    service = std::move(MasterService::Open(options, &clock).value());
    const std::vector<std::string_view> eps = {"tcp://127.0.0.1:1"};
    for (uint64_t i = 0; i < 2; ++i) {
      auto id = service->RegisterAgent(i == 0 ? "node-a" : "node-b", i + 1);
      if (id.ok()) (void)service->MountPool(*id, 0, 8 << 20, eps);
    }
    rpc = std::make_unique<MasterRpc>(service.get());
  }
};

World& TheWorld() {
  static World* world = [] {
    auto* w = new World();
    w->Reset();
    return w;
  }();
  return *world;
}

}  // namespace

// The code under test logs refusals; millions of runs must not print them.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = TheWorld();
  // A fresh master now and then: state (objects, leases) must not grow across inputs.
  if (++w.runs % 4096 == 0) w.Reset();
  std::span<const uint8_t> reply = w.rpc->Handle({data, size});
  // Every reply is a valid Reply, and bounded by the request (plus per-request overhead and
  // the placements of at most the master's stored objects).
  if (reply.empty()) std::abort();
  if (reply.size() > 64 * size + (1 << 20)) std::abort();
  w.clock.Advance(1);
  if (w.runs % 64 == 0) w.service->Tick();
  return 0;
}

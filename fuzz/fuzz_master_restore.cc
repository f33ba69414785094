// kvmaster's restore: the operation-log records it replays at start. They come from its state
// dir, and on a standby from the primary (Replicate replies, written to the standby's log and
// replayed when it is promoted): bytes a damaged disk, a buggy peer or an impersonated primary
// can shape. The frame's CRC only says the bytes are the ones written, not that they make sense.
// The input is a sequence of records, each a 2-byte little-endian length and that many bytes;
// the harness frames them as the log does, opens a master on the log, and reads back what it
// restored (the restored objects' placements, a tick, the compacted log opened again). Must
// never crash, hit UB, or take memory out of proportion to the records.
#include <glog/logging.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/events/kv_event.h"
#include "kvagent/master/master_service.h"
#include "kvagent/master/oplog.h"

namespace {

std::string g_dir;

void RemoveLog() {
  (void)::unlink((g_dir + "/master.oplog").c_str());
  (void)::unlink((g_dir + "/master.oplog.tmp").c_str());
}

// Opens a master on the log and reads back everything it restored.
void OpenAndRead(bool truncate_damaged) {
  using namespace kvagent::master;  // NOLINT
  MasterOptions options;
  options.state_dir = g_dir;
  options.truncate_damaged_log = truncate_damaged;
  ManualClock clock;
  auto svc = MasterService::Open(options, &clock);
  if (!svc.ok()) return;
  std::vector<std::string> keys;
  for (const auto& event : (*svc)->TakeEvents()) {
    if (const auto* stored = std::get_if<kvagent::events::BlockStored>(&event)) {
      if (stored->object_key) keys.push_back(*stored->object_key);
    }
  }
  std::vector<std::string_view> views(keys.begin(), keys.end());
  PlacementBatch placed;
  (void)(*svc)->BatchGet(views, &placed);
  (void)(*svc)->Stats();
  clock.Advance(1000);
  (*svc)->Tick();
  (void)(*svc)->TakeEvents();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;  // refusals are logged: millions of runs must not print them
  char pattern[] = "/dev/shm/fuzz_master_restore.XXXXXX";
  const char* dir = ::mkdtemp(pattern);
  if (dir == nullptr) abort();
  g_dir = dir;
  std::atexit([] {
    RemoveLog();
    (void)::rmdir(g_dir.c_str());
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool truncate_damaged = (data[0] & 1) != 0;
  RemoveLog();
  {
    auto log = kvagent::master::OpLog::Open(g_dir);
    if (!log.ok()) abort();
    size_t at = 1;
    while (at + 2 <= size) {
      size_t n = data[at] | (size_t{data[at + 1]} << 8);
      at += 2;
      if (n > size - at) n = size - at;
      (*log)->Append(std::string_view(reinterpret_cast<const char*>(data + at), n));
      at += n;
    }
    if (!(*log)->Flush().ok()) abort();
  }
  OpenAndRead(truncate_damaged);
  OpenAndRead(truncate_damaged);  // the log as the first start compacted it
  return 0;
}

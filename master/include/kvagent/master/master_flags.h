// The master's tuning flags (leases, put timeouts, soft pins, part size, watermarks), declared
// once for kvmaster and for a standalone kvagent, whose embedded master takes the same options
// (MasterOptions): a flag added here reaches both binaries, with the same name and config key.
#pragma once

#include "kvagent/common/flags.h"
#include "kvagent/master/types.h"

namespace kvagent::master {

// Declares --lease-ttl-ms, --put-timeout-ms, --put-release-timeout-ms, --soft-pin-ttl-ms,
// --max-part-bytes, --high-watermark and --low-watermark on `flags`, writing into `options`
// (whose current values are the defaults shown). `embedded`: for kvagent, whose help lines say
// "standalone: " (the options apply to its embedded master only). `options` must outlive
// flags->Parse().
void DeclareMasterFlags(FlagSet* flags, MasterOptions* options, bool embedded);

}  // namespace kvagent::master

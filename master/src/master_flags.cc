#include "kvagent/master/master_flags.h"

#include <string>

namespace kvagent::master {

void DeclareMasterFlags(FlagSet* flags, MasterOptions* o, bool embedded) {
  const std::string scope = embedded ? "standalone: " : "";
  flags->Int(
      "lease-ttl-ms", &o->lease_ttl_ms,
      embedded ? "standalone: read lease granted by a get" : "read lease granted by BatchGet");
  flags->Int("put-timeout-ms", &o->put_timeout_ms,
             scope + "an unfinished put older than this may be taken over");
  flags->Int("put-release-timeout-ms", &o->put_release_timeout_ms,
             scope + "replicas of a taken-over put are freed this long after it started");
  flags->Int("soft-pin-ttl-ms", &o->soft_pin_ttl_ms, scope + "default soft pin lifetime");
  flags->Size("max-part-bytes", &o->max_part_bytes,
              scope + "values larger than this are stored as several parts");
  flags->Double("high-watermark", &o->high_watermark,
                scope + "pool use that starts eviction (0..1)");
  flags->Double("low-watermark", &o->low_watermark,
                scope + "pool use eviction brings it down to (0..1)");
}

}  // namespace kvagent::master

// EtcdWatch: one etcd watch stream (the JSON gateway's /v3/watch), read by its owner thread.
//
// Open() starts watching a key (or every key under a prefix) from a revision and returns once
// etcd confirmed the watch; Next() hands out the changes as they arrive. A stream that broke (etcd
// restarted, the connection dropped, the revision was compacted away) makes Next() return an
// error: read the key again and open a new watch from the revision that read returned + 1.
//
// Not thread-safe: the thread that opens it reads and destroys it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvagent/common/status.h"
#include "kvagent/coord/etcd_client.h"

namespace kvagent::coord {

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;  // for kDelete: key and mod_revision (the deletion's revision) only
};

class EtcdWatch {
 public:
  // Watches `key` (with `prefix`: every key starting with it) for changes at `start_revision`
  // and later. Fails with MASTER_UNAVAILABLE when no endpoint confirms within the client
  // timeout.
  static Result<std::unique_ptr<EtcdWatch>> Open(const EtcdClientOptions& options, std::string key,
                                                 int64_t start_revision, bool prefix = false);
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // Waits up to `timeout` for changes; OK with the changes that arrived (possibly none).
  // MASTER_UNAVAILABLE when the stream ended or broke, INTERNAL when etcd sent something the
  // API does not promise or canceled the watch: reopen.
  Result<std::vector<EtcdEvent>> Next(std::chrono::milliseconds timeout);

  class Stream;  // private to the library

 private:
  explicit EtcdWatch(std::unique_ptr<Stream> stream);
  std::unique_ptr<Stream> stream_;
};

}  // namespace kvagent::coord

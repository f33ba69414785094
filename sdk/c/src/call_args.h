// Turning a call made through the C ABI into a kvagent::Client call, and back.
#pragma once

#include <cstddef>
#include <cstdint>

#include "handles.h"
#include "kvagent/client.h"
#include "kvagent/client_c.h"

namespace kvagent::c_abi {

enum class Op { kPing, kPut, kUpsert, kGet, kExist, kRemove, kRemoveAll, kList, kStat };

// One call as a C caller gave it. Every pointer is borrowed until Submit returns; Submit copies
// what the call needs (keys, session IDs, raw values, block metadata) and takes a reference on
// every buffer named.
struct Request {
  Op op = Op::kPing;
  size_t count = 0;
  const kv_bytes_t* keys = nullptr;
  const kv_value_t* values = nullptr;       // Put/Upsert: count entries
  const kv_bytes_t* session_ids = nullptr;  // Put/Upsert: count entries or NULL
  const kv_block_t* blocks = nullptr;       // Put/Upsert: count entries or NULL
  kv_buffer_t* const* buffers = nullptr;    // Get: count entries
  // kv_*_from / kv_get_into: the values are ranges of the caller's memory instead.
  bool memory = false;
  const kv_memory_range_t* ranges = nullptr;
  const size_t* range_counts = nullptr;  // count entries, or NULL: one range per key
  const kv_write_options_t* write = nullptr;
  const kv_call_options_t* call = nullptr;
  const kv_list_options_t* list = nullptr;  // List
  uint32_t timeout_ms = 0;                  // Ping and Stat
  // An asynchronous call (kv_submit_*): raw values (kv_value_t without a buffer) are copied into
  // arena buffers the call holds, so the caller may reuse or free its bytes once Submit returns.
  // A synchronous call reads them in place (straight from the caller's memory with process
  // memory): the caller's bytes outlive it.
  bool copy_raw_values = false;
};

// Submits `request` on `client`; the call (or, when the C arguments are malformed, the refusal
// as a reply) lands in `pending`, which must be fresh.
void Submit(Client& client, const Request& request, kv_pending& pending);

// Waits for the call in `pending` and returns its reply, then releases the buffers it held.
// A second collection answers INVALID_PARAMS.
Reply Collect(kv_pending& pending);

// True when Collect would not block.
bool IsReady(kv_pending& pending);

// A reply in which the request and each of its `key_count` keys failed with `status`.
Reply FailedReply(const Status& status, size_t key_count);

// The number of per-key entries a refused `request` gets: its count, or none when the count is
// above kMaxBatchKeys (a C caller may pass any number there).
size_t RefusedKeyCount(const Request& request);

}  // namespace kvagent::c_abi

// The exported C functions: each checks its handle arguments, runs inside Guarded (no exception
// leaves) and reports through the thread-local last error and, for calls, a kv_result_t.
#include "kvagent/client_c.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "boundary.h"
#include "call_args.h"
#include "handles.h"
#include "kvagent/common/validate.h"
#include "result.h"

#ifndef KVCLIENT_VERSION
#error "KVCLIENT_VERSION must be defined by the build"
#endif

namespace kvagent::c_abi {
namespace {

#define KV_SAME_CODE(c, e) static_assert(static_cast<int>(c) == static_cast<int>(ErrorCode::e))
KV_SAME_CODE(KV_OK, kOk);
KV_SAME_CODE(KV_INVALID_PARAMS, kInvalidParams);
KV_SAME_CODE(KV_OBJECT_NOT_FOUND, kObjectNotFound);
KV_SAME_CODE(KV_OBJECT_ALREADY_EXISTS, kObjectAlreadyExists);
KV_SAME_CODE(KV_REPLICA_NOT_READY, kReplicaNotReady);
KV_SAME_CODE(KV_OBJECT_BUSY, kObjectBusy);
KV_SAME_CODE(KV_OBJECT_HAS_LEASE, kObjectHasLease);
KV_SAME_CODE(KV_NO_SPACE, kNoSpace);
KV_SAME_CODE(KV_BUFFER_OUT_OF_RANGE, kBufferOutOfRange);
KV_SAME_CODE(KV_TRANSFER_FAILED, kTransferFailed);
KV_SAME_CODE(KV_TIMEOUT, kTimeout);
KV_SAME_CODE(KV_AGENT_UNAVAILABLE, kAgentUnavailable);
KV_SAME_CODE(KV_MASTER_UNAVAILABLE, kMasterUnavailable);
KV_SAME_CODE(KV_INTERNAL, kInternal);
KV_SAME_CODE(KV_DATA_CORRUPTED, kDataCorrupted);
static_assert(kMaxErrorCode == KV_DATA_CORRUPTED, "a new ErrorCode needs its KV_ constant");
static_assert(KV_MAX_BATCH_KEYS == kMaxBatchKeys);
#undef KV_SAME_CODE

kv_status_t Finish(Reply reply, kv_result_t** result) {
  const kv_status_t code = SetLastError(reply.status);
  if (result != nullptr) *result = MakeResult(std::move(reply));
  return code;
}

Status NoClient() { return InvalidParams("client is NULL; connect with kv_connect first"); }

// A synchronous call: submitted and collected on this thread.
kv_status_t Call(kv_client_t* client, const Request& request, kv_result_t** result) {
  if (result != nullptr) *result = nullptr;
  return Guarded([&] {
    if (client == nullptr) {
      return Finish(FailedReply(NoClient(), RefusedKeyCount(request)), result);
    }
    kv_pending pending;
    pending.parking = client->parking;
    Submit(*client->client, request, pending);
    return Finish(Collect(pending), result);
  });
}

kv_status_t SubmitCall(kv_client_t* client, const Request& request, kv_pending_t** pending) {
  if (pending == nullptr) {
    return SetLastError(KV_INVALID_PARAMS, "pending is NULL; pass where to store the call");
  }
  *pending = nullptr;
  return Guarded([&] {
    if (client == nullptr) return SetLastError(NoClient());
    auto call = std::make_unique<kv_pending>();
    call->parking = client->parking;
    Request copying = request;
    copying.copy_raw_values = true;  // the caller's raw bytes are its own again on return
    Submit(*client->client, copying, *call);
    *pending = call.release();
    return ClearLastError();
  });
}

// Takes the parked calls that are ready out of the parking; see Parking::sweep_at. Caller holds
// parking.mu, and collects them after releasing it.
std::vector<std::unique_ptr<kv_pending>> TakeReady(Parking& parking) {
  std::vector<std::unique_ptr<kv_pending>> ready;
  auto& calls = parking.calls;
  auto still_pending =
      std::partition(calls.begin(), calls.end(),
                     [](const std::unique_ptr<kv_pending>& p) { return !IsReady(*p); });
  std::move(still_pending, calls.end(), std::back_inserter(ready));
  calls.erase(still_pending, calls.end());
  parking.sweep_at = std::max(Parking::kMinSweep, 2 * calls.size());
  return ready;
}

// Collects the parked calls that are ready, returning how many; their buffers go back unless
// they timed out.
size_t CollectParked(Parking& parking) {
  std::vector<std::unique_ptr<kv_pending>> ready;
  {
    std::lock_guard<std::mutex> lock(parking.mu);
    if (parking.calls.empty()) return 0;
    ready = TakeReady(parking);
  }
  for (auto& call : ready) (void)Collect(*call);
  return ready.size();
}

Request Keyed(Op op, size_t count, const kv_bytes_t* keys, const kv_call_options_t* options) {
  Request r;
  r.op = op;
  r.count = count;
  r.keys = keys;
  r.call = options;
  return r;
}

Request Write(Op op, size_t count, const kv_bytes_t* keys, const kv_value_t* values,
              const kv_bytes_t* session_ids, const kv_block_t* blocks,
              const kv_write_options_t* options) {
  Request r;
  r.op = op;
  r.count = count;
  r.keys = keys;
  r.values = values;
  r.session_ids = session_ids;
  r.blocks = blocks;
  r.write = options;
  return r;
}

Request Read(size_t count, const kv_bytes_t* keys, kv_buffer_t* const* buffers,
             const kv_call_options_t* options) {
  Request r = Keyed(Op::kGet, count, keys, options);
  r.buffers = buffers;
  return r;
}

// kv_put_from / kv_upsert_from and kv_get_into: the values are ranges of the caller's memory.
Request WriteFrom(Op op, size_t count, const kv_bytes_t* keys, const kv_memory_range_t* ranges,
                  const size_t* range_counts, const kv_bytes_t* session_ids,
                  const kv_block_t* blocks, const kv_write_options_t* options) {
  Request r = Write(op, count, keys, nullptr, session_ids, blocks, options);
  r.memory = true;
  r.ranges = ranges;
  r.range_counts = range_counts;
  return r;
}

Request ReadInto(size_t count, const kv_bytes_t* keys, const kv_memory_range_t* ranges,
                 const size_t* range_counts, const kv_call_options_t* options) {
  Request r = Keyed(Op::kGet, count, keys, options);
  r.memory = true;
  r.ranges = ranges;
  r.range_counts = range_counts;
  return r;
}

Request Timed(Op op, uint32_t timeout_ms) {
  Request r;
  r.op = op;
  r.timeout_ms = timeout_ms;
  return r;
}

Request Listing(const kv_list_options_t* options) {
  Request r;
  r.op = Op::kList;
  r.list = options;
  return r;
}

}  // namespace
}  // namespace kvagent::c_abi

using kvagent::c_abi::Call;
using kvagent::c_abi::Guarded;
using kvagent::c_abi::Keyed;
using kvagent::c_abi::Op;
using kvagent::c_abi::ReadInto;
using kvagent::c_abi::SetLastError;
using kvagent::c_abi::SubmitCall;
using kvagent::c_abi::Write;
using kvagent::c_abi::WriteFrom;

extern "C" {

const char* kv_status_name(kv_status_t status) {
  if (status < 0 || status > 0xFFFF) return "INTERNAL";
  return kvagent::ErrorCodeName(kvagent::ErrorCodeFromWire(static_cast<uint16_t>(status))).data();
}

const char* kv_last_error_message(void) { return kvagent::c_abi::LastErrorMessage(); }

const char* kv_version(void) { return KVCLIENT_VERSION; }

kv_status_t kv_connect(const kv_connect_options_t* options, kv_client_t** client) {
  if (client == nullptr) {
    return SetLastError(KV_INVALID_PARAMS, "client is NULL; pass where to store the client");
  }
  *client = nullptr;
  return Guarded([&] {
    kv_connect_options_t o;
    kv_connect_options_init(&o);
    kvagent::Status read = kvagent::c_abi::ReadOptions(
        options, &o, "options", "kv_connect_options_init",
        offsetof(kv_connect_options_t, process_memory));  // 0.1's struct ends there
    if (!read.ok()) return SetLastError(read);
    kvagent::ClientOptions co;
    if (o.run_dir != nullptr && *o.run_dir != '\0') co.run_dir = o.run_dir;
    if (o.client_name != nullptr) co.client_name = o.client_name;  // "": the SDK's default
    if (o.arena_bytes != 0) co.arena_bytes = o.arena_bytes;
    co.ring_bytes = o.ring_bytes;
    if (o.connect_timeout_ms != 0)
      co.connect_timeout = std::chrono::milliseconds(o.connect_timeout_ms);
    if (o.call_timeout_ms != 0) co.call_timeout = std::chrono::milliseconds(o.call_timeout_ms);
    co.spin = std::chrono::microseconds(o.spin_us);
    if (o.max_in_flight != 0) co.max_in_flight = o.max_in_flight;
    co.process_memory = o.process_memory != 0;
    co.peer_scratch_bytes = o.peer_scratch_bytes;
    auto connected = kvagent::Client::Connect(std::move(co));
    if (!connected.ok()) return SetLastError(connected.status());
    auto handle = std::make_unique<kv_client>();
    handle->client = std::move(*connected);
    *client = handle.release();
    return kvagent::c_abi::ClearLastError();
  });
}

void kv_client_free(kv_client_t* client) {
  if (client == nullptr) return;
  std::unique_ptr<kv_client> owned(client);
  // Closing first fails what is pending and makes the agent reclaim the segment; no range can be
  // handed out again afterwards, so the parked references may go.
  owned->client.reset();
  decltype(owned->parking->calls) calls;
  decltype(owned->parking->timed_out) timed_out;
  try {
    std::lock_guard<std::mutex> lock(owned->parking->mu);
    owned->parking->closed = true;
    calls.swap(owned->parking->calls);
    timed_out.swap(owned->parking->timed_out);
  } catch (...) {  // std::mutex::lock failing: the parked calls go with the parking itself
  }
}

uint64_t kv_client_id(const kv_client_t* client) {
  return client ? client->client->client_id() : 0;
}
uint64_t kv_client_agent_incarnation(const kv_client_t* client) {
  return client ? client->client->agent_incarnation() : 0;
}
uint64_t kv_client_agent_epoch(const kv_client_t* client) {
  return kv_client_agent_incarnation(client);
}
uint64_t kv_client_arena_bytes(const kv_client_t* client) {
  return client ? client->client->arena_bytes() : 0;
}
int kv_client_connected(const kv_client_t* client) {
  return client && client->client->connected() ? 1 : 0;
}
int kv_client_process_memory(const kv_client_t* client) {
  return client && client->client->process_memory() ? 1 : 0;
}

kv_status_t kv_allocate(kv_client_t* client, size_t size, kv_buffer_t** buffer) {
  if (buffer == nullptr) {
    return SetLastError(KV_INVALID_PARAMS, "buffer is NULL; pass where to store the buffer");
  }
  *buffer = nullptr;
  return Guarded([&] {
    if (client == nullptr) return SetLastError(kvagent::c_abi::NoClient());
    auto allocated = client->client->Allocate(size);
    if (!allocated.ok() && allocated.status().code() == kvagent::ErrorCode::kNoSpace &&
        kvagent::c_abi::CollectParked(*client->parking) > 0) {
      allocated = client->client->Allocate(size);  // abandoned calls gave buffers back
    }
    if (!allocated.ok()) return SetLastError(allocated.status());
    auto handle = std::make_unique<kv_buffer>();
    handle->arena = std::make_shared<kvagent::ArenaBuffer>(std::move(*allocated));
    *buffer = handle.release();
    return kvagent::c_abi::ClearLastError();
  });
}

void kv_buffer_free(kv_buffer_t* buffer) { delete buffer; }
void* kv_buffer_data(const kv_buffer_t* buffer) { return buffer ? buffer->arena->data() : nullptr; }
size_t kv_buffer_size(const kv_buffer_t* buffer) { return buffer ? buffer->arena->size() : 0; }

// ---- synchronous calls ---------------------------------------------------------------------

kv_status_t kv_ping(kv_client_t* client, uint32_t timeout_ms) {
  return Call(client, kvagent::c_abi::Timed(Op::kPing, timeout_ms), nullptr);
}

kv_status_t kv_put(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                   const kv_value_t* values, const kv_bytes_t* session_ids,
                   const kv_block_t* blocks, const kv_write_options_t* options,
                   kv_result_t** result) {
  return Call(client, Write(Op::kPut, count, keys, values, session_ids, blocks, options), result);
}

kv_status_t kv_upsert(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                      const kv_value_t* values, const kv_bytes_t* session_ids,
                      const kv_block_t* blocks, const kv_write_options_t* options,
                      kv_result_t** result) {
  return Call(client, Write(Op::kUpsert, count, keys, values, session_ids, blocks, options),
              result);
}

kv_status_t kv_get(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                   kv_buffer_t* const* buffers, const kv_call_options_t* options,
                   kv_result_t** result) {
  return Call(client, kvagent::c_abi::Read(count, keys, buffers, options), result);
}

kv_status_t kv_put_from(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                        const kv_memory_range_t* ranges, const size_t* range_counts,
                        const kv_bytes_t* session_ids, const kv_block_t* blocks,
                        const kv_write_options_t* options, kv_result_t** result) {
  return Call(client,
              WriteFrom(Op::kPut, count, keys, ranges, range_counts, session_ids, blocks, options),
              result);
}

kv_status_t kv_upsert_from(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                           const kv_memory_range_t* ranges, const size_t* range_counts,
                           const kv_bytes_t* session_ids, const kv_block_t* blocks,
                           const kv_write_options_t* options, kv_result_t** result) {
  return Call(
      client,
      WriteFrom(Op::kUpsert, count, keys, ranges, range_counts, session_ids, blocks, options),
      result);
}

kv_status_t kv_get_into(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                        const kv_memory_range_t* ranges, const size_t* range_counts,
                        const kv_call_options_t* options, kv_result_t** result) {
  return Call(client, ReadInto(count, keys, ranges, range_counts, options), result);
}

kv_status_t kv_exist(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                     const kv_call_options_t* options, kv_result_t** result) {
  return Call(client, Keyed(Op::kExist, count, keys, options), result);
}

kv_status_t kv_remove(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                      const kv_call_options_t* options, kv_result_t** result) {
  return Call(client, Keyed(Op::kRemove, count, keys, options), result);
}

kv_status_t kv_remove_all(kv_client_t* client, const kv_call_options_t* options,
                          kv_result_t** result) {
  return Call(client, Keyed(Op::kRemoveAll, 0, nullptr, options), result);
}

kv_status_t kv_list(kv_client_t* client, const kv_list_options_t* options, kv_result_t** result) {
  return Call(client, kvagent::c_abi::Listing(options), result);
}

kv_status_t kv_stat(kv_client_t* client, uint32_t timeout_ms, kv_result_t** result) {
  return Call(client, kvagent::c_abi::Timed(Op::kStat, timeout_ms), result);
}

// ---- asynchronous calls --------------------------------------------------------------------

kv_status_t kv_submit_ping(kv_client_t* client, uint32_t timeout_ms, kv_pending_t** pending) {
  return SubmitCall(client, kvagent::c_abi::Timed(Op::kPing, timeout_ms), pending);
}

kv_status_t kv_submit_put(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                          const kv_value_t* values, const kv_bytes_t* session_ids,
                          const kv_block_t* blocks, const kv_write_options_t* options,
                          kv_pending_t** pending) {
  return SubmitCall(client, Write(Op::kPut, count, keys, values, session_ids, blocks, options),
                    pending);
}

kv_status_t kv_submit_upsert(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                             const kv_value_t* values, const kv_bytes_t* session_ids,
                             const kv_block_t* blocks, const kv_write_options_t* options,
                             kv_pending_t** pending) {
  return SubmitCall(client, Write(Op::kUpsert, count, keys, values, session_ids, blocks, options),
                    pending);
}

kv_status_t kv_submit_get(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                          kv_buffer_t* const* buffers, const kv_call_options_t* options,
                          kv_pending_t** pending) {
  return SubmitCall(client, kvagent::c_abi::Read(count, keys, buffers, options), pending);
}

kv_status_t kv_submit_put_from(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                               const kv_memory_range_t* ranges, const size_t* range_counts,
                               const kv_bytes_t* session_ids, const kv_block_t* blocks,
                               const kv_write_options_t* options, kv_pending_t** pending) {
  return SubmitCall(
      client, WriteFrom(Op::kPut, count, keys, ranges, range_counts, session_ids, blocks, options),
      pending);
}

kv_status_t kv_submit_upsert_from(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                                  const kv_memory_range_t* ranges, const size_t* range_counts,
                                  const kv_bytes_t* session_ids, const kv_block_t* blocks,
                                  const kv_write_options_t* options, kv_pending_t** pending) {
  return SubmitCall(
      client,
      WriteFrom(Op::kUpsert, count, keys, ranges, range_counts, session_ids, blocks, options),
      pending);
}

kv_status_t kv_submit_get_into(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                               const kv_memory_range_t* ranges, const size_t* range_counts,
                               const kv_call_options_t* options, kv_pending_t** pending) {
  return SubmitCall(client, ReadInto(count, keys, ranges, range_counts, options), pending);
}

kv_status_t kv_submit_exist(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                            const kv_call_options_t* options, kv_pending_t** pending) {
  return SubmitCall(client, Keyed(Op::kExist, count, keys, options), pending);
}

kv_status_t kv_submit_remove(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                             const kv_call_options_t* options, kv_pending_t** pending) {
  return SubmitCall(client, Keyed(Op::kRemove, count, keys, options), pending);
}

kv_status_t kv_submit_remove_all(kv_client_t* client, const kv_call_options_t* options,
                                 kv_pending_t** pending) {
  return SubmitCall(client, Keyed(Op::kRemoveAll, 0, nullptr, options), pending);
}

kv_status_t kv_submit_list(kv_client_t* client, const kv_list_options_t* options,
                           kv_pending_t** pending) {
  return SubmitCall(client, kvagent::c_abi::Listing(options), pending);
}

kv_status_t kv_submit_stat(kv_client_t* client, uint32_t timeout_ms, kv_pending_t** pending) {
  return SubmitCall(client, kvagent::c_abi::Timed(Op::kStat, timeout_ms), pending);
}

int kv_pending_ready(kv_pending_t* pending) {
  if (pending == nullptr) return 1;  // kv_pending_wait answers at once (INVALID_PARAMS)
  try {
    return kvagent::c_abi::IsReady(*pending) ? 1 : 0;
  } catch (...) {
    return 1;  // let kv_pending_wait report what is wrong
  }
}

kv_status_t kv_pending_wait(kv_pending_t* pending, kv_result_t** result) {
  if (result != nullptr) *result = nullptr;
  return Guarded([&] {
    if (pending == nullptr) {
      return kvagent::c_abi::Finish(
          kvagent::c_abi::FailedReply(
              kvagent::InvalidParams("pending is NULL; pass a call from a kv_submit_* function"),
              0),
          result);
    }
    return kvagent::c_abi::Finish(kvagent::c_abi::Collect(*pending), result);
  });
}

void kv_pending_free(kv_pending_t* pending) {
  if (pending == nullptr) return;
  std::unique_ptr<kv_pending> owned(pending);
  try {
    // Without buffers, abandoning is safe at once (PendingCall frees the slot).
    if (owned->held.empty() || owned->collected) return;
    // Collecting a ready call keeps a timed-out call's buffers reserved (Collect).
    if (kvagent::c_abi::IsReady(*owned)) {
      (void)kvagent::c_abi::Collect(*owned);
      return;
    }
    auto parking = owned->parking.lock();
    if (!parking) return;
    std::vector<std::unique_ptr<kv_pending>> ready;
    {
      std::lock_guard<std::mutex> lock(parking->mu);
      if (parking->closed) return;
      parking->calls.push_back(std::move(owned));
      if (parking->calls.size() >= parking->sweep_at) ready = kvagent::c_abi::TakeReady(*parking);
    }
    for (auto& call : ready) (void)kvagent::c_abi::Collect(*call);
  } catch (...) {  // out of memory while parking: the call is abandoned with its buffers
  }
}

}  // extern "C"

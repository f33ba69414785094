#include "call_args.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "boundary.h"
#include "kvagent/common/validate.h"

namespace kvagent::c_abi {
namespace {

std::string Indexed(const char* array, size_t i) {
  return std::string(array) + "[" + std::to_string(i) + "]";
}

Status NullArray(const char* array, size_t count, const char* what_to_do) {
  return InvalidParams(std::string(array) + " is NULL but count is " + std::to_string(count) +
                       "; " + what_to_do);
}

// Bytes a C caller passed; a NULL pointer is an error unless the size is 0.
Status ReadBytes(const kv_bytes_t& bytes, const std::string& what, std::string_view* out) {
  if (bytes.size == 0) {
    *out = {};
    return Status::Ok();
  }
  if (bytes.data == nullptr) {
    return InvalidParams(what + ".data is NULL but its size is " + std::to_string(bytes.size) +
                         "; pass the bytes or size 0");
  }
  *out = std::string_view(static_cast<const char*>(bytes.data), bytes.size);
  return Status::Ok();
}

template <typename T>
Status ReadArray(const T* data, size_t count, const std::string& what, std::vector<T>* out) {
  if (count > 0 && data == nullptr) {
    return InvalidParams(what + " is NULL but its count is " + std::to_string(count));
  }
  out->assign(data, data + count);
  return Status::Ok();
}

// Per-thread strings for the keys and session IDs of calls (the C++ API takes std::string):
// they keep their capacity from call to call, so steady traffic copies bytes without
// allocating. What stays between calls is bounded: kKeptStrings strings of at most kKeptBytes
// capacity each, 256 KiB per pool and thread.
class StringPool {
 public:
  static constexpr size_t kKeptStrings = 1024;
  static constexpr size_t kKeptBytes = 256;

  // The first `count` strings, for one call at a time on this thread.
  std::span<std::string> Take(size_t count) {
    if (strings_.size() < count) strings_.resize(count);
    used_ = count;
    return {strings_.data(), count};
  }

  // Ends the call: drops what exceeds the bounds. O(strings used by the call).
  void Release() {
    for (size_t i = 0; i < std::min(used_, kKeptStrings); ++i) {
      if (strings_[i].capacity() > kKeptBytes) std::string().swap(strings_[i]);
    }
    if (strings_.size() > kKeptStrings) {
      strings_.resize(kKeptStrings);
      strings_.shrink_to_fit();
    }
    used_ = 0;
  }

 private:
  std::vector<std::string> strings_;
  size_t used_ = 0;
};

thread_local StringPool t_key_pool;
thread_local StringPool t_session_pool;

// Copies the `count` byte strings of the C array `name` into `pool`; `out` views the copies.
Status CopyStrings(StringPool& pool, const kv_bytes_t* items, size_t count, const char* name,
                   std::span<const std::string>* out) {
  std::span<std::string> copies = pool.Take(count);
  for (size_t i = 0; i < count; ++i) {
    std::string_view bytes;
    KVAGENT_RETURN_IF_ERROR(ReadBytes(items[i], Indexed(name, i), &bytes));
    copies[i].assign(bytes);
  }
  *out = copies;
  return Status::Ok();
}

// The C++ form of one call, built from a Request. Holds copies of the keys and session IDs (in
// this thread's pools, until destroyed) and of the block metadata; raw values point at the
// caller's bytes, or, for an asynchronous call, at copies in arena buffers the call holds.
struct CallArgs {
  CallArgs() = default;
  CallArgs(const CallArgs&) = delete;
  CallArgs& operator=(const CallArgs&) = delete;
  ~CallArgs() {
    t_key_pool.Release();
    t_session_pool.Release();
  }

  std::span<const std::string> keys;
  std::span<const std::string> session_ids;
  std::vector<BlockMetadata> blocks;
  std::vector<Value> values;
  std::vector<const ArenaBuffer*> targets;
  std::vector<MemoryRange> memory;         // kv_*_from / kv_get_into: every key's ranges
  std::vector<MemoryValue> memory_values;  // ... and each key's slice of them
  CallOptions options;
  ListOptions list;

  Status Read(Client& client, const Request& r, std::vector<std::shared_ptr<ArenaBuffer>>* held);

 private:
  Status ReadKeys(const Request& r);
  Status ReadWrite(Client& client, const Request& r,
                   std::vector<std::shared_ptr<ArenaBuffer>>* held);
  Status ReadBlock(const kv_block_t& c, size_t i, BlockMetadata* out);
  Status ReadTargets(const Request& r, std::vector<std::shared_ptr<ArenaBuffer>>* held);
  Status ReadMemory(const Request& r);
  Status ReadCallOptions(const Request& r);
  Status ReadList(const Request& r);
};

Status CallArgs::Read(Client& client, const Request& r,
                      std::vector<std::shared_ptr<ArenaBuffer>>* held) {
  switch (r.op) {
    case Op::kPing:
    case Op::kStat:
      options.timeout = std::chrono::milliseconds(r.timeout_ms);
      return Status::Ok();
    case Op::kList:
      return ReadList(r);
    case Op::kPut:
    case Op::kUpsert:
      KVAGENT_RETURN_IF_ERROR(ReadKeys(r));
      return ReadWrite(client, r, held);
    case Op::kGet:
      KVAGENT_RETURN_IF_ERROR(ReadKeys(r));
      KVAGENT_RETURN_IF_ERROR(r.memory ? ReadMemory(r) : ReadTargets(r, held));
      return ReadCallOptions(r);
    case Op::kExist:
    case Op::kRemove:
      KVAGENT_RETURN_IF_ERROR(ReadKeys(r));
      return ReadCallOptions(r);
    case Op::kRemoveAll:
      return ReadCallOptions(r);
  }
  return Internal("libkvclient: unknown operation; report this bug");
}

Status CallArgs::ReadKeys(const Request& r) {
  if (r.count > kMaxBatchKeys) {  // before anything is sized by it
    return InvalidParams("count is " + std::to_string(r.count) + "; a call takes at most " +
                         std::to_string(kMaxBatchKeys) + " keys: split the batch");
  }
  if (r.count > 0 && r.keys == nullptr) {
    return NullArray("keys", r.count, "pass one kv_bytes_t per key");
  }
  return CopyStrings(t_key_pool, r.keys, r.count, "keys", &keys);
}

Status CallArgs::ReadMemory(const Request& r) {
  // Bounds what is read from the caller before the arrays are copied (layers x keys at most).
  constexpr size_t kMaxRanges = size_t{256} * kMaxBatchKeys;
  if (r.count > 0 && r.ranges == nullptr) {
    return NullArray("ranges", r.count, "pass at least one kv_memory_range_t per key");
  }
  size_t total = 0;
  for (size_t i = 0; i < r.count; ++i) {
    const size_t n = r.range_counts == nullptr ? 1 : r.range_counts[i];
    if (n == 0) {
      return InvalidParams(Indexed("range_counts", i) + " is 0; give at least one range per key");
    }
    if (n > kMaxRanges - total) {
      return InvalidParams("range_counts add up to more than " + std::to_string(kMaxRanges) +
                           " ranges; split the call");
    }
    total += n;
  }
  memory.reserve(total);
  for (size_t j = 0; j < total; ++j)
    memory.push_back(MemoryRange{r.ranges[j].data, r.ranges[j].size});
  memory_values.reserve(r.count);
  size_t first = 0;
  for (size_t i = 0; i < r.count; ++i) {
    const size_t n = r.range_counts == nullptr ? 1 : r.range_counts[i];
    memory_values.emplace_back(memory.data() + first, n);
    first += n;
  }
  return Status::Ok();
}

Status CallArgs::ReadWrite(Client& client, const Request& r,
                           std::vector<std::shared_ptr<ArenaBuffer>>* held) {
  if (r.memory) {
    KVAGENT_RETURN_IF_ERROR(ReadMemory(r));
    values.assign(memory_values.begin(), memory_values.end());
  } else if (r.count > 0 && r.values == nullptr) {
    return NullArray("values", r.count, "pass one kv_value_t per key");
  }
  if (!r.memory) values.reserve(r.count);
  for (size_t i = 0; !r.memory && i < r.count; ++i) {
    const kv_value_t& v = r.values[i];
    if (v.buffer != nullptr) {
      held->push_back(v.buffer->arena);
      values.emplace_back(*v.buffer->arena, v.size);
    } else if (v.bytes == nullptr && v.size > 0) {
      return InvalidParams(Indexed("values", i) + " has neither a buffer nor bytes; set one");
    } else if (r.copy_raw_values) {
      // The SDK would send the bytes' address (process memory, or bytes that lie in the arena):
      // the agent reads them when it comes to the call, after the caller may have changed them.
      auto copy = client.Allocate(std::max<size_t>(v.size, 1));
      if (!copy.ok()) {
        return Status(copy.status().code(),
                      Indexed("values", i) + ": no arena space to copy the value into (" +
                          copy.status().message() +
                          "); wait for calls in flight, or pass a kv_buffer_t");
      }
      if (v.size > 0) std::memcpy(copy->data(), v.bytes, v.size);
      held->push_back(std::make_shared<ArenaBuffer>(std::move(*copy)));
      values.emplace_back(*held->back(), v.size);
    } else {
      values.emplace_back(std::span<const uint8_t>(static_cast<const uint8_t*>(v.bytes), v.size));
    }
  }
  if (r.session_ids != nullptr) {
    KVAGENT_RETURN_IF_ERROR(
        CopyStrings(t_session_pool, r.session_ids, r.count, "session_ids", &session_ids));
    options.session_ids = session_ids;
  }
  if (r.blocks != nullptr) {
    blocks.resize(r.count);
    for (size_t i = 0; i < r.count; ++i) {
      KVAGENT_RETURN_IF_ERROR(ReadBlock(r.blocks[i], i, &blocks[i]));
    }
    options.blocks = blocks;
  }
  kv_write_options_t write;
  kv_write_options_init(&write);
  KVAGENT_RETURN_IF_ERROR(ReadOptions(r.write, &write, "options", "kv_write_options_init"));
  options.timeout = std::chrono::milliseconds(write.timeout_ms);
  options.write.replica_count = write.replica_count;
  options.write.soft_pin = write.soft_pin != 0;
  options.write.soft_pin_ttl_ms = write.soft_pin_ttl_ms;
  options.write.hard_pin = write.hard_pin != 0;
  return Status::Ok();
}

Status CallArgs::ReadBlock(const kv_block_t& c, size_t i, BlockMetadata* out) {
  const std::string what = Indexed("blocks", i);
  KVAGENT_RETURN_IF_ERROR(ReadArray(c.hashes, c.hash_count, what + ".hashes", &out->block_hashes));
  KVAGENT_RETURN_IF_ERROR(
      ReadArray(c.token_ids, c.token_count, what + ".token_ids", &out->token_ids));
  std::string_view lora;
  KVAGENT_RETURN_IF_ERROR(ReadBytes(c.lora_name, what + ".lora_name", &lora));
  out->lora_name.assign(lora);
  out->hashes_signed = c.hashes_signed != 0;
  out->has_parent = c.has_parent != 0;
  out->parent_block_hash = c.parent_hash;
  out->block_size = c.block_size;
  return Status::Ok();
}

Status CallArgs::ReadTargets(const Request& r, std::vector<std::shared_ptr<ArenaBuffer>>* held) {
  if (r.count > 0 && r.buffers == nullptr) {
    return NullArray("buffers", r.count, "pass one kv_buffer_t per key");
  }
  targets.reserve(r.count);
  for (size_t i = 0; i < r.count; ++i) {
    const kv_buffer_t* b = r.buffers[i];
    if (b == nullptr) {
      return InvalidParams(Indexed("buffers", i) + " is NULL; allocate it with kv_allocate");
    }
    held->push_back(b->arena);
    targets.push_back(b->arena.get());
  }
  return Status::Ok();
}

Status CallArgs::ReadCallOptions(const Request& r) {
  kv_call_options_t call;
  kv_call_options_init(&call);
  KVAGENT_RETURN_IF_ERROR(ReadOptions(r.call, &call, "options", "kv_call_options_init"));
  options.timeout = std::chrono::milliseconds(call.timeout_ms);
  options.force = call.force != 0;
  return Status::Ok();
}

Status CallArgs::ReadList(const Request& r) {
  kv_list_options_t c;
  kv_list_options_init(&c);
  KVAGENT_RETURN_IF_ERROR(ReadOptions(r.list, &c, "options", "kv_list_options_init"));
  std::string_view prefix;
  KVAGENT_RETURN_IF_ERROR(ReadBytes(c.prefix, "options.prefix", &prefix));
  list.prefix.assign(prefix);
  list.cursor = c.cursor;
  if (c.limit != 0) list.limit = c.limit;
  list.timeout = std::chrono::milliseconds(c.timeout_ms);
  return Status::Ok();
}

}  // namespace

Reply FailedReply(const Status& status, size_t key_count) {
  Reply reply;
  reply.status = status;
  reply.keys.assign(key_count, KeyResult{status.code(), status.message(), 0, false});
  return reply;
}

size_t RefusedKeyCount(const Request& request) {
  return request.count <= kMaxBatchKeys ? request.count : 0;
}

void Submit(Client& client, const Request& r, kv_pending& pending) {
  CallArgs a;
  if (Status read = a.Read(client, r, &pending.held); !read.ok()) {
    pending.held.clear();
    pending.refused = FailedReply(read, RefusedKeyCount(r));
    return;
  }
  switch (r.op) {
    case Op::kPing:
      pending.call = client.SubmitPing(a.options.timeout);
      return;
    case Op::kPut:
      pending.call = client.SubmitPut(a.keys, a.values, a.options);
      return;
    case Op::kUpsert:
      pending.call = client.SubmitUpsert(a.keys, a.values, a.options);
      return;
    case Op::kGet:
      pending.call = r.memory ? client.SubmitGetInto(a.keys, a.memory_values, a.options)
                              : client.SubmitGet(a.keys, a.targets, a.options);
      return;
    case Op::kExist:
      pending.call = client.SubmitExist(a.keys, a.options);
      return;
    case Op::kRemove:
      pending.call = client.SubmitRemove(a.keys, a.options);
      return;
    case Op::kRemoveAll:
      pending.call = client.SubmitRemoveAll(a.options);
      return;
    case Op::kList:
      pending.call = client.SubmitList(a.list);
      return;
    case Op::kStat:
      pending.call = client.SubmitStat(a.options.timeout);
      return;
  }
}

Reply Collect(kv_pending& pending) {
  if (pending.collected) {
    return FailedReply(InvalidParams("this call was already waited for; wait once per call"), 0);
  }
  pending.collected = true;
  Reply reply = pending.refused ? std::move(*pending.refused) : pending.call.Wait();
  if (reply.status.code() == ErrorCode::kTimeout && !pending.held.empty()) {
    // The agent may still be working on the call and touch these ranges later: they stay
    // reserved until the client is freed (a visible cost in arena space, never corruption).
    if (auto parking = pending.parking.lock()) {
      std::lock_guard<std::mutex> lock(parking->mu);
      if (!parking->closed) {
        for (auto& b : pending.held) parking->timed_out.push_back(std::move(b));
      }
    }
  }
  pending.held.clear();  // otherwise the call is over: the agent no longer touches these ranges
  return reply;
}

bool IsReady(kv_pending& pending) {
  return pending.collected || pending.refused.has_value() || pending.call.Ready();
}

}  // namespace kvagent::c_abi

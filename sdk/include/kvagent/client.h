// The kvagent SDK: what an inference engine links to talk to the node agent.
//
//   kvagent::ClientOptions options;
//   options.client_name = "vllm-0";                                // run_dir: /run/kvagent
//   auto client = kvagent::Client::Connect(options);
//   if (!client.ok()) { /* client.status().ToString() says what to do */ }
//   kvagent::ArenaBuffer block = (*client)->Allocate(block_bytes).value();
//   FillKvBlock(block.data(), block.size());                       // in place: zero-copy
//   std::vector<std::string> keys = {"block-0"}, sessions = {"session-42"};
//   std::vector<kvagent::Value> values = {kvagent::Value(block)};
//   kvagent::CallOptions call;
//   call.session_ids = sessions;
//   kvagent::Reply r = (*client)->Put(keys, values, call);
//   for (const kvagent::KeyResult& k : r.keys) if (!k.ok()) { /* k.code, k.message */ }
//
// Transport: a shared-memory segment per client (a request ring, a completion ring and a data
// arena) set up over <run_dir>/agent.sock; see ipc/ and schemas/agent.fbs.
//
// Threading: a Client is thread-safe. Several engine threads may call at once: a process-local
// lock serializes writing to the request ring, and completions are reaped by the waiting threads
// themselves (one leads and reaps for all, the others sleep until their answer is there), so the
// hot path has no thread hop. A full request ring makes the caller wait (never drops).
// Asynchronous calls return a PendingCall handle to wait on or poll; there are no callbacks, so
// no SDK thread ever runs user code.
//
// Failure: every call has a timeout (TIMEOUT) and every error is a code plus a message. When the
// agent dies or shuts down, pending and future calls fail with AGENT_UNAVAILABLE: a small
// monitor thread sees EOF on the socket at once, and the agent's shutdown word in the segment
// fails calls immediately. Arguments are validated locally first (INVALID_PARAMS without a
// round trip, common/validate.h); the agent validates again.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/common/status.h"

namespace kvagent {

namespace sdk_detail {
struct ArenaState;
class Connection;
struct CallSpec;
}  // namespace sdk_detail

struct ClientOptions {
  std::string run_dir = "/run/kvagent";  // where the agent's agent.sock is
  std::string client_name;               // for the agent's logs; default "<program>:<pid>"
  uint64_t arena_bytes = 64ULL << 20;    // data arena wanted (the agent may grant less)
  uint64_t ring_bytes = 0;               // each ring (power of two); 0: the agent's default
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds call_timeout{30000};  // default for calls that give none
  // How long a waiting caller spins on the completion ring before it sleeps on the futex.
  std::chrono::microseconds spin{50};
  // Calls in flight at once; Submit waits (reaping completions) when all are taken.
  uint32_t max_in_flight = 4096;
  // Lets the agent read and write this process's memory directly (process_vm_readv/writev):
  // values given as memory (MemoryRange, plain bytes) then cross memory once, straight between
  // this process and the node pool, instead of through the arena. The agent grants it when it
  // may read this process (same user, or CAP_SYS_PTRACE; under Yama ptrace_scope 1 the SDK
  // names the agent as this process's ptracer with prctl(PR_SET_PTRACER), which replaces an
  // earlier such setting of the process). Client::process_memory() says whether it was granted;
  // without it such values are copied through the arena, as before.
  bool process_memory = false;
  // With process memory: arena bytes set aside for parts of values that travel to or from a
  // peer's pool (the data plane moves bytes only from registered memory). 0: a quarter of the
  // arena, at most 64 MiB.
  uint64_t peer_scratch_bytes = 0;
};

// A range of this process's own memory: a host KV pool, a tensor, any buffer. A put reads it,
// a get writes it; it must stay valid (and, for a get, unread by others) until the call returns
// (for Submit, until Wait returns).
struct MemoryRange {
  void* data = nullptr;
  size_t size = 0;
};

// One key's value as ranges of this process's memory, in order: gathered for a put, filled for a
// get (their total is the capacity).
using MemoryValue = std::span<const MemoryRange>;

// A range of this client's data arena, owned by the caller: allocated by Client::Allocate and
// returned to the arena on destruction. Fill it in place and pass it to Put (zero-copy), or
// pass it to Get to receive a value. Move-only. Stays valid even after the Client is gone
// (the mapping lives while any buffer does), but can then only be freed.
class ArenaBuffer {
 public:
  ArenaBuffer() = default;
  ArenaBuffer(ArenaBuffer&& other) noexcept;
  ArenaBuffer& operator=(ArenaBuffer&& other) noexcept;
  ArenaBuffer(const ArenaBuffer&) = delete;
  ArenaBuffer& operator=(const ArenaBuffer&) = delete;
  ~ArenaBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<uint8_t> span() const { return {data_, size_}; }
  uint64_t offset() const { return offset_; }  // from the arena's start (what the agent sees)
  bool valid() const { return data_ != nullptr; }

 private:
  friend class Client;
  friend class sdk_detail::Connection;
  ArenaBuffer(std::shared_ptr<sdk_detail::ArenaState> arena, uint64_t offset, size_t size);

  std::shared_ptr<sdk_detail::ArenaState> arena_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  uint64_t offset_ = 0;
};

// A value to store: an ArenaBuffer (zero-copy; the first `length` bytes, default all), or bytes
// or memory ranges of this process. With process memory (ClientOptions::process_memory) the
// agent reads bytes and ranges straight from this process; otherwise the SDK copies them into a
// temporary arena buffer for the duration of the call. The referred memory must stay valid and
// unchanged until the call returns (or, for Submit, until Wait returns): the agent may read it
// any time before.
class Value {
 public:
  // The concatenation of `ranges` (memory of this process; see MemoryRange).
  Value(MemoryValue ranges);                                                      // NOLINT
  Value(const ArenaBuffer& buffer) : buffer_(&buffer), length_(buffer.size()) {}  // NOLINT
  Value(const ArenaBuffer& buffer, size_t length) : buffer_(&buffer), length_(length) {}
  Value(std::span<const uint8_t> bytes) : bytes_(bytes), length_(bytes.size()) {}  // NOLINT
  Value(std::string_view bytes)                                                    // NOLINT
      : bytes_(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
        length_(bytes.size()) {}

  const ArenaBuffer* buffer() const { return buffer_; }
  std::span<const uint8_t> bytes() const { return bytes_; }
  MemoryValue ranges() const { return ranges_; }  // non-empty for a value given as ranges
  size_t length() const { return length_; }

 private:
  const ArenaBuffer* buffer_ = nullptr;
  std::span<const uint8_t> bytes_;
  MemoryValue ranges_;
  size_t length_ = 0;
};

// Metadata of the KV block(s) a key holds; becomes the key's BlockStored event (docs/events.md).
struct BlockMetadata {
  std::vector<uint64_t> block_hashes;  // at least one
  bool hashes_signed = false;          // SGLang-style signed hashes on the event stream
  bool has_parent = false;
  uint64_t parent_block_hash = 0;
  std::vector<uint32_t> token_ids;  // empty (block_size 0), or block_size * block_hashes.size()
  uint32_t block_size = 0;
  std::string lora_name;
};

struct WriteOptions {
  uint8_t replica_count = 1;
  bool soft_pin = false;
  uint32_t soft_pin_ttl_ms = 0;  // 0: the master's default
  bool hard_pin = false;
};

// Optional arguments of a call.
struct CallOptions {
  std::span<const std::string> session_ids;  // Put/Upsert: one per key (empty = untagged), or none
  // Put/Upsert: one per key, or none. An entry with no hashes, no token IDs and no lora_name
  // (a default BlockMetadata) means that key carries no block metadata.
  std::span<const BlockMetadata> blocks;
  WriteOptions write;                    // Put/Upsert
  bool force = false;                    // Remove/RemoveAll: even leased objects
  std::chrono::milliseconds timeout{0};  // 0: ClientOptions::call_timeout
};

// The outcome for one key.
struct KeyResult {
  ErrorCode code = ErrorCode::kOk;
  std::string message;  // what went wrong and what to do; empty when OK
  uint64_t length = 0;  // Get: the value's length
  bool exists = false;  // Exist: readable
  // Put/Upsert that stored the value: replicas written (of its part with the fewest), fewer than
  // asked when some could not be written (a peer unreachable); 0 otherwise.
  uint32_t replicas = 0;
  // OK, or OBJECT_ALREADY_EXISTS for a Put ("exists": callers treat it as success).
  bool ok() const { return code == ErrorCode::kOk || code == ErrorCode::kObjectAlreadyExists; }
};

// List: one stored object.
struct ListedKey {
  std::string key;
  uint64_t size = 0;       // value bytes
  std::string session_id;  // "" when untagged
};

// Stat: one counter, e.g. "agent.requests.put" or "master.keys"; `text` for the few values that
// are words (e.g. "agent.master_link").
struct Counter {
  std::string name;
  uint64_t value = 0;
  std::string text;
};

// Sessions: what the cluster stores for one session ID now.
struct SessionUsage {
  std::string session_id;
  uint64_t blocks = 0;  // readable objects tagged with the session
  uint64_t bytes = 0;   // their value bytes
};

// The outcome of a call. `status` is the request-level result: OK when every key was attempted
// (look at `keys`), otherwise why none was — then every key carries the same code and message.
struct [[nodiscard]] Reply {
  Status status;
  std::vector<KeyResult> keys;         // one per key of the request, in order
  uint64_t removed_count = 0;          // RemoveAll
  std::vector<ListedKey> listed;       // List: this page
  uint64_t next_cursor = 0;            // List, Sessions: pass it to the next call; 0 at the end
  std::vector<Counter> counters;       // Stat
  std::vector<SessionUsage> sessions;  // Sessions
  bool ok() const { return status.ok(); }
};

// Arguments of List.
struct ListOptions {
  std::string prefix;                    // only keys that start with it ("" for every key)
  uint64_t cursor = 0;                   // 0 to start, then Reply::next_cursor
  uint32_t limit = 1000;                 // about this many keys per page (at most 10000)
  std::chrono::milliseconds timeout{0};  // 0: ClientOptions::call_timeout
};

// Arguments of Sessions.
struct SessionsOptions {
  std::string session_id;                // this session only ("" for every session, paged)
  uint64_t cursor = 0;                   // 0 to start, then Reply::next_cursor
  uint32_t limit = 1000;                 // at most this many sessions per page (at most 10000)
  std::chrono::milliseconds timeout{0};  // 0: ClientOptions::call_timeout
};

// A submitted call whose reply has not been collected. Move-only. Destroying it without Wait()
// abandons the call: its reply is dropped when it arrives. While the agent is moving the call's
// bytes the destructor waits for that move to end, so the call's buffers are free once it
// returns (as after Wait()).
class PendingCall {
 public:
  PendingCall();  // holds no call: Wait() returns INTERNAL
  PendingCall(PendingCall&& other) noexcept;
  PendingCall& operator=(PendingCall&& other) noexcept;
  PendingCall(const PendingCall&) = delete;
  PendingCall& operator=(const PendingCall&) = delete;
  ~PendingCall();

  // True when Wait() would return at once. Never blocks (reaps completions if no other thread
  // is doing it).
  bool Ready();
  // Blocks until the reply arrives or the call's timeout passes (then TIMEOUT). Call once.
  Reply Wait();

 private:
  friend class sdk_detail::Connection;
  PendingCall(std::shared_ptr<sdk_detail::Connection> connection, uint32_t slot, uint64_t id,
              Reply failed);

  std::shared_ptr<sdk_detail::Connection> connection_;
  uint32_t slot_ = 0;
  uint64_t id_ = 0;
  Reply failed_;  // set when the call failed before reaching the ring (no slot is held)
};

class Client {
 public:
  // Connects to the agent at <options.run_dir>/agent.sock, performs the handshake and maps the
  // segment. AGENT_UNAVAILABLE when no agent listens or it refuses us (the message says why),
  // TIMEOUT when it does not answer within connect_timeout.
  static Result<std::unique_ptr<Client>> Connect(ClientOptions options);

  // Closes the connection (the agent reclaims the segment). Calls still pending fail with
  // AGENT_UNAVAILABLE; ArenaBuffers stay valid until they are destroyed.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // A buffer of `bytes` from the arena (best fit, coalescing on free). NO_SPACE when no free
  // extent is large enough: the message gives the largest one.
  Result<ArenaBuffer> Allocate(size_t bytes);

  // Synchronous calls: submit and wait. Per-key results are in Reply::keys.
  Reply Ping(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  Reply Put(std::span<const std::string> keys, std::span<const Value> values,
            const CallOptions& options = {});
  Reply Upsert(std::span<const std::string> keys, std::span<const Value> values,
               const CallOptions& options = {});
  // Reads each key's value into the matching buffer (its size is the capacity).
  Reply Get(std::span<const std::string> keys, std::span<const ArenaBuffer* const> buffers,
            const CallOptions& options = {});
  // Reads each key's value into ranges of this process's memory (targets[i], filled in order;
  // their total is the capacity); Reply::keys[i].length is the value's length. With process
  // memory the agent writes straight into them; otherwise the value goes through a temporary
  // arena buffer and is copied out when the call returns.
  Reply GetInto(std::span<const std::string> keys, std::span<const MemoryValue> targets,
                const CallOptions& options = {});
  Reply Exist(std::span<const std::string> keys, const CallOptions& options = {});
  Reply Remove(std::span<const std::string> keys, const CallOptions& options = {});
  Reply RemoveAll(const CallOptions& options = {});
  // One page of the stored keys (with size and session) in Reply::listed. Every key present
  // during a whole scan (cursor 0 to next_cursor 0) is listed exactly once; a page may be
  // shorter or somewhat longer than `limit`, and may be empty before the scan ends.
  Reply List(const ListOptions& options = {});
  // The agent's counters ("agent.*": clients, requests, batches, keys and bytes per op,
  // failures, master link) and the master's ("master.*") in Reply::counters.
  Reply Stat(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // What the cluster stores per session ID now, in Reply::sessions: blocks (readable objects
  // tagged with the session) and bytes, from counters the master keeps (the cost does not grow
  // with the number of keys). With options.session_id, that session (zeros when nothing is
  // stored); else a page of the sessions that store something, in the master's order (page on
  // with Reply::next_cursor until it is 0). A page may be shorter than `limit`, even empty,
  // before the end.
  Reply Sessions(const SessionsOptions& options = {});

  // Asynchronous forms: submit now, collect with PendingCall::Wait() or poll Ready(). Local
  // validation errors and agent failures come back through the PendingCall as well.
  PendingCall SubmitPing(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  PendingCall SubmitPut(std::span<const std::string> keys, std::span<const Value> values,
                        const CallOptions& options = {});
  PendingCall SubmitUpsert(std::span<const std::string> keys, std::span<const Value> values,
                           const CallOptions& options = {});
  PendingCall SubmitGet(std::span<const std::string> keys,
                        std::span<const ArenaBuffer* const> buffers,
                        const CallOptions& options = {});
  PendingCall SubmitGetInto(std::span<const std::string> keys, std::span<const MemoryValue> targets,
                            const CallOptions& options = {});
  PendingCall SubmitExist(std::span<const std::string> keys, const CallOptions& options = {});
  PendingCall SubmitRemove(std::span<const std::string> keys, const CallOptions& options = {});
  PendingCall SubmitRemoveAll(const CallOptions& options = {});
  PendingCall SubmitList(const ListOptions& options = {});
  PendingCall SubmitStat(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  PendingCall SubmitSessions(const SessionsOptions& options = {});

  uint64_t client_id() const;
  // The agent's incarnation: drawn anew at each agent start, so it tells one run from the next.
  uint64_t agent_incarnation() const;
  // Deprecated: the former name of agent_incarnation(), returning the same value.
  uint64_t agent_epoch() const;
  uint64_t arena_bytes() const;  // granted
  // False once the agent is known to be gone (then every call fails with AGENT_UNAVAILABLE).
  bool connected() const;
  // True when the agent reads and writes this process's memory directly (asked with
  // ClientOptions::process_memory and granted at connect).
  bool process_memory() const;

 private:
  explicit Client(std::shared_ptr<sdk_detail::Connection> connection);
  PendingCall Submit(const sdk_detail::CallSpec& spec);

  std::shared_ptr<sdk_detail::Connection> connection_;
};

}  // namespace kvagent

// Test doubles for the request pipeline's unit tests: a master port whose calls the test answers
// by hand, a data plane whose transfers the test runs (peers' pools are byte vectors it can
// corrupt or make unreachable), a completion sink that records answers and runs posted tasks,
// and a client with a real arena segment that builds requests. The test thread plays the
// agent's service thread: it hands requests in, ends passes, answers the master and runs what
// was posted. The pipeline itself (batches, node pool, checksums, fences) is the real one.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data_plane.h"
#include "kvagent/agent/master_port.h"
#include "kvagent/agent/request_handler.h"
#include "kvagent/common/checksum.h"
#include "kvagent/ipc/segment.h"
#include "kvagent/schemas/agent_generated.h"
#include "kvagent/schemas/master_generated.h"
#include "kvagent/transfer/node_pool.h"
#include "kvagent/transfer/pool_fence.h"
#include "request_pipeline.h"

namespace kvagent::agent::testing {

namespace mfb = kvagent::master_proto;
using Clock = std::chrono::steady_clock;

inline constexpr uint32_t kOwnPool = 1;              // this agent's pool at the fake master
inline constexpr uint64_t kOwnIncarnation = 0x1001;  // its pool incarnation
inline constexpr uint64_t kMasterEpoch = 0x5eed;     // the fake master's epoch
inline constexpr const char* kOwnEndpoint = "tcp://10.0.0.1:7000";

// ---- master ---------------------------------------------------------------------------------

// One call the pipeline made, with the request bytes (a private copy) and its callback.
struct MasterCall {
  std::vector<uint8_t> bytes;
  MasterReplyFn done;
  bool until_answered = false;  // CallUntilAnswered
  MasterPort::Clock::time_point retry_until{};

  const mfb::Request& request() const { return *flatbuffers::GetRoot<mfb::Request>(bytes.data()); }
  uint64_t id() const { return request().request_id(); }
  mfb::Body type() const { return request().body_type(); }
  // The keys of a key-carrying request, in order.
  std::vector<std::string> keys() const;
  // WriteFinish fields.
  const mfb::WriteFinish* finish() const;
};

class FakeMaster final : public MasterPort {
 public:
  void Bind(PostFn post) override { post_ = std::move(post); }
  void Call(flatbuffers::DetachedBuffer request, MasterReplyFn done) override {
    Record(std::move(request), std::move(done), false, {});
  }
  void CallUntilAnswered(flatbuffers::DetachedBuffer request, MasterReplyFn done,
                         Clock::time_point retry_until) override {
    Record(std::move(request), std::move(done), true, retry_until);
  }
  bool ready() const override { return true; }
  MasterIdentity identity() const override { return {7, kOwnPool}; }
  std::string Describe() const override { return "fake master"; }
  void Stop() override { pending_.clear(); }

  // Calls not answered yet, oldest first.
  size_t pending() const { return pending_.size(); }
  // Removes and returns the oldest unanswered call; fails the test when there is none or it is
  // of another type.
  MasterCall Take(mfb::Body type);
  // Every call ever made, in order (bytes only).
  const std::vector<std::vector<uint8_t>>& log() const { return log_; }
  size_t CountCalls(mfb::Body type) const;

  PostFn post_;

 private:
  void Record(flatbuffers::DetachedBuffer request, MasterReplyFn done, bool until,
              Clock::time_point retry_until);
  std::deque<MasterCall> pending_;
  std::vector<std::vector<uint8_t>> log_;
};

// Reply builders. A placement of one replica of one part.
struct ReplicaAt {
  uint32_t part = 0;
  uint32_t pool = kOwnPool;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t checksum = 0;
  bool checksummed = false;
};
// One key of a PlacementReply.
struct PlacedKey {
  ErrorCode code = ErrorCode::kOk;
  std::string message;
  uint64_t write_id = 0;  // WriteStart: the write; BatchGet: the object's version
  uint64_t size = 0;      // BatchGet
  std::vector<ReplicaAt> replicas;
};
// A pool the reply names.
struct PoolAt {
  uint32_t id = kOwnPool;
  std::string endpoint = kOwnEndpoint;
  uint64_t incarnation = kOwnIncarnation;
};

std::vector<uint8_t> PlacementReply(uint64_t id, const std::vector<PlacedKey>& keys,
                                    const std::vector<PoolAt>& pools, bool with_sizes,
                                    uint32_t lease_ttl_ms = 10000);
std::vector<uint8_t> KeyCodesReply(uint64_t id, const std::vector<ErrorCode>& codes,
                                   const std::vector<uint8_t>& replicas = {},
                                   const std::vector<bool>& exists = {},
                                   uint64_t removed_count = 0);
struct ListedAt {
  std::string key;
  uint64_t size = 0;
  std::string session;
};
std::vector<uint8_t> ListKeysReply(uint64_t id, const std::vector<ListedAt>& keys,
                                   uint64_t next_cursor, bool restarted = false);
std::vector<uint8_t> StatsReply(uint64_t id, const std::vector<std::pair<std::string, uint64_t>>&);
// A request-level refusal (status != OK, no body).
std::vector<uint8_t> RefusedReply(uint64_t id, ErrorCode code, const std::string& message);

inline void Answer(MasterCall& call, const std::vector<uint8_t>& reply) {
  call.done(std::span<const uint8_t>(reply));
}
inline void Fail(MasterCall& call, ErrorCode code, const std::string& message) {
  call.done(Status(code, message));
}

// ---- data plane -----------------------------------------------------------------------------

class FakeDataPlane final : public DataPlane {
 public:
  struct Batch {
    std::vector<transfer::TransferOp> ops;
    transfer::TransferCallback done;
  };

  bool IsLocal(std::string_view endpoint) const override { return endpoint == kOwnEndpoint; }
  Status RegisterMemory(void* addr, uint64_t) override {
    registered_.push_back(addr);
    return Status::Ok();
  }
  Status UnregisterMemory(void* addr) override {
    std::erase(registered_, addr);
    return Status::Ok();
  }
  void Submit(std::vector<transfer::TransferOp> ops, transfer::TransferCallback done) override {
    batches_.push_back(Batch{std::move(ops), std::move(done)});
  }
  std::string endpoint() const override { return kOwnEndpoint; }
  transfer::TransferStats stats() const override { return {}; }

  // A peer pool of `bytes` at `endpoint`.
  std::vector<uint8_t>& AddPeer(const std::string& endpoint, size_t bytes) {
    return peers_[endpoint] = std::vector<uint8_t>(bytes, 0);
  }
  std::vector<uint8_t>& peer(const std::string& endpoint) { return peers_.at(endpoint); }
  // Every op to `endpoint` fails with `status` (e.g. TRANSFER_FAILED: unreachable).
  void Refuse(const std::string& endpoint, Status status) {
    refused_[endpoint] = std::move(status);
  }

  size_t waiting() const { return batches_.size(); }
  // Runs the oldest submitted batch: moves its bytes and calls its callback (which posts to
  // the service thread). Returns its ops.
  std::vector<transfer::TransferOp> RunOne();
  // Runs every batch submitted so far.
  void RunAll() {
    while (!batches_.empty()) RunOne();
  }
  const std::vector<transfer::TransferOp>& ops_run() const { return ops_run_; }
  const std::vector<void*>& registered() const { return registered_; }

 private:
  std::deque<Batch> batches_;
  std::map<std::string, std::vector<uint8_t>> peers_;
  std::map<std::string, Status> refused_;
  std::vector<transfer::TransferOp> ops_run_;
  std::vector<void*> registered_;
};

// ---- the service thread's side --------------------------------------------------------------

struct Completed {
  ClientId client;
  uint64_t request_id;
  CompletionData data;
};

class FakeSink final : public CompletionSink {
 public:
  void Complete(ClientId client, uint64_t request_id, const CompletionData& data) override {
    completed.push_back(Completed{client, request_id, data});
  }
  void Post(std::function<void()> task) override { posted_.push_back(std::move(task)); }
  size_t ClientCount() const override { return 1; }
  // Runs the posted tasks (including those they post), as the service thread would.
  void RunPosted() {
    while (!posted_.empty()) {
      auto task = std::move(posted_.front());
      posted_.pop_front();
      task();
    }
  }
  // The completion of `request_id`; fails the test when there is none.
  const CompletionData& Of(uint64_t request_id) const;
  bool Has(uint64_t request_id) const;

  std::vector<Completed> completed;

 private:
  std::deque<std::function<void()>> posted_;
};

// ---- a client -------------------------------------------------------------------------------

struct WriteArgs {
  std::vector<std::string> sessions;
  uint8_t replicas = 1;
  bool upsert = false;
  // The caller's deadline; none when unset.
  std::optional<Clock::time_point> deadline;
};

// A client with a real shared-memory arena (the name is unlinked at once) whose requests the
// test builds. Values are placed in the arena one after another.
class TestClient {
 public:
  explicit TestClient(ClientId id, uint64_t arena_bytes = 4 << 20);
  ClientId id() const { return id_; }
  std::span<uint8_t> arena() const { return segment_->arena(); }

  ClientRequest Put(const std::vector<std::string>& keys, const std::vector<std::string>& values,
                    const WriteArgs& args = {});
  // Buffers of `capacities` bytes in the arena; bytes() reads one back after the get.
  ClientRequest Get(const std::vector<std::string>& keys, const std::vector<uint64_t>& capacities,
                    std::optional<Clock::time_point> deadline = std::nullopt);
  ClientRequest Keys(proto::Op op, const std::vector<std::string>& keys, bool force = false);
  ClientRequest List(const std::string& prefix, uint64_t cursor, uint32_t limit);
  ClientRequest Single(proto::Op op, bool force = false);

  // The bytes of the get `request`'s buffer `i`, `length` of them.
  std::string Bytes(const ClientRequest& request, size_t i, uint64_t length) const;

 private:
  ClientRequest Make(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id);
  // Request ids are unique across clients, so a completion is found by its id alone.
  static uint64_t NextRequestId();
  proto::BufferRef Place(const std::string& value);
  proto::BufferRef Reserve(uint64_t bytes);

  ClientId id_;
  std::shared_ptr<ipc::Segment> segment_;
  uint64_t next_offset_ = 0;
};

// ---- the rig --------------------------------------------------------------------------------

// A pipeline over a FakeMaster, a FakeDataPlane and a real 4 MiB node pool.
class PipelineRig {
 public:
  explicit PipelineRig(bool checksums = true, uint64_t pool_bytes = 4 << 20);
  ~PipelineRig();

  // Hands `request` in and ends the pass (the master call goes out). Returns its request id.
  uint64_t Send(ClientRequest request);
  // Hands in every request, then ends one pass (they may share a batch).
  void SendTogether(std::vector<ClientRequest> requests);
  // Runs every transfer and posted task until neither is left, then ends a pass.
  void Settle();

  transfer::NodePool& pool() { return *pool_; }
  // The pool's fence: incarnation kOwnIncarnation, registered with kMasterEpoch.
  transfer::PoolFence& fence() { return *fence_; }
  RequestPipeline& pipeline() { return *pipeline_; }
  // The counter `name` of a Stat reply built now (agent counters only).
  uint64_t Counter(const std::string& name);

  FakeMaster* master = nullptr;   // owned by the pipeline
  FakeDataPlane* data = nullptr;  // owned by the pipeline
  FakeSink sink;

 private:
  std::unique_ptr<transfer::NodePool> pool_;
  std::unique_ptr<transfer::PoolFence> fence_;
  std::unique_ptr<RequestPipeline> pipeline_;
};

// The CRC32C of a string's bytes.
inline uint32_t Crc(std::string_view bytes) { return Crc32c(bytes.data(), bytes.size()); }

// A value of `n` bytes that differs with `seed`.
std::string Pattern(const std::string& seed, size_t n);

}  // namespace kvagent::agent::testing

// One master round of the request pipeline: the requests it carries, and the state machine that
// takes them from the master call to their completions.
//
//   WriteBatch  Put/Upsert: WriteStart -> copy the bytes (memcpy / data plane) -> End for the
//               keys whose every replica arrived, Revoke for the others -> completions.
//   ReadBatch   Get: BatchGet -> copy each part from one replica -> completions.
//   KeyBatch    Exist, Remove: one call -> per-key codes.
//   SingleCall  RemoveAll, List (paged), Stat: one request each.
//
// A batch lives in the pipeline until finished() (swept at the end of each pass), so the
// callbacks it hands to the master port and the data plane may refer to it. Everything runs on
// the service thread; callbacks may arrive before the call that caused them returned (embedded
// master), so a batch sets up its state before each call.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data_moves.h"
#include "master_messages.h"
#include "pipeline_context.h"

namespace kvagent::agent {

class Batch {
 public:
  Batch(PipelineContext& ctx, MasterMessages& messages, std::vector<HeldRequest> requests);
  virtual ~Batch() = default;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // Sends the first master call.
  virtual void Start() = 0;
  // The client left: its requests get no answer, no bytes go into its arena, and its writes
  // not yet ended are revoked.
  void ClientGone(ClientId client);
  bool finished() const { return finished_; }

 protected:
  // Answers every request whose client is still there and marks the batch finished.
  void CompleteAll();
  // Every request fails with `status` (e.g. MASTER_UNAVAILABLE), then CompleteAll.
  void FailAll(const Status& status);
  // Counts a master call for `op` carrying `keys` keys.
  void CountCall(proto::Op op, size_t keys);
  // The key order of the batch: every key of every request, by original position.
  void CollectKeys();
  HeldRequest& held(KeyRef k) { return requests_[k.request]; }
  // Key `k` fails with TIMEOUT because its caller's deadline passed; `skipped` says what was not
  // done. Counted in agent.expired_keys.
  void FailExpired(KeyRef k, std::string_view skipped);

  PipelineContext& ctx_;
  MasterMessages& messages_;
  std::vector<HeldRequest> requests_;
  std::vector<KeyRef> keys_;
  bool finished_ = false;
};

class WriteBatch final : public Batch {
 public:
  WriteBatch(PipelineContext& ctx, MasterMessages& messages, bool upsert,
             std::vector<HeldRequest> requests);
  void Start() override;

 private:
  enum KeyState : uint8_t { kNotStarted, kStarted, kFailed };  // kFailed: started, not ended
  void OnStarted(Result<std::span<const uint8_t>> reply);
  void CopyKey(uint32_t key, const mfb::PlacementReply& reply, const SegmentTable& segments);
  void OnMoved(std::span<const uint32_t> keys, std::span<const Status> results);
  bool Expire(uint32_t key, std::chrono::steady_clock::time_point now, std::string_view skipped);
  void Finish();
  void OnFinished(bool end, Result<std::span<const uint8_t>> reply);

  const bool upsert_;
  std::vector<KeyState> state_;
  RemoteMoves remote_;
  std::vector<KeyRef> to_end_;
  std::vector<KeyRef> to_revoke_;
  int finishing_ = 0;  // End/Revoke calls not answered yet
  Status finish_error_;
};

class ReadBatch final : public Batch {
 public:
  ReadBatch(PipelineContext& ctx, MasterMessages& messages, std::vector<HeldRequest> requests);
  void Start() override;

 private:
  void OnPlaced(Result<std::span<const uint8_t>> reply);
  void CopyKey(uint32_t key, uint64_t size, const mfb::PlacementReply& reply,
               const SegmentTable& segments);
  void OnMoved(std::span<const uint32_t> keys, std::span<const Status> results);
  void Finish();

  std::chrono::steady_clock::time_point sent_at_;
  std::chrono::milliseconds lease_{0};
  // A part read from a peer, with the part's other replicas to try when that read fails.
  struct RemoteRead {
    uint8_t* dst = nullptr;
    uint64_t length = 0;
    std::vector<std::pair<std::string, uint64_t>> others;  // peer endpoint, offset in its pool
  };
  void AddRemoteRead(uint32_t key, RemoteRead read, std::string_view peer, uint64_t offset);

  std::vector<uint8_t> copied_;  // per key: bytes were copied into the arena
  RemoteMoves remote_;
  std::vector<RemoteRead> reads_;  // parallel to remote_'s ops, in the order they were added
};

// Exist or Remove (all requests with the same `force`).
class KeyBatch final : public Batch {
 public:
  KeyBatch(PipelineContext& ctx, MasterMessages& messages, proto::Op op,
           std::vector<HeldRequest> requests);
  void Start() override;

 private:
  void OnReply(Result<std::span<const uint8_t>> reply);
  const proto::Op op_;
};

// RemoveAll, List or Stat: one request, one (or, for List, a few) master calls.
class SingleCall final : public Batch {
 public:
  SingleCall(PipelineContext& ctx, MasterMessages& messages, HeldRequest request);
  void Start() override;

 private:
  void OnRemoveAll(Result<std::span<const uint8_t>> reply);
  void ListPage();
  void OnListPage(Result<std::span<const uint8_t>> reply);
  void OnStats(Result<std::span<const uint8_t>> reply);

  uint64_t cursor_ = 0;
  uint32_t pages_ = 0;
  uint64_t listed_bytes_ = 0;
};

}  // namespace kvagent::agent

// RequestPipeline: the agent's RequestHandler. Batches every client's requests to the master,
// moves the bytes between client arenas and the stores' pools, and answers per key.
//
// Natural batching: Handle() only queues (per op kind); OnPassEnd() — the end of a pass of the
// ring service over every client's ring — sends what was queued as one master batch per op kind
// (Put and Upsert also split by write options, Remove by `force`; each batch at most
// kMaxBatchKeys keys). No timer: a lone request goes out at the end of its pass, a burst from
// many clients becomes one batch. Batches then run concurrently (batch.h); requests in flight at
// the same time are not ordered with respect to each other.
//
// Every key's result maps back by its original position (request, index) — SEMANTICS rule 9 —
// and failures are per key where the master or the data plane reports them per key; a master
// that cannot be reached fails every key of the affected requests with MASTER_UNAVAILABLE.
//
// A client that goes away: its queued requests are dropped, its keys between WriteStart and End
// are revoked instead of ended (nothing partial becomes readable), no more bytes go into its
// arena, and its completions are dropped. Its arena stays mapped (ClientRequest::segment) until
// the last transfer using it is done.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "batch.h"
#include "kvagent/agent/master_port.h"
#include "kvagent/agent/request_handler.h"
#include "master_messages.h"
#include "pipeline_context.h"
#include "write_reservations.h"

namespace kvagent::agent {

class RequestPipeline final : public RequestHandler {
 public:
  // Takes the master port; `pool`, `engine` and `fence` (null: local copies are not fenced)
  // must outlive the pipeline. `checksums`: take them on put and verify them on get.
  RequestPipeline(std::unique_ptr<MasterPort> master, transfer::NodePool* pool,
                  transfer::TransferEngine* engine, const transfer::PoolFence* fence = nullptr,
                  bool checksums = true);
  // The same over any data plane (the pipeline's unit tests give it a test double).
  RequestPipeline(std::unique_ptr<MasterPort> master, transfer::NodePool* pool,
                  std::unique_ptr<DataPlane> data_plane, const transfer::PoolFence* fence,
                  bool checksums);
  ~RequestPipeline() override;
  RequestPipeline(const RequestPipeline&) = delete;
  RequestPipeline& operator=(const RequestPipeline&) = delete;

  // Stat replies also carry what `fn` appends (the event relay's counters). Call before the
  // agent starts; `fn` runs on the service thread.
  void set_extra_counters(std::function<void(std::vector<Counter>*)> fn) {
    ctx_.extra_counters = std::move(fn);
  }

  // Puts of sizes seen before use writes reserved ahead at the master (one master round trip
  // per put instead of two; write_reservations.h). For a remote master; call before the agent
  // starts.
  void EnableReservedWrites(const WriteReservations::Options& options);
  // Large local copies split across `threads` threads (the service thread and threads - 1
  // helpers; copy_helpers.h). Call before the agent starts.
  void SetCopyThreads(unsigned threads);
  // The `kvctl stat` counters ("agent.*"), with `clients` attached now. Any thread (the metrics
  // endpoint calls it).
  std::vector<Counter> Counters(size_t clients) const;
  // The data plane, for its own counters.
  const DataPlane& data_plane() const { return *ctx_.engine; }
  // One line for systemd's STATUS= (service thread): clients, requests so far, the master link.
  std::string StatusLine() const;
  // Put/get phase histograms (any thread may read them).
  const PhaseLatency& latency() const { return ctx_.latency; }

  void OnStart(CompletionSink& sink) override;
  void Handle(ClientRequest request, CompletionSink& sink) override;
  void OnPassEnd() override;
  void OnClientGone(ClientId client) override;
  Clock::time_point NextDeadline() const override;
  void OnTimer(Clock::time_point now) override;
  bool AwaitingOtherThreads() const override { return !active_.empty(); }
  bool TakeReplies() override { return master_->TakeReplies(); }
  void StopTakingReplies() override { master_->StopTakingReplies(); }
  void OnServiceStop() override;

 private:
  std::vector<HeldRequest>& queue(proto::Op op) { return queued_[static_cast<size_t>(op)]; }
  void FlushWrites(proto::Op op);
  void FlushKeys(proto::Op op);
  void FlushSingles(proto::Op op);
  void StartBatch(std::unique_ptr<Batch> batch);
  void Sweep();

  std::unique_ptr<MasterPort> master_;
  std::unique_ptr<DataPlane> data_plane_;
  PipelineContext ctx_;
  MasterMessages messages_;
  std::unique_ptr<WriteReservations> reservations_;
  std::unique_ptr<CopyHelpers> copy_helpers_;
  std::array<std::vector<HeldRequest>, PipelineCounters::kOps> queued_;
  std::vector<std::vector<HeldRequest>> groups_;        // scratch of FlushWrites/FlushKeys
  std::vector<std::vector<HeldRequest>> spare_queues_;  // empty buffers for queued_
  // Before active_: a batch gives its containers back when it is destroyed.
  ScratchPool<WriteBatch::Scratch> write_spares_;
  ScratchPool<ReadBatch::Scratch> read_spares_;
  std::vector<std::unique_ptr<Batch>> active_;
};

}  // namespace kvagent::agent

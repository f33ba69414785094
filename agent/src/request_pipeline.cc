#include "request_pipeline.h"

#include <algorithm>
#include <unordered_map>

#include "copy_helpers.h"
#include "kvagent/common/validate.h"
#include "pipeline_stats.h"
#include "scratch_pool.h"

namespace kvagent::agent {
namespace {

// Client frame bytes per master batch (see Group).
constexpr size_t kMaxBatchFrameBytes = size_t{16} << 20;

// Which requests may share one master batch: those of one class. Writes by their options
// (replicas, soft pin and its TTL, hard pin), removes by force, the rest all together.
uint64_t BatchClass(proto::Op op, const proto::Request& r) {
  switch (op) {
    case proto::Op::Put:
    case proto::Op::Upsert: {
      const proto::WriteOptions* o = r.options();
      if (o == nullptr) return 1;  // replica_count 1, no pins: as the defaults
      return uint64_t{o->replica_count()} | uint64_t{o->soft_pin()} << 8 |
             uint64_t{o->hard_pin()} << 9 | uint64_t{o->soft_pin_ttl_ms()} << 32;
    }
    case proto::Op::Remove:
      return r.force() ? 1 : 0;
    default:
      return 0;
  }
}

// Splits `queue` into `out`: groups that may share a batch, each of at most kMaxBatchKeys keys and
// (unless one request alone is larger) kMaxBatchFrameBytes of client frames, in queue order.
// The master message built from a group is about as large as its frames: this keeps it well
// under kvmaster's message limit (kMaxMasterMessageBytes).
void Group(proto::Op op, std::vector<HeldRequest>& queue,
           std::vector<std::vector<HeldRequest>>* out) {
  // Whether `h` may join a group of `keys` keys and `bytes` frame bytes.
  auto fits = [](size_t keys, size_t bytes, const HeldRequest& h) {
    return keys + h.result.codes.size() <= kMaxBatchKeys &&
           bytes + h.request.frame.size() <= kMaxBatchFrameBytes;
  };
  std::vector<std::vector<HeldRequest>>& groups = *out;
  groups.clear();
  // The common case, the whole queue in one group: the queue becomes the group as it is.
  size_t joined = 0, all_keys = 0, all_bytes = 0;
  const uint64_t first_class = queue.empty() ? 0 : BatchClass(op, queue.front().request.request());
  for (const HeldRequest& h : queue) {
    if (joined > 0 &&
        (!fits(all_keys, all_bytes, h) || BatchClass(op, h.request.request()) != first_class)) {
      break;
    }
    all_keys += h.result.codes.size();
    all_bytes += h.request.frame.size();
    ++joined;
  }
  if (joined == queue.size()) {
    if (!queue.empty()) groups.emplace_back().swap(queue);
    return;
  }
  // Each request joins the newest group of its class, or starts one: O(1) per request, however
  // many classes a pass brings (a scan of every group for each request was requests x groups).
  std::vector<size_t> keys;
  std::vector<size_t> bytes;
  std::unordered_map<uint64_t, size_t> newest;  // class -> its newest group
  for (HeldRequest& h : queue) {
    const uint64_t c = BatchClass(op, h.request.request());
    auto it = newest.find(c);
    size_t g = it == newest.end() ? groups.size() : it->second;
    if (g < groups.size() && !fits(keys[g], bytes[g], h)) g = groups.size();
    if (g == groups.size()) {
      groups.emplace_back();
      keys.push_back(0);
      bytes.push_back(0);
      newest[c] = g;
    }
    keys[g] += h.result.codes.size();
    bytes[g] += h.request.frame.size();
    groups[g].push_back(std::move(h));
  }
  queue.clear();
}

}  // namespace

std::vector<Counter> RequestPipeline::Counters(size_t clients) const {
  return AgentCounters(ctx_, clients);
}

std::string RequestPipeline::StatusLine() const {
  const PipelineCounters& c = ctx_.counters;
  auto count = [&c](proto::Op op) { return std::to_string(c.requests[static_cast<size_t>(op)]); };
  return "serving " + std::to_string(ctx_.sink != nullptr ? ctx_.sink->ClientCount() : 0) +
         " client(s); requests so far: " + count(proto::Op::Put) + " put, " +
         count(proto::Op::Upsert) + " upsert, " + count(proto::Op::Get) + " get, " +
         count(proto::Op::Remove) + " remove; master: " + ctx_.master->Describe();
}

RequestPipeline::RequestPipeline(std::unique_ptr<MasterPort> master, transfer::NodePool* pool,
                                 transfer::TransferEngine* engine, const transfer::PoolFence* fence,
                                 bool checksums)
    : RequestPipeline(std::move(master), pool, std::make_unique<EngineDataPlane>(engine), fence,
                      checksums) {}

RequestPipeline::RequestPipeline(std::unique_ptr<MasterPort> master, transfer::NodePool* pool,
                                 std::unique_ptr<DataPlane> data_plane,
                                 const transfer::PoolFence* fence, bool checksums)
    : master_(std::move(master)), data_plane_(std::move(data_plane)) {
  ctx_.master = master_.get();
  messages_.set_agent_key(master_->identity().agent_key);
  ctx_.pool = pool;
  ctx_.engine = data_plane_.get();
  ctx_.fence = fence;
  ctx_.checksums = checksums;
  copy_helpers_ = std::make_unique<CopyHelpers>(1);  // the service thread alone until told more
  ctx_.copier = copy_helpers_.get();
  ctx_.gate = std::make_shared<ServiceGate>();
  ctx_.arenas = std::make_unique<ArenaRegistry>(data_plane_.get());
}

RequestPipeline::~RequestPipeline() {
  ctx_.gate->Close();
  master_->Stop();
}

void RequestPipeline::SetCopyThreads(unsigned threads) {
  copy_helpers_ = std::make_unique<CopyHelpers>(threads);
  ctx_.copier = copy_helpers_.get();
}

void RequestPipeline::EnableReservedWrites(const WriteReservations::Options& options) {
  reservations_ = std::make_unique<WriteReservations>(ctx_, messages_, options);
  ctx_.reservations = reservations_.get();
}

RequestPipeline::Clock::time_point RequestPipeline::NextDeadline() const {
  const Clock::time_point master = master_->NextDeadline();
  return reservations_ ? std::min(master, reservations_->NextDeadline()) : master;
}

void RequestPipeline::OnTimer(Clock::time_point now) {
  master_->OnTimer(now);
  if (reservations_) reservations_->Maintain();
}

void RequestPipeline::OnStart(CompletionSink& sink) {
  ctx_.sink = &sink;
  ctx_.gate->Open(&sink);
  master_->Bind([gate = ctx_.gate](std::function<void()> task) { gate->Post(std::move(task)); });
}

void RequestPipeline::Handle(ClientRequest request, CompletionSink&) {
  const proto::Op op = request.request().op();
  ++ctx_.counters.requests[static_cast<size_t>(op)];
  HeldRequest held;
  held.result.codes.assign(request.key_count(), ErrorCode::kOk);
  held.request = std::move(request);
  const auto now = std::chrono::steady_clock::now();
  ctx_.latency.RecordRingWait(held.request, now);
  held.TakeDeadline(now);
  if (held.Expired(now)) {
    // It waited in the ring past the caller's deadline (agent stalled or overloaded): the
    // caller has its TIMEOUT already; doing the work now would only surprise it.
    ctx_.counters.expired_keys += held.result.codes.size();
    held.FailAll(DeadlinePassed("nothing was done"));
    ctx_.Complete(held);
    return;
  }
  std::vector<HeldRequest>& q = queue(op);
  if (q.capacity() == 0 && !spare_queues_.empty()) {  // it went into a batch: reuse a buffer
    q.swap(spare_queues_.back());
    spare_queues_.pop_back();
  }
  q.push_back(std::move(held));
}

void RequestPipeline::OnPassEnd() {
  Sweep();
  // Writes first, so that in standalone mode (where a batch completes within this call) a read
  // queued in the same pass sees them; requests in flight together are otherwise unordered.
  FlushWrites(proto::Op::Put);
  FlushWrites(proto::Op::Upsert);
  FlushKeys(proto::Op::Remove);
  FlushSingles(proto::Op::RemoveAll);
  FlushKeys(proto::Op::Get);
  FlushKeys(proto::Op::Exist);
  FlushSingles(proto::Op::List);
  FlushSingles(proto::Op::Stat);
  FlushSingles(proto::Op::Sessions);
  if (reservations_) reservations_->Maintain();
  Sweep();
}

void RequestPipeline::FlushWrites(proto::Op op) {
  if (queue(op).empty()) return;
  Group(op, queue(op), &groups_);
  for (auto& group : groups_) {
    StartBatch(std::make_unique<WriteBatch>(ctx_, messages_, op == proto::Op::Upsert,
                                            std::move(group), &write_spares_));
  }
  groups_.clear();
}

void RequestPipeline::FlushKeys(proto::Op op) {
  if (queue(op).empty()) return;
  Group(op, queue(op), &groups_);
  for (auto& group : groups_) {
    if (op == proto::Op::Get) {
      StartBatch(std::make_unique<ReadBatch>(ctx_, messages_, std::move(group), &read_spares_));
    } else {
      StartBatch(std::make_unique<KeyBatch>(ctx_, messages_, op, std::move(group)));
    }
  }
  groups_.clear();
}

void RequestPipeline::FlushSingles(proto::Op op) {
  for (HeldRequest& h : queue(op)) {
    StartBatch(std::make_unique<SingleCall>(ctx_, messages_, std::move(h)));
  }
  queue(op).clear();
}

void RequestPipeline::StartBatch(std::unique_ptr<Batch> batch) {
  active_.push_back(std::move(batch));
  active_.back()->Start();
}

void RequestPipeline::Sweep() {
  std::erase_if(active_, [this](const std::unique_ptr<Batch>& b) {
    if (!b->finished()) return false;
    // Its requests' buffer becomes a queue's again (each single-key call would allocate one),
    // kept within the limits of the batches' other spare containers (scratch_pool.h).
    std::vector<HeldRequest> requests = b->TakeRequests();
    if (spare_queues_.size() < kMaxSpareSets && requests.capacity() <= kMaxSpareElements) {
      requests.clear();
      spare_queues_.push_back(std::move(requests));
    }
    return true;
  });
}

void RequestPipeline::OnClientGone(ClientId client) {
  for (auto& q : queued_) {
    ctx_.counters.abandoned_requests +=
        std::erase_if(q, [client](const HeldRequest& h) { return h.request.client_id == client; });
  }
  for (auto& batch : active_) batch->ClientGone(client);
  ctx_.arenas->ClientGone(client);
}

void RequestPipeline::OnServiceStop() {
  ctx_.gate->Close();
  master_->Stop();
}

}  // namespace kvagent::agent

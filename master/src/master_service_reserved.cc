// MasterService: reserved writes, the put path with one master round trip.
//
// A put that starts and ends its write at the master costs two round trips (WriteStart before
// the copy, End after it). An agent that puts values of a size it has seen before asks ahead
// for writes of that size (ReserveWrites, off the put's path), copies a value into one of them
// as soon as the engine hands it over, and commits it under its key with one message
// (BatchPutCommit). A reserved write is an ordinary write in flight that has no key yet, so
// everything the integrity rules say about writes holds for it unchanged: its write id stamps
// every data-plane write into it, it is fenced when abandoned (returned, expired, its agent
// dropped) before its space is handed out again, and a master that restarted knows none of
// them (the commit names the master's epoch).
#include <glog/logging.h>

#include <algorithm>
#include <limits>

#include "kvagent/common/validate.h"
#include "kvagent/master/master_service.h"
#include "metadata_store.h"

namespace kvagent::master {

Status MasterService::ReserveWrites(const ReserveWritesRequest& req, PlacementBatch* out) {
  out->Clear();
  Agent* agent = store_->FindAgent(req.agent);
  if (agent == nullptr) {
    return Status(ErrorCode::kAgentUnavailable,
                  "agent " + std::to_string(req.agent) +
                      " is not registered (or was dropped after missing heartbeats); register "
                      "and mount again");
  }
  if (req.count > kMaxReservedWritesPerCall || req.returned.size() > kMaxReservedWritesPerCall) {
    ++bad_requests_;
    return InvalidParams("ReserveWrites asks for " + std::to_string(req.count) + " and returns " +
                         std::to_string(req.returned.size()) + " reserved writes; the limit is " +
                         std::to_string(kMaxReservedWritesPerCall) + " each");
  }
  if (req.count > 0 && (req.size == 0 || req.size > kMaxValueBytes || req.replica_count == 0)) {
    ++bad_requests_;
    return InvalidParams("ReserveWrites needs a size of 1.." + std::to_string(kMaxValueBytes) +
                         " bytes and at least one replica");
  }
  if (req.count > 0) {
    if (Status st = CheckReplicaTotal(req.size, req.replica_count, "(reserved)", 0); !st.ok()) {
      ++bad_requests_;
      return st;
    }
  }
  const uint64_t most_per_write = MostReplicas(req.size, req.replica_count);
  for (uint64_t id : req.returned) {
    ObjectEntry* r = store_->Find(MetadataStore::ReservedKey(id));
    if (r != nullptr && r->second.pending->writer == req.agent) store_->AbortWrite(r);
  }
  // Reservations never evict: they stop below the high watermark, and at the agent's share.
  const uint64_t capacity = store_->bytes_capacity();
  const auto below_watermark =
      static_cast<uint64_t>(static_cast<double>(capacity) * options_.high_watermark);
  const uint64_t share = capacity / kReservedShareDivisor;
  const uint64_t need = PoolAllocator::Rounded(req.size) * req.replica_count;
  uint64_t used = store_->bytes_used();
  out->first.reserve(req.count + 1);
  out->write_ids.reserve(req.count);
  const int64_t now = clock_->NowMs();  // one start time for the call's writes
  for (uint32_t k = 0; k < req.count; ++k) {
    if (agent->reserved_writes >= kMaxReservedWritesPerAgent ||
        agent->reserved_bytes + need > share || used + need > below_watermark ||
        out->placements.size() + most_per_write > kMaxReplyPlacements) {
      break;
    }
    const ObjectEntry* r = store_->Reserve(*agent, req.size, req.replica_count, now);
    if (r == nullptr) break;
    used += need;
    out->first.push_back(static_cast<uint32_t>(out->placements.size()));
    AppendPlacements(r->second, out);
    out->write_ids.push_back(r->second.pending->write_id);
    out->results.push_back(Status::Ok());
  }
  out->first.push_back(static_cast<uint32_t>(out->placements.size()));
  // How long they last: abandoned when not committed within the release timeout.
  out->lease_ttl_ms = static_cast<uint32_t>(
      std::min<int64_t>(options_.put_release_timeout_ms, std::numeric_limits<uint32_t>::max()));
  return store_->FlushLog();
}

Status MasterService::BatchPutCommit(const WriteCommitRequest& req, KeyResults* out) {
  out->Clear();
  const size_t n = req.start.keys.size();
  if (Status st = ValidateWriteStart(req.start); !st.ok()) {
    return RejectBatch(st, n, &out->results);
  }
  if (req.master_epoch != epoch_) {
    // Not a bad request: the master restarted, or another one took over, since the agent
    // reserved these writes; their ids mean nothing here. Only a commit sent again finds its
    // key: the one that reached the previous master's log before it went down.
    const Status gone(ErrorCode::kMasterUnavailable,
                      "the write was reserved by another master (epoch " +
                          std::to_string(req.master_epoch) + "; this one is " +
                          std::to_string(epoch_) +
                          ": it restarted or took over); nothing was stored: put again");
    out->results.reserve(n);
    out->replicas.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
      const ObjectEntry* e = store_->Find(req.start.keys[i]);
      const bool committed = e != nullptr && e->second.readable &&
                             i < req.finish.write_ids.size() &&
                             e->second.version == req.finish.write_ids[i];
      out->results.push_back(committed ? Status::Ok() : gone);
      if (committed) {
        const Object& o = e->second;
        out->replicas[i] = static_cast<uint8_t>(
            std::min<uint32_t>(255, o.replica_total / std::max<uint32_t>(1, o.parts())));
      }
    }
    return Status::Ok();
  }
  const WriteEndRequest& finish = req.finish;
  if (finish.keys.size() != n || finish.write_ids.size() != n) {
    return RejectBatch(InvalidParams("a commit names one reserved write per key"), n,
                       &out->results);
  }
  for (size_t i = 0; i < n; ++i) {
    if (finish.keys[i] != req.start.keys[i]) {
      return RejectBatch(InvalidParams("a commit's start and finish name the same keys"), n,
                         &out->results);
    }
  }
  if (Status st = PrepareFinish(finish, n); !st.ok()) return RejectBatch(st, n, &out->results);
  store_->ReserveEvents(n);
  out->results.reserve(n);
  out->replicas.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out->replicas.push_back(0);
    out->results.push_back(CommitOne(req, i, out));
  }
  return store_->FlushLog();
}

Status MasterService::CommitOne(const WriteCommitRequest& req, size_t i, KeyResults* out) {
  const WriteStartRequest& start = req.start;
  const std::string_view key = start.keys[i];
  const uint64_t id = req.finish.write_ids[i];
  ObjectEntry* r = store_->Find(MetadataStore::ReservedKey(id));
  if (r == nullptr || r->second.pending->writer != start.agent) {
    // A commit sent again (the link dropped before the answer) finds the object it made.
    const ObjectEntry* e = store_->Find(key);
    if (e != nullptr && e->second.readable && e->second.version == id) {
      return FinishOne(req.finish, i, true, ChecksumsOf(req.finish, i), FailedOf(i), out);
    }
    return Status(ErrorCode::kMasterUnavailable,
                  "reserved write " + std::to_string(id) + " for key '" + std::string(key) +
                      "' is unknown to this master (returned, expired, or its agent was "
                      "dropped); nothing was stored: put it again");
  }
  const Object& reserved = r->second;
  if (start.sizes[i] > reserved.size ||
      reserved.pending->options.replica_count != start.options.replica_count) {
    // The message first: AbortWrite frees the reservation `reserved` refers to.
    Status refused =
        InvalidParams("key '" + std::string(key) + "' of " + std::to_string(start.sizes[i]) +
                      " bytes does not fit reserved write " + std::to_string(id) + " (" +
                      std::to_string(reserved.size) + " bytes; or its replica count differs)");
    store_->AbortWrite(r);
    return refused;
  }
  auto [e, fresh] = store_->FindOrInsert(key);
  if (!fresh) {
    if (e->second.readable) {
      // Rule 4: the existing object and its tag stay; nothing is emitted.
      store_->AbortWrite(r);
      return Status(ErrorCode::kObjectAlreadyExists,
                    "key '" + std::string(key) + "' is already stored (use upsert to replace it)");
    }
    const PendingWrite& w = *e->second.pending;
    // The clock only here, not per committed key: a read costs ~40 ns on a VM's kvm-clock.
    const int64_t now = clock_->NowMs();
    if (now - w.started_ms < options_.put_timeout_ms) {
      store_->AbortWrite(r);
      return Status(ErrorCode::kObjectAlreadyExists,
                    "key '" + std::string(key) + "' is being written by agent " +
                        std::to_string(w.writer) + " (treat as stored)");
    }
    LOG(INFO) << "agent " << start.agent << " takes over the write of key '" << key << "' started "
              << (now - w.started_ms) << " ms ago by agent " << w.writer;
  }
  store_->BindReservation(r, e, start.sizes[i]);
  PendingWrite& w = *e->second.pending;
  // Rule 3: the session ID is held by the write and committed by the End just below.
  w.tag =
      store_->tags().Acquire(start.session_ids.empty() ? std::string_view() : start.session_ids[i]);
  w.options = start.options;
  if (!start.blocks.empty()) w.meta = StoredBlockMeta::From(start.blocks[i]);
  Status st = FinishOne(req.finish, i, true, ChecksumsOf(req.finish, i), FailedOf(i), out, e);
  if (!st.ok()) {
    // Not committed (checksums that do not fit its parts, no replica written): nothing of it
    // stays (a refused log record already abandoned it).
    ObjectEntry* left = store_->Find(key);
    if (left != nullptr && left->second.pending && left->second.pending->write_id == id) {
      store_->AbortWrite(left);
    }
  }
  return st;
}

}  // namespace kvagent::master

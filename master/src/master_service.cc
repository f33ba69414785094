#include "kvagent/master/master_service.h"

#include <random>

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "kvagent/common/validate.h"
#include "metadata_store.h"

namespace kvagent::master {

int64_t SteadyClock::NowMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Status ValidateMasterOptions(const MasterOptions& o) {
  if (o.agent_ttl_ms <= 0 || o.lease_ttl_ms <= 0 || o.put_timeout_ms <= 0 ||
      o.put_release_timeout_ms <= 0 || o.soft_pin_ttl_ms <= 0) {
    return InvalidParams("TTLs and timeouts must be positive milliseconds");
  }
  if (o.agent_dead_ms != 0 && o.agent_dead_ms < o.agent_ttl_ms) {
    return InvalidParams("the agent dead timeout must be at least the agent TTL (or 0: 12 TTLs)");
  }
  if (o.max_tick_gap_ms <= 0) return InvalidParams("the largest tick gap must be positive");
  if (o.put_release_timeout_ms < o.put_timeout_ms) {
    return InvalidParams("the put release timeout must be at least the put timeout");
  }
  if (!(o.low_watermark > 0 && o.low_watermark <= o.high_watermark && o.high_watermark <= 1)) {
    return InvalidParams("watermarks must satisfy 0 < low <= high <= 1");
  }
  if (o.max_part_bytes < 4096 || o.max_part_bytes > kMaxPartBytes) {
    return InvalidParams("max part bytes must be 4096.." + std::to_string(kMaxPartBytes));
  }
  return Status::Ok();
}

namespace {

Status ObjectNotFound(std::string_view key) {
  return Status(ErrorCode::kObjectNotFound, "key '" + std::string(key) + "' is not stored");
}

}  // namespace

MasterService::MasterService(MasterOptions options, const Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      epoch_(options_.epoch != 0
                 ? options_.epoch
                 : (uint64_t{std::random_device{}()} << 32) | std::random_device{}()),
      store_(std::make_unique<MetadataStore>(options_, clock)) {}

MasterService::~MasterService() = default;

Result<std::unique_ptr<MasterService>> MasterService::Open(MasterOptions options,
                                                           const Clock* clock) {
  KVAGENT_RETURN_IF_ERROR(ValidateMasterOptions(options));
  std::unique_ptr<MasterService> s(new MasterService(std::move(options), clock));
  KVAGENT_RETURN_IF_ERROR(s->store_->Open());
  return s;
}

// ---- agents --------------------------------------------------------------------------------

Result<AgentId> MasterService::RegisterAgent(std::string_view name, uint64_t incarnation,
                                             uint64_t key) {
  if (name.empty() || name.size() > 256 || !IsValidUtf8(name)) {
    ++bad_requests_;
    return InvalidParams("the agent name must be 1..256 bytes of UTF-8 (use the host name)");
  }
  uint64_t replaced = 0;                   // the incarnation this registration replaces
  std::vector<uint64_t> replaced_earlier;  // and those it had replaced (Agent::replaced_earlier)
  if (Agent* a = store_->FindAgentByName(name)) {
    KVAGENT_RETURN_IF_ERROR(RefuseIfReplaced(a, incarnation));
    if (a->incarnation == incarnation) {
      if (a->key_bound && a->key != key) {
        return RefuseAgentKey(a, "a registration of agent \"" + std::string(name) +
                                     "\" (incarnation " + std::to_string(incarnation) +
                                     ") without the agent key its registration bound");
      }
      a->key = key;
      a->key_bound = true;
      // Alive; a suspect agent (silent, or restored from the log) is trusted with new replicas
      // only once it mounted its pool again, after it set its pool to this master's epoch.
      a->last_seen_live = store_->LiveNow();
      a->registered_here = true;
      return a->id;
    }
    // A new incarnation: the agent restarted (with its key, kept in its run dir), or another
    // process claims the name. Another key takes the name only from an agent silent past the
    // TTL (one whose run dir, and key, were lost: a reboot; or one that moved), never from one
    // that is running. Key 0 (agents of builds before the key) proves nothing either way.
    if (a->key_bound && a->key != 0 && a->key != key) {
      const int64_t silent = store_->LiveNow() - a->last_seen_live;
      if (silent <= options_.agent_ttl_ms) return RefuseNameTaken(a, incarnation, silent);
      LOG(WARNING) << "agent " << a->name << ": a registration with another agent key (incarnation "
                   << incarnation << ") takes the name over from incarnation " << a->incarnation
                   << ", silent for " << silent
                   << " ms (the agent lost its run dir, or another process took its name)";
    }
    LOG(INFO) << "agent " << a->name << " restarted (incarnation " << a->incarnation << " -> "
              << incarnation << "); its previous pool content is gone";
    replaced = a->incarnation;
    // What the holder had replaced stays refused too, logged with the new registration.
    if (a->replaced != 0) replaced_earlier.push_back(a->replaced);
    replaced_earlier.insert(replaced_earlier.end(), a->replaced_earlier.begin(),
                            a->replaced_earlier.end());
    if (!store_->DropAgent(a->id)) return store_->LogRefused();
    if (replaced_.size() == kMaxReplacedIncarnations) replaced_.pop_front();
    replaced_.push_back(Replaced{std::string(name), replaced, incarnation});
  }
  Result<AgentId> id = store_->AddAgent(name, incarnation, key, replaced, replaced_earlier);
  if (!id.ok()) return id;
  LOG(INFO) << "agent " << name << " registered as id " << *id;
  KVAGENT_RETURN_IF_ERROR(store_->FlushLog());
  return id;
}

Status MasterService::RefuseIfReplaced(Agent* a, uint64_t incarnation) {
  if (a->incarnation == incarnation) return Status::Ok();
  // The incarnation the holder's registration replaced is known from the log too (after a
  // restart of this master); older ones only from this master's memory.
  uint64_t replaced_by = 0;
  bool* reported = nullptr;
  if (a->replaced == incarnation) {
    replaced_by = a->incarnation;
    reported = &a->replaced_logged;
  } else if (std::find(a->replaced_earlier.begin(), a->replaced_earlier.end(), incarnation) !=
             a->replaced_earlier.end()) {
    replaced_by = a->incarnation;  // through those in between
    reported = &a->replaced_earlier_logged;
  } else {
    auto replaced = std::find_if(replaced_.begin(), replaced_.end(), [&](const Replaced& r) {
      return r.incarnation == incarnation && r.name == a->name;
    });
    if (replaced == replaced_.end()) return Status::Ok();
    replaced_by = replaced->by;
    reported = &replaced->reported;
  }
  ++name_conflicts_;
  const std::string why =
      "agent name \"" + a->name + "\" is taken: this agent (incarnation " +
      std::to_string(incarnation) + ") was replaced by a newer registration of the name " +
      "(incarnation " + std::to_string(replaced_by) +
      ") and its objects were dropped then; two agents share the name, or this one was " +
      "replaced while cut off. Stop one of them, or give each its own --agent-name";
  if (!*reported) {
    *reported = true;
    LOG(ERROR) << why << " (refused; counted in master.name_conflicts)";
  }
  return InvalidParams(why);
}

Status MasterService::CheckAgentKey(AgentId agent, uint64_t key) {
  Agent* a = store_->FindAgent(agent);
  if (a == nullptr || !a->key_bound || a->key == key) return Status::Ok();
  return RefuseAgentKey(a, "a call for agent " + std::to_string(agent) + " (\"" + a->name +
                               "\") without its agent key");
}

Status MasterService::RefuseNameTaken(Agent* a, uint64_t incarnation, int64_t silent_ms) {
  ++name_conflicts_;
  const std::string why =
      "agent name \"" + a->name + "\" is held by a running agent (incarnation " +
      std::to_string(a->incarnation) + ", heard from " + std::to_string(silent_ms) +
      " ms ago) with another agent key than this registration's (incarnation " +
      std::to_string(incarnation) +
      "): two agents share the name, or this agent lost its run dir (agent.key). Give each "
      "agent its own --agent-name; an agent whose run dir was lost takes its name over once "
      "the other registration is silent for the agent TTL (" +
      std::to_string(options_.agent_ttl_ms) + " ms)";
  if (!a->name_conflict_logged) {
    a->name_conflict_logged = true;
    LOG(ERROR) << why << " (refused; counted in master.name_conflicts; logged once per agent)";
  }
  return InvalidParams(why);
}

Status MasterService::RefuseAgentKey(Agent* a, const std::string& what) {
  ++agent_key_refusals_;
  const std::string why =
      what +
      ": only the agent process that registered may act for it (two processes claim "
      "one agent: another member, or a copy of this agent's name and incarnation)";
  if (!a->key_refusal_logged) {
    a->key_refusal_logged = true;
    LOG(ERROR) << why << " (refused; counted in master.agent_key_refusals; logged once per agent)";
  }
  return InvalidParams(why);
}

Result<MountResult> MasterService::MountPool(AgentId agent, uint32_t index, uint64_t size,
                                             std::span<const std::string_view> endpoints) {
  std::vector<std::string> eps;
  eps.reserve(endpoints.size());
  for (size_t i = 0; i < endpoints.size(); ++i) {
    if (!IsValidUtf8(endpoints[i]) || endpoints[i].size() > 1024) {
      ++bad_requests_;
      return InvalidParams("endpoints[" + std::to_string(i) + "] is not valid UTF-8 text");
    }
    eps.emplace_back(endpoints[i]);
  }
  auto r = store_->MountPool(agent, index, size, std::move(eps));
  if (r.ok()) {
    if (Agent* a = store_->FindAgent(agent)) store_->Touch(a);
    LOG(INFO) << "agent " << agent << " mounted pool " << r->pool_id << " (" << size << " bytes, "
              << r->restored_objects << " restored object(s))";
  }
  KVAGENT_RETURN_IF_ERROR(store_->FlushLog());
  return r;
}

bool MasterService::Heartbeat(AgentId agent) {
  Agent* a = store_->FindAgent(agent);
  if (!a || !a->registered_here) return false;
  store_->Touch(a);
  return true;
}

HeartbeatResult MasterService::Heartbeat(AgentId agent, uint64_t fence_ack) {
  Agent* a = store_->FindAgent(agent);
  // A restored agent heard before it registered again has not set its pool to this master's
  // epoch, and its ack counts its previous master's fences: it is told to register.
  if (!a || !a->registered_here) return HeartbeatResult{};
  store_->Touch(a);
  return store_->Fences(a, fence_ack);
}

// ---- writes --------------------------------------------------------------------------------

Status MasterService::RejectBatch(Status status, size_t keys, std::vector<Status>* results) {
  ++bad_requests_;
  results->assign(keys, status);
  return status;
}

Status MasterService::ValidateWriteStart(const WriteStartRequest& req) const {
  const size_t n = req.keys.size();
  KVAGENT_RETURN_IF_ERROR(ValidateWriteKeys(
      n, [&](size_t i) { return req.keys[i]; }, req.session_ids.size(),
      [&](size_t i) { return req.session_ids[i]; }));
  if (req.sizes.size() != n) {
    return InvalidParams("sizes has " + std::to_string(req.sizes.size()) + " entries for " +
                         std::to_string(n) + " keys; give one size per key");
  }
  if (!req.blocks.empty() && req.blocks.size() != n) {
    return InvalidParams("blocks has " + std::to_string(req.blocks.size()) + " entries for " +
                         std::to_string(n) + " keys; give one (possibly empty) entry per key");
  }
  for (size_t i = 0; i < n; ++i) {
    if (req.sizes[i] == 0) {
      return InvalidParams("sizes[" + std::to_string(i) + "] is 0; a value has at least 1 byte");
    }
    if (req.sizes[i] > kMaxValueBytes) {
      return InvalidParams("sizes[" + std::to_string(i) + "] is " + std::to_string(req.sizes[i]) +
                           " bytes; the limit is " + std::to_string(kMaxValueBytes));
    }
  }
  for (size_t i = 0; i < req.blocks.size(); ++i) {
    const BlockMetaView& b = req.blocks[i];
    if (b.empty()) continue;
    KVAGENT_RETURN_IF_ERROR(CheckNamed(
        [&](std::string_view w) {
          return ValidateBlockMeta(b.block_hashes.size(), b.token_ids.size(), b.block_size,
                                   b.lora_name.value_or(""), w);
        },
        [i] { return "blocks[" + std::to_string(i) + "]"; }));
  }
  if (req.options.replica_count == 0) {
    return InvalidParams("replica_count is 0; ask for at least one replica");
  }
  if (!store_->FindAgent(req.agent)) {
    return Status(ErrorCode::kAgentUnavailable,
                  "agent " + std::to_string(req.agent) +
                      " is not registered (or was dropped after missing heartbeats); register "
                      "and mount again");
  }
  return Status::Ok();
}

void MasterService::AppendPlacements(const Object& o, PlacementBatch* out) const {
  for (uint32_t i = 0; i < o.replica_total; ++i) {
    out->placements.push_back(o.replica(i).ToPlacement(false));
  }
}

Status MasterService::WriteStart(const WriteStartRequest& req, bool upsert, PlacementBatch* out) {
  out->Clear();
  const size_t n = req.keys.size();
  if (Status st = ValidateWriteStart(req); !st.ok()) return RejectBatch(st, n, &out->results);
  out->results.reserve(n);
  out->first.reserve(n + 1);
  // Rule 9: key i's session ID and block metadata are always taken at index i of the
  // request, whatever happened to the keys before it.
  out->write_ids.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out->first.push_back(static_cast<uint32_t>(out->placements.size()));
    out->results.push_back(StartOne(req, i, upsert, out));
    if (out->write_ids.size() == i) out->write_ids.push_back(0);
  }
  out->first.push_back(static_cast<uint32_t>(out->placements.size()));
  return store_->FlushLog();
}

namespace {

// One key of a WriteStart (MasterService::StartOne): a step per state the key is found in. Each
// step that succeeds has made the key's write and logged it; the caller appends its placements.
class KeyStart {
 public:
  KeyStart(MetadataStore& store, const MasterOptions& options, const WriteStartRequest& req,
           size_t i, int64_t now, std::vector<Placement>* replicas, PlacementBatch* out)
      : store_(store),
        options_(options),
        req_(req),
        i_(i),
        key_(req.keys[i]),
        size_(req.sizes[i]),
        session_(req.session_ids.empty() ? std::string_view() : req.session_ids[i]),
        now_(now),
        replicas_(*replicas),
        out_(out) {
    replicas_.clear();
  }

  // A value that takes more than the pools may hold before eviction starts would be evicted
  // at once after its put: refuse it rather than acknowledge what can never be read.
  Status RefuseAboveWatermark(ObjectEntry* e, bool fresh);
  // A key not stored nor being written.
  Status StartNew(ObjectEntry* e);
  // An upsert of a stored object: in place when its shape stays, else into new replicas.
  Status Rewrite(ObjectEntry* e);
  // A key being written: refused while the write is young, taken over once it is older than
  // the put timeout.
  Status TakeOverOrRefuse(ObjectEntry* e, bool upsert);
  // Rule 4: a put of a stored key: the existing object and its tag stay; nothing is emitted.
  Status AlreadyStored() const {
    return Status(ErrorCode::kObjectAlreadyExists,
                  "key '" + std::string(key_) + "' is already stored (use upsert to replace it)");
  }

 private:
  std::unique_ptr<PendingWrite> MakePending(TagId tag);
  Status NoSpace() const;
  bool Allocate() {
    return store_.AllocateReplicas(req_.agent, size_, req_.options.replica_count, &replicas_);
  }
  // Rule 5: a non-empty tag replaces the object's tag, an empty one keeps it.
  TagId RewriteTag(const Object& o) {
    return session_.empty() ? (store_.tags().AddRef(o.tag), o.tag)
                            : store_.tags().Acquire(session_);
  }

  MetadataStore& store_;
  const MasterOptions& options_;
  const WriteStartRequest& req_;
  const size_t i_;
  const std::string_view key_;
  const uint64_t size_;
  const std::string_view session_;
  const int64_t now_;
  std::vector<Placement>& replicas_;
  PlacementBatch* out_;
};

std::unique_ptr<PendingWrite> KeyStart::MakePending(TagId tag) {
  auto w = std::make_unique<PendingWrite>();
  w->writer = req_.agent;
  w->write_id = store_.NewWriteId();
  out_->write_ids.push_back(w->write_id);
  w->started_ms = now_;
  w->tag = tag;
  w->options = req_.options;
  if (!req_.blocks.empty()) w->meta = StoredBlockMeta::From(req_.blocks[i_]);
  return w;
}

Status KeyStart::NoSpace() const {
  if (!store_.log_writable()) return store_.LogRefused();  // eviction was refused
  return Status(ErrorCode::kNoSpace,
                "no room for " + std::to_string(size_) + " bytes of key '" + std::string(key_) +
                    "' even after eviction; add agents or memory, or remove objects");
}

Status KeyStart::RefuseAboveWatermark(ObjectEntry* e, bool fresh) {
  const uint64_t capacity = store_.bytes_capacity();
  const double watermark_share = static_cast<double>(capacity) * options_.high_watermark;
  if (static_cast<double>(size_) <= watermark_share || capacity == 0) return Status::Ok();
  if (fresh) store_.EraseFresh(e);
  store_.CountOversized();
  return Status(ErrorCode::kNoSpace,
                "key '" + std::string(key_) + "' is " + std::to_string(size_) +
                    " bytes, more than the " + std::to_string(options_.high_watermark) +
                    " high-watermark share of all pools (" +
                    std::to_string(static_cast<uint64_t>(watermark_share)) +
                    " bytes); it would be evicted at once. Store it in smaller pieces or add "
                    "memory");
}

Status KeyStart::StartNew(ObjectEntry* e) {
  if (!Allocate()) {
    store_.EraseFresh(e);
    return NoSpace();
  }
  // Rule 3: the session ID is held by the write, and committed only at End.
  store_.CreateWrite(e, size_, &replicas_, MakePending(store_.tags().Acquire(session_)));
  return Status::Ok();
}

Status KeyStart::Rewrite(ObjectEntry* e) {
  Object& o = e->second;
  if (o.lease_until_ms > now_) {
    return Status(ErrorCode::kObjectBusy, "key '" + std::string(key_) +
                                              "' is being read (lease); retry the upsert in " +
                                              std::to_string(o.lease_until_ms - now_) + " ms");
  }
  const bool in_place = size_ == o.size && o.replicas_per_part == req_.options.replica_count &&
                        o.replica_total > 0 &&
                        o.replica(0).length == std::min(size_, store_.part_bytes());
  if (in_place) {
    if (!store_.BeginRewrite(e, size_, nullptr, MakePending(RewriteTag(o)))) {
      out_->write_ids.pop_back();
      return store_.LogRefused();
    }
    return Status::Ok();
  }
  // Keep this object out of the eviction that a full pool may trigger while allocating.
  const int64_t saved_lease = o.lease_until_ms;
  o.lease_until_ms = std::numeric_limits<int64_t>::max();
  const bool allocated = Allocate();
  o.lease_until_ms = saved_lease;
  if (!allocated) return NoSpace();
  if (!store_.BeginRewrite(e, size_, &replicas_, MakePending(RewriteTag(o)))) {
    out_->write_ids.pop_back();
    store_.FreeAllocated(replicas_);
    return store_.LogRefused();
  }
  return Status::Ok();
}

Status KeyStart::TakeOverOrRefuse(ObjectEntry* e, bool upsert) {
  const PendingWrite& w = *e->second.pending;
  if (now_ - w.started_ms < options_.put_timeout_ms) {
    if (upsert) {
      return Status(ErrorCode::kObjectBusy, "key '" + std::string(key_) +
                                                "' is being written by agent " +
                                                std::to_string(w.writer) + "; retry later");
    }
    return Status(ErrorCode::kObjectAlreadyExists,
                  "key '" + std::string(key_) + "' is being written by agent " +
                      std::to_string(w.writer) + " (treat as stored)");
  }
  if (!Allocate()) return NoSpace();
  LOG(INFO) << "agent " << req_.agent << " takes over the write of key '" << key_ << "' started "
            << (now_ - w.started_ms) << " ms ago by agent " << w.writer;
  const Object& o = e->second;
  TagId tag = (upsert && session_.empty()) ? (store_.tags().AddRef(o.tag), o.tag)
                                           : store_.tags().Acquire(session_);
  store_.TakeOverWrite(e, size_, &replicas_, MakePending(tag));
  return Status::Ok();
}

}  // namespace

uint64_t MasterService::MostReplicas(uint64_t size, uint8_t replica_count) const {
  const uint64_t part = std::max<uint64_t>(1, store_->part_bytes());
  return (size / part + (size % part != 0)) * std::max<uint64_t>(1, replica_count);
}

Status MasterService::CheckReplyRoom(size_t placed, uint64_t more, std::string_view key) {
  if (placed + more <= kMaxReplyPlacements) return Status::Ok();
  return InvalidParams("key '" + std::string(key) + "' does not fit this reply: it names " +
                       std::to_string(placed) + " replicas already, and " + std::to_string(more) +
                       " more would pass the " + std::to_string(kMaxReplyPlacements) +
                       " one reply may name; send the key in another call");
}

Status MasterService::CheckReplicaTotal(uint64_t size, uint8_t replica_count, std::string_view key,
                                        size_t placed) const {
  const uint64_t replicas = MostReplicas(size, replica_count);
  if (replicas > kMaxReplicasPerValue) {
    return InvalidParams("key '" + std::string(key) + "' of " + std::to_string(size) +
                         " bytes would have " + std::to_string(replicas) +
                         " replicas (its parts, at most the smallest pool's size each, times the "
                         "replica count); one value has at most " +
                         std::to_string(kMaxReplicasPerValue) + ": store it in smaller pieces");
  }
  return CheckReplyRoom(placed, replicas, key);
}

Status MasterService::StartOne(const WriteStartRequest& req, size_t i, bool upsert,
                               PlacementBatch* out) {
  KVAGENT_RETURN_IF_ERROR(CheckReplicaTotal(req.sizes[i], req.options.replica_count, req.keys[i],
                                            out->placements.size()));
  KeyStart start(*store_, options_, req, i, clock_->NowMs(), &scratch_replicas_, out);
  // One hash lookup: a new key gets its (still empty) entry right away.
  auto [e, fresh] = store_->FindOrInsert(req.keys[i]);
  KVAGENT_RETURN_IF_ERROR(start.RefuseAboveWatermark(e, fresh));
  Status status;
  if (fresh) {
    status = start.StartNew(e);
  } else if (e->second.readable && upsert) {
    status = start.Rewrite(e);
  } else if (e->second.readable) {
    return start.AlreadyStored();
  } else {
    status = start.TakeOverOrRefuse(e, upsert);
  }
  if (status.ok()) AppendPlacements(e->second, out);
  return status;
}

Status MasterService::BatchPutStart(const WriteStartRequest& request, PlacementBatch* out) {
  return WriteStart(request, /*upsert=*/false, out);
}

Status MasterService::BatchUpsertStart(const WriteStartRequest& request, PlacementBatch* out) {
  return WriteStart(request, /*upsert=*/true, out);
}

Status MasterService::FinishOne(const WriteEndRequest& req, size_t i, bool commit,
                                std::span<const uint32_t> checksums,
                                std::span<const FailedReplica> failed, KeyResults* out,
                                ObjectEntry* entry) {
  const std::string_view key = req.keys[i];
  const uint64_t write_id = req.write_ids.empty() ? 0 : req.write_ids[i];
  ObjectEntry* e = entry != nullptr ? entry : store_->Find(key);
  if (!e && write_id != 0 && commit) {
    // The write is unknown here: this master restarted before it was committed (in-flight
    // writes are not logged), or abandoned it. Nothing is stored; the writer may put again.
    return Status(ErrorCode::kMasterUnavailable,
                  "the write " + std::to_string(write_id) + " of key '" + std::string(key) +
                      "' is unknown to this master (it restarted before the write was "
                      "committed, or abandoned it); nothing was stored: put it again");
  }
  if (!e) return ObjectNotFound(key);
  Object& o = e->second;
  if (!o.pending) {
    if (write_id != 0 && o.version != write_id) {
      if (!commit) return Status::Ok();  // that write is gone already
      return Status(ErrorCode::kObjectNotFound,
                    "the write " + std::to_string(write_id) + " of key '" + std::string(key) +
                        "' was taken over or abandoned before it ended; its value is not stored");
    }
    if (commit) {  // ending twice is a no-op
      if (out)
        out->replicas.back() = static_cast<uint8_t>(
            std::min<uint32_t>(255, o.replica_total / std::max<uint32_t>(1, o.parts())));
      return Status::Ok();
    }
    return InvalidParams("key '" + std::string(key) +
                         "' was already ended; remove it instead of revoking");
  }
  if (o.pending->writer != req.agent) {
    if (write_id != 0 && o.pending->write_id != write_id) {
      if (!commit) return Status::Ok();
      return Status(ErrorCode::kObjectNotFound,
                    "the write " + std::to_string(write_id) + " of key '" + std::string(key) +
                        "' was taken over by agent " + std::to_string(o.pending->writer));
    }
    return InvalidParams("key '" + std::string(key) + "' is being written by agent " +
                         std::to_string(o.pending->writer) + "; only that agent may end it");
  }
  if (write_id != 0 && o.pending->write_id != write_id) {
    if (!commit) return Status::Ok();
    return Status(ErrorCode::kObjectNotFound,
                  "the write " + std::to_string(write_id) + " of key '" + std::string(key) +
                      "' was replaced by a newer one of this agent; its value is not stored");
  }
  if (!commit) {
    store_->AbortWrite(e);
    return Status::Ok();
  }
  const uint32_t parts = o.parts();
  if (!checksums.empty() && checksums.size() != parts) {
    return InvalidParams("key '" + std::string(key) + "' has " + std::to_string(parts) +
                         " part(s) but the End carries " + std::to_string(checksums.size()) +
                         " checksum(s)");
  }
  // Every part must keep a written replica. One pass over the replicas (each part has one at
  // least, so `parts` is at most replica_total).
  std::vector<uint32_t>& kept_of = scratch_kept_;
  kept_of.assign(parts, 0);
  for (uint32_t r = 0; r < o.replica_total; ++r) {
    const Replica& rep = o.replica(r);
    if (rep.part < parts && !NamesReplica(failed, rep.part, rep.pool_id)) ++kept_of[rep.part];
  }
  uint32_t fewest = 255;
  for (uint32_t p = 0; p < parts; ++p) {
    const uint32_t kept = kept_of[p];
    if (kept == 0) {
      return InvalidParams("no replica of part " + std::to_string(p) + " of key '" +
                           std::string(key) + "' was written; revoke the write instead");
    }
    fewest = std::min(fewest, kept);
  }
  if (!store_->CommitWrite(e, checksums, failed)) {
    // The commit cannot be logged: the write is abandoned (its writer learns nothing is
    // stored), and its space goes back once its pools fenced it.
    store_->AbortWrite(e);
    return store_->LogRefused();
  }
  if (out) out->replicas.back() = static_cast<uint8_t>(fewest);
  return Status::Ok();
}

// Checks the End's per-key arrays against its n keys and groups them: the checksums of key i
// are checksums_of(i), its failed replicas failed_of(i) (the work stays linear in the request).
Status MasterService::PrepareFinish(const WriteEndRequest& req, size_t n) {
  if (!req.write_ids.empty() && req.write_ids.size() != n) {
    return InvalidParams("write_ids has " + std::to_string(req.write_ids.size()) + " entries for " +
                         std::to_string(n) + " keys");
  }
  // Checksums: part_counts[i] of them per key, in key order.
  std::vector<uint32_t>& first_checksum = scratch_first_checksum_;
  first_checksum.clear();
  if (!req.part_counts.empty() || !req.checksums.empty()) {
    if (req.part_counts.size() != n) {
      return InvalidParams("part_counts has " + std::to_string(req.part_counts.size()) +
                           " entries for " + std::to_string(n) + " keys");
    }
    uint64_t total = 0;
    first_checksum.reserve(n + 1);
    for (uint32_t c : req.part_counts) {
      first_checksum.push_back(static_cast<uint32_t>(std::min<uint64_t>(total, UINT32_MAX)));
      total += c;
    }
    first_checksum.push_back(static_cast<uint32_t>(std::min<uint64_t>(total, UINT32_MAX)));
    if (total != req.checksums.size()) {
      return InvalidParams("part_counts add up to " + std::to_string(total) + " but " +
                           std::to_string(req.checksums.size()) + " checksums were sent");
    }
  }
  std::vector<FailedReplica>& failed = scratch_failed_;
  failed.assign(req.failed.begin(), req.failed.end());
  for (const FailedReplica& f : failed) {
    if (f.key >= n) {
      return InvalidParams("failed names key " + std::to_string(f.key) + " of " +
                           std::to_string(n));
    }
  }
  // By key, then part and pool (what NamesReplica looks up), each once.
  std::sort(failed.begin(), failed.end());
  failed.erase(std::unique(failed.begin(), failed.end()), failed.end());
  scratch_next_failed_ = 0;
  return Status::Ok();
}

std::span<const uint32_t> MasterService::ChecksumsOf(const WriteEndRequest& req, size_t i) const {
  const std::vector<uint32_t>& first = scratch_first_checksum_;
  if (first.empty()) return {};
  return req.checksums.subspan(first[i], first[i + 1] - first[i]);
}

std::span<const FailedReplica> MasterService::FailedOf(size_t i) {
  // Keys are visited in order, so one cursor walks the sorted list once.
  const std::vector<FailedReplica>& failed = scratch_failed_;
  size_t& next = scratch_next_failed_;
  while (next < failed.size() && failed[next].key < i) ++next;
  const size_t begin = next;
  while (next < failed.size() && failed[next].key == i) ++next;
  return std::span(failed).subspan(begin, next - begin);
}

Status MasterService::FinishWrites(const WriteEndRequest& req, bool commit, KeyResults* out) {
  out->Clear();
  const size_t n = req.keys.size();
  if (Status st = ValidateKeys(n, [&](size_t i) { return req.keys[i]; }); !st.ok()) {
    return RejectBatch(st, n, &out->results);
  }
  if (Status st = PrepareFinish(req, n); !st.ok()) return RejectBatch(st, n, &out->results);
  out->results.reserve(n);
  if (commit) {
    store_->ReserveEvents(n);
    out->replicas.reserve(n);
  }
  for (size_t i = 0; i < n; ++i) {
    if (commit) out->replicas.push_back(0);
    out->results.push_back(
        FinishOne(req, i, commit, ChecksumsOf(req, i), FailedOf(i), commit ? out : nullptr));
  }
  return store_->FlushLog();
}

Status MasterService::BatchPutEnd(const WriteEndRequest& request, KeyResults* out) {
  return FinishWrites(request, /*commit=*/true, out);
}

Status MasterService::BatchPutEnd(AgentId agent, std::span<const std::string_view> keys,
                                  KeyResults* out) {
  WriteEndRequest r;
  r.agent = agent;
  r.keys = keys;
  return FinishWrites(r, /*commit=*/true, out);
}

Status MasterService::BatchPutRevoke(AgentId agent, std::span<const std::string_view> keys,
                                     std::span<const uint64_t> write_ids, KeyResults* out) {
  WriteEndRequest r;
  r.agent = agent;
  r.keys = keys;
  r.write_ids = write_ids;
  return FinishWrites(r, /*commit=*/false, out);
}

Status MasterService::BatchPutRevoke(AgentId agent, std::span<const std::string_view> keys,
                                     KeyResults* out) {
  return BatchPutRevoke(agent, keys, {}, out);
}

Status MasterService::BatchUpsertEnd(const WriteEndRequest& request, KeyResults* out) {
  return FinishWrites(request, /*commit=*/true, out);
}

Status MasterService::BatchUpsertEnd(AgentId agent, std::span<const std::string_view> keys,
                                     KeyResults* out) {
  return BatchPutEnd(agent, keys, out);
}

Status MasterService::BatchUpsertRevoke(AgentId agent, std::span<const std::string_view> keys,
                                        std::span<const uint64_t> write_ids, KeyResults* out) {
  return BatchPutRevoke(agent, keys, write_ids, out);
}

Status MasterService::BatchUpsertRevoke(AgentId agent, std::span<const std::string_view> keys,
                                        KeyResults* out) {
  return BatchPutRevoke(agent, keys, {}, out);
}

}  // namespace kvagent::master

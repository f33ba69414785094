// MetadataStore: the object lifecycle transitions and the periodic work (leases, agent liveness,
// write expiry, fences, eviction). See metadata_store.h for the invariants.
//
// Write-ahead: a transition that must survive a restart first reserves room for its record in
// the operation log (ReserveLog), and only then changes memory; the record is appended right
// after and reaches the file before the request's reply (FlushLog). A refused reservation
// changes nothing.
#include <glog/logging.h>

#include <algorithm>
#include <cassert>

#include "metadata_store.h"

namespace kvagent::master {

ObjectEntry* MetadataStore::Find(std::string_view key) { return objects_.Find(key); }

void MetadataStore::Unlist(ObjectEntry* e) {
  if (!e->second.listed) return;
  if (e->second.pending) {
    writing_.Remove(e);
  } else {
    lru_.Remove(e);
  }
}

void MetadataStore::Erase(ObjectEntry* e) {
  Unlist(e);
  Object& o = e->second;
  if (o.readable) tags_.Unstored(o.tag, o.size);
  if (o.pending) tags_.Release(o.pending->tag);
  tags_.Release(o.tag);
  objects_.Erase(e);
}

std::pair<ObjectEntry*, bool> MetadataStore::FindOrInsert(std::string_view key) {
  return objects_.FindOrInsert(key);
}

void MetadataStore::EraseFresh(ObjectEntry* e) {
  assert(!e->second.readable && !e->second.pending && !e->second.listed);
  objects_.Erase(e);
}

void MetadataStore::CreateWrite(ObjectEntry* e, uint64_t size,
                                const std::vector<Placement>* replicas,
                                std::unique_ptr<PendingWrite> pending) {
  SetReplicas(e->second, size, replicas);
  e->second.pending = std::move(pending);
  writing_.PushBack(e);
}

bool MetadataStore::BeginRewrite(ObjectEntry* e, uint64_t size,
                                 const std::vector<Placement>* replicas,
                                 std::unique_ptr<PendingWrite> pending) {
  Object& o = e->second;
  assert(o.readable && !o.pending);
  if (!ReserveLog(RemovedRecordBytes(e->first), 1)) return false;
  EmitRemoved(*e);
  LogRemoved(e->first);
  if (o.listed) lru_.Remove(e);
  tags_.Unstored(o.tag, o.size);
  o.readable = false;
  if (replicas) {
    FreeReplicas(o);  // no reader holds them: the caller checked the lease
    SetReplicas(o, size, replicas);
  }
  o.pending = std::move(pending);
  writing_.PushBack(e);
  return true;
}

void MetadataStore::TakeOverWrite(ObjectEntry* e, uint64_t size,
                                  const std::vector<Placement>* replicas,
                                  std::unique_ptr<PendingWrite> pending) {
  Object& o = e->second;
  assert(o.pending);
  Fence(o.pending->write_id, {o.replica_data(), o.replica_total});
  writing_.Remove(e);
  tags_.Release(o.pending->tag);
  o.KeepReplicas(0);  // handed to the fence
  SetReplicas(o, size, replicas);
  o.pending = std::move(pending);
  writing_.PushBack(e);
  ++counters_.taken_over_puts;
}

bool MetadataStore::CommitWrite(ObjectEntry* e, std::span<const uint32_t> checksums,
                                std::span<const FailedReplica> failed) {
  Object& o = e->second;
  assert(o.pending && !o.readable);
  PendingWrite& w = *o.pending;
  // The replicas that stay get their part's checksum; those the writer could not write are
  // fenced. (Setting checksums before the log's answer is harmless: a refused commit leaves an
  // unreadable write whose replicas get their checksums again at the next End.)
  std::vector<Replica> dropped;
  uint32_t kept = 0;
  for (uint32_t i = 0; i < o.replica_total; ++i) {
    Replica& r = o.replica(i);
    if (NamesReplica(failed, r.part, r.pool_id)) {
      dropped.push_back(r);
      continue;
    }
    if (!checksums.empty()) r.checksum = checksums[r.part];
    if (kept != i) std::swap(o.replica(kept), r);
    ++kept;
  }
  const bool log = ShouldLog();
  if (log) {
    record_.clear();
    EncodeObject(e->first, o, w.tag, &w, {o.replica_data(), kept}, !checksums.empty(), &record_);
    if (!ReserveLog(record_.size(), 1)) return false;
  }
  writing_.Remove(e);
  if (!dropped.empty()) {
    Fence(w.write_id, dropped);
    o.KeepReplicas(kept);
  }
  tags_.Release(o.tag);
  o.tag = w.tag;  // the reference moves from the write to the object
  o.meta = std::move(w.meta);
  o.version = w.write_id;
  o.checksummed = !checksums.empty();
  o.replicas_per_part = w.options.replica_count;
  o.hard_pin = w.options.hard_pin;
  o.soft_pin = w.options.soft_pin;
  o.soft_pin_until_s = 0;
  if (o.soft_pin) {
    // A soft pin's lifetime starts when the object becomes readable (second resolution).
    const int64_t ttl =
        w.options.soft_pin_ttl_ms ? int64_t{w.options.soft_pin_ttl_ms} : options_.soft_pin_ttl_ms;
    o.soft_pin_until_s = static_cast<uint32_t>((now() + ttl + 999) / 1000);
  }
  o.pending.reset();
  o.readable = true;
  tags_.Stored(o.tag, o.size);
  if (!o.hard_pin) lru_.PushBack(e);
  if (log) AppendRecord();  // record_ holds the object as committed
  EmitStored(*e);
  return true;
}

// ---- reserved writes ------------------------------------------------------------------------

std::string MetadataStore::ReservedKey(uint64_t write_id) {
  std::string key(1, '\xFF');
  key.append(reinterpret_cast<const char*>(&write_id), sizeof(write_id));
  return key;
}

const ObjectEntry* MetadataStore::Reserve(Agent& writer, uint64_t size, uint8_t replica_count,
                                          int64_t now_ms) {
  std::vector<Placement>& replicas = scratch_placements_;
  replicas.clear();
  if (!TryAllocate(writer.id, size, replica_count, &replicas)) return nullptr;
  auto w = std::make_unique<PendingWrite>();
  w->writer = writer.id;
  w->write_id = NewWriteId();
  w->started_ms = now_ms;
  w->options.replica_count = replica_count;
  const uint64_t id = w->write_id;
  auto [e, fresh] = objects_.FindOrInsert(ReservedKey(id));
  assert(fresh);
  CreateWrite(e, size, &replicas, std::move(w));
  ++writer.reserved_writes;
  for (const Placement& p : replicas) writer.reserved_bytes += PoolAllocator::Rounded(p.length);
  ++counters_.writes_reserved;
  return e;
}

void MetadataStore::Unreserve(const ObjectEntry& r) {
  const Object& o = r.second;
  Agent* a = FindAgent(o.pending->writer);
  if (a == nullptr) return;  // dropped with its counts
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < o.replica_total; ++i) {
    bytes += PoolAllocator::Rounded(o.replica(i).length);
  }
  a->reserved_writes -= std::min<uint32_t>(a->reserved_writes, 1);
  a->reserved_bytes -= std::min(a->reserved_bytes, bytes);
}

void MetadataStore::BindReservation(ObjectEntry* r, ObjectEntry* e, uint64_t size) {
  Object& from = r->second;
  Object& o = e->second;
  assert(from.pending && IsReservedKey(r->first) && !o.readable && size <= from.size);
  Unreserve(*r);
  // The value fills the reserved parts in order; what it leaves is freed.
  std::vector<Replica>& kept = scratch_replicas_;
  kept.clear();
  uint64_t left = size;
  uint32_t part = UINT32_MAX;
  uint64_t part_length = 0;
  for (uint32_t i = 0; i < from.replica_total; ++i) {
    Replica rep = from.replica(i);
    if (rep.part != part) {
      part = rep.part;
      part_length = std::min<uint64_t>(rep.length, left);
      left -= part_length;
    }
    if (part_length == 0) {
      FreeReplica(rep);
      continue;
    }
    const uint64_t keep = PoolAllocator::Rounded(part_length);
    const uint64_t had = PoolAllocator::Rounded(rep.length);
    if (keep < had) {
      auto pool = pools_.find(rep.pool_id);
      if (pool != pools_.end()) FreeIn(pool->second, rep.offset + keep, had - keep);
    }
    rep.length = static_cast<uint32_t>(part_length);
    kept.push_back(rep);
  }
  if (o.pending) {
    // A write of another agent past the put timeout: taken over, as WriteStart would.
    Fence(o.pending->write_id, {o.replica_data(), o.replica_total});
    writing_.Remove(e);
    tags_.Release(o.pending->tag);
    o.pending.reset();
    o.KeepReplicas(0);  // handed to the fence
    ++counters_.taken_over_puts;
  }
  writing_.Remove(r);
  o.size = size;
  o.AssignReplicas(kept.data(), static_cast<uint32_t>(kept.size()));
  from.KeepReplicas(0);
  o.pending = std::move(from.pending);
  writing_.PushBack(e);
  objects_.Erase(r);  // untagged, unlisted, no pending write: nothing else to release
  ++counters_.reserved_commits;
}

void MetadataStore::AbortWrite(ObjectEntry* e) {
  Object& o = e->second;
  assert(o.pending && !o.readable);
  if (IsReservedKey(e->first)) {
    Unreserve(*e);
    ++counters_.reserved_returned;
  }
  Fence(o.pending->write_id, {o.replica_data(), o.replica_total});
  o.KeepReplicas(0);
  Erase(e);
}

bool MetadataStore::RemoveObject(ObjectEntry* e) {
  assert(e->second.readable);
  if (!ReserveLog(RemovedRecordBytes(e->first), 1)) return false;
  EmitRemoved(*e);
  LogRemoved(e->first);
  FreeReplicas(e->second);
  Erase(e);
  return true;
}

bool MetadataStore::DropReplica(ObjectEntry* e, uint32_t part, PoolId pool) {
  Object& o = e->second;
  assert(o.readable);
  uint32_t at = o.replica_total;
  uint32_t others = 0;  // replicas of the same part elsewhere
  for (uint32_t i = 0; i < o.replica_total; ++i) {
    if (o.replica(i).part != part) continue;
    if (o.replica(i).pool_id == pool) {
      at = i;
    } else {
      ++others;
    }
  }
  if (at == o.replica_total) return true;  // already gone
  if (others == 0) {
    if (!RemoveObject(e)) return false;
    ++counters_.bad_replicas;
    return true;
  }
  std::vector<Replica> kept;
  for (uint32_t i = 0; i < o.replica_total; ++i) {
    if (i != at) kept.push_back(o.replica(i));
  }
  if (ShouldLog()) {
    record_.clear();
    EncodeObject(e->first, o, o.tag, nullptr, kept, o.checksummed, &record_);
    if (!ReserveLog(record_.size(), 1)) return false;
  }
  FreeReplica(o.replica(at));
  o.AssignReplicas(kept.data(), static_cast<uint32_t>(kept.size()));
  if (ShouldLog()) AppendRecord();
  ++counters_.bad_replicas;
  return true;
}

Result<uint64_t> MetadataStore::ClearAll(bool force) {
  const int64_t t = now();
  std::vector<ObjectEntry*> doomed;
  uint64_t record_bytes = 0;
  objects_.ForEach([&](ObjectEntry& entry) {
    const Object& o = entry.second;
    if (o.readable && (force || o.lease_until_ms <= t)) {
      doomed.push_back(&entry);
      record_bytes += RemovedRecordBytes(entry.first);
    }
  });
  if (!ReserveLog(record_bytes, doomed.size())) return LogRefused();
  for (ObjectEntry* e : doomed) {
    LogRemoved(e->first);
    FreeReplicas(e->second);
    Erase(e);
  }
  if (!restoring_) {
    events_.emplace_back(events::AllBlocksCleared{});
    ++counters_.events_emitted;
  }
  // Whatever is still readable (leased, not forced) must be in the index again (room for an
  // event per object left, at most, reserved at once: see DropAgent).
  ReserveEvents(objects_.size());
  objects_.ForEach([&](const ObjectEntry& entry) {
    if (entry.second.readable) EmitStored(entry);
  });
  return static_cast<uint64_t>(doomed.size());
}

void MetadataStore::GrantLease(ObjectEntry* e, int64_t ttl_ms) {
  Object& o = e->second;
  o.lease_until_ms = std::max(o.lease_until_ms, now() + ttl_ms);
  if (o.listed) {
    lru_.Remove(e);
    lru_.PushBack(e);
  }
}

// ---- fences --------------------------------------------------------------------------------

void MetadataStore::Fence(uint64_t write_id, std::span<const Replica> replicas) {
  if (options_.writes_are_local) {
    for (const Replica& r : replicas) FreeReplica(r);
    return;
  }
  // One fence per pool agent holding a replica of the write.
  for (size_t i = 0; i < replicas.size(); ++i) {
    auto pool = pools_.find(replicas[i].pool_id);
    if (pool == pools_.end()) continue;  // its agent is gone, and its pool with it
    Agent& a = agents_.at(pool->second.agent);
    if (!a.fences.empty() && a.fences.back().write_id == write_id &&
        a.fences.back().seq == next_fence_seq_ - 1) {
      a.fences.back().replicas.push_back(replicas[i]);
    } else {
      a.fences.push_back(PendingFence{next_fence_seq_++, write_id, {replicas[i]}});
    }
  }
}

HeartbeatResult MetadataStore::Fences(Agent* a, uint64_t acked) {
  while (!a->fences.empty() && a->fences.front().seq <= acked) {
    for (const Replica& r : a->fences.front().replicas) FreeReplica(r);
    a->fences.pop_front();
  }
  HeartbeatResult out;
  out.known = true;
  out.fence_seq = next_fence_seq_ - 1;  // every fence of `a` listed below has a seq up to it
  // Every write that is neither in flight nor waiting for a fence is finished: its id is below
  // the watermark (ids grow in start order, and writing_ is in start order).
  out.write_watermark = writing_.head ? writing_.head->second.pending->write_id : next_write_id_;
  out.fenced_writes.reserve(a->fences.size());
  for (const PendingFence& f : a->fences) out.fenced_writes.push_back(f.write_id);
  return out;
}

// ---- liveness ------------------------------------------------------------------------------

// The most of one gap between Ticks the live clock counts: a quarter of the TTL at most, so a
// stall never eats much of an agent's TTL.
int64_t MetadataStore::TickCredit() const {
  return std::max<int64_t>(1, std::min(options_.max_tick_gap_ms, options_.agent_ttl_ms / 4));
}

int64_t MetadataStore::LiveNow() const {
  return live_ms_ + std::clamp<int64_t>(now() - live_mark_ms_, 0, TickCredit());
}

void MetadataStore::AdvanceLiveClock() {
  const int64_t t = now();
  const int64_t gap = t - live_mark_ms_;
  if (gap > TickCredit() && live_mark_ms_ != 0) {
    ++counters_.stalls_forgiven;
    LOG(WARNING) << "kvmaster did not run for " << gap
                 << " ms (stopped or starved of CPU); its agents are not blamed for silence "
                    "during that time";
  }
  live_ms_ += std::clamp<int64_t>(gap, 0, TickCredit());
  live_mark_ms_ = t;
}

void MetadataStore::Touch(Agent* a) {
  a->last_seen_live = LiveNow();
  if (a->suspect) {
    LOG(INFO) << "agent " << a->name << " (id " << a->id
              << ") is back: it keeps its pools and objects";
    SetSuspect(*a, false);
  }
}

void MetadataStore::SetSuspect(Agent& a, bool suspect) {
  if (a.suspect == suspect) return;
  a.suspect = suspect;
  suspects_ += suspect ? 1 : -1;
  if (suspect) ++counters_.agents_suspected;
  RefreshCandidates();
}

void MetadataStore::ExpireAgents() {
  const int64_t t = LiveNow();
  const int64_t dead_ms =
      options_.agent_dead_ms ? options_.agent_dead_ms : 12 * options_.agent_ttl_ms;
  std::vector<AgentId> dead;
  for (auto& [id, a] : agents_) {
    const int64_t silent = t - a.last_seen_live;
    if (silent > dead_ms) {
      dead.push_back(id);
    } else if (silent > options_.agent_ttl_ms && !a.suspect) {
      LOG(WARNING) << "agent " << a.name << " (id " << id << ") sent no heartbeat for " << silent
                   << " ms (TTL " << options_.agent_ttl_ms
                   << " ms): suspect — no new replicas go to it, its objects stay for up to "
                   << dead_ms << " ms of silence";
      SetSuspect(a, true);
    }
  }
  for (AgentId id : dead) {
    LOG(WARNING) << "agent " << agents_.at(id).name << " (id " << id << ") silent for "
                 << (t - agents_.at(id).last_seen_live) << " ms (dead timeout " << dead_ms
                 << " ms): dropping it";
    if (!DropAgent(id)) return;  // the log refuses; try again at the next tick
  }
}

void MetadataStore::ExpireWrites() {
  // writing_ is in start order, so the walk stops at the first write still in time.
  const int64_t t = now();
  while (writing_.head &&
         writing_.head->second.pending->started_ms + options_.put_release_timeout_ms <= t) {
    ObjectEntry* e = writing_.head;
    if (IsReservedKey(e->first)) {
      LOG(INFO) << "abandoning reserved write " << e->second.pending->write_id << " of agent "
                << e->second.pending->writer << ": not used within "
                << options_.put_release_timeout_ms << " ms";
    } else {
      LOG(WARNING) << "abandoning the write of key '" << e->first << "' by agent "
                   << e->second.pending->writer << ": not ended within "
                   << options_.put_release_timeout_ms << " ms";
    }
    ++counters_.timed_out_writes;
    AbortWrite(e);
  }
}

uint64_t MetadataStore::EvictTo(uint64_t target_bytes_used) {
  const int64_t t = now();
  uint64_t used = bytes_used();
  uint64_t evicted = 0;
  // Pass 0: unpinned (or soft pin expired) objects; pass 1: soft-pinned ones too.
  for (int pass = 0; pass < 2 && used > target_bytes_used; ++pass) {
    ObjectEntry* e = lru_.head;
    while (e && used > target_bytes_used) {
      ObjectEntry* next = e->second.next;
      const Object& o = e->second;
      const bool soft_pinned = SoftPinned(o);
      if (o.lease_until_ms <= t && (pass == 1 || !soft_pinned)) {
        uint64_t freed = 0;
        for (uint32_t r = 0; r < o.replica_total; ++r) {
          freed += PoolAllocator::Rounded(o.replica(r).length);
        }
        if (!RemoveObject(e)) break;  // the log refuses: evict nothing more now
        used -= std::min(used, freed);
        ++evicted;
      }
      e = next;
    }
  }
  counters_.evictions += evicted;
  if (evicted) VLOG(1) << "evicted " << evicted << " object(s)";
  return evicted;
}

void MetadataStore::EvictByWatermark() {
  const uint64_t capacity = bytes_capacity();
  if (capacity == 0) return;
  const double use = static_cast<double>(bytes_used()) / static_cast<double>(capacity);
  if (use <= options_.high_watermark) return;
  EvictTo(static_cast<uint64_t>(static_cast<double>(capacity) * options_.low_watermark));
}

MasterStats MetadataStore::stats() const {
  MasterStats s = counters_;
  s.keys = objects_.size() - writing_.size;
  s.writes_in_flight = writing_.size;
  s.bytes_used = bytes_used();
  s.bytes_capacity = bytes_capacity();
  s.agents = agents_.size();
  s.pools = pools_.size();
  s.session_tags = tags_.size();
  if (oplog_) {
    s.oplog_records = oplog_->records_appended();
    s.log_writable = oplog_->writable() ? 1 : 0;
    s.log_bytes = oplog_->file_bytes();
  }
  s.replication_last_seq = replication_.last_seq();
  s.suspect_agents = suspects_;
  for (const auto& [id, a] : agents_) {
    s.reserved_writes += a.reserved_writes;
    s.reserved_bytes += a.reserved_bytes;
    s.writes_in_flight -= std::min<uint64_t>(s.writes_in_flight, a.reserved_writes);
    s.pending_fences += a.fences.size();
    for (const PendingFence& f : a.fences) {
      for (const Replica& r : f.replicas) s.fenced_bytes += PoolAllocator::Rounded(r.length);
    }
  }
  return s;
}

}  // namespace kvagent::master

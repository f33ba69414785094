// MetadataStore: the object lifecycle transitions and the periodic work (leases, expiry,
// delayed release, eviction). See metadata_store.h for the invariants.
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

void MetadataStore::CreateWrite(ObjectEntry* e, uint64_t size, const std::vector<Replica>* replicas,
                                std::unique_ptr<PendingWrite> pending) {
  SetReplicas(e->second, size, replicas);
  e->second.pending = std::move(pending);
  writing_.PushBack(e);
}

void MetadataStore::BeginRewrite(ObjectEntry* e, uint64_t size,
                                 const std::vector<Replica>* replicas,
                                 std::unique_ptr<PendingWrite> pending) {
  Object& o = e->second;
  assert(o.readable && !o.pending);
  EmitRemoved(*e);
  LogRemoved(e->first);
  if (o.listed) lru_.Remove(e);
  o.readable = false;
  if (replicas) {
    FreeReplicas(o);  // no reader holds them: the caller checked the lease
    SetReplicas(o, size, replicas);
  }
  o.pending = std::move(pending);
  writing_.PushBack(e);
}

void MetadataStore::TakeOverWrite(ObjectEntry* e, uint64_t size,
                                  const std::vector<Replica>* replicas,
                                  std::unique_ptr<PendingWrite> pending) {
  Object& o = e->second;
  assert(o.pending);
  const int64_t release_at = o.pending->started_ms + options_.put_release_timeout_ms;
  for (uint32_t r = 0; r < o.replica_total; ++r) {
    discarded_.push_back(Discarded{o.replica(r), release_at});
  }
  writing_.Remove(e);
  tags_.Release(o.pending->tag);
  SetReplicas(o, size, replicas);
  o.pending = std::move(pending);
  writing_.PushBack(e);
  ++counters_.taken_over_puts;
}

void MetadataStore::CommitWrite(ObjectEntry* e) {
  Object& o = e->second;
  assert(o.pending && !o.readable);
  writing_.Remove(e);
  PendingWrite& w = *o.pending;
  tags_.Release(o.tag);
  o.tag = w.tag;  // the reference moves from the write to the object
  o.meta = std::move(w.meta);
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
  if (!o.hard_pin) lru_.PushBack(e);
  LogObject(*e);
  EmitStored(*e);
}

void MetadataStore::AbortWrite(ObjectEntry* e, bool writer_may_still_write) {
  Object& o = e->second;
  assert(o.pending && !o.readable);
  if (writer_may_still_write) {
    const int64_t release_at = o.pending->started_ms + options_.put_release_timeout_ms;
    for (uint32_t r = 0; r < o.replica_total; ++r) {
      discarded_.push_back(Discarded{o.replica(r), release_at});
    }
  } else {
    FreeReplicas(o);
  }
  Erase(e);
}

void MetadataStore::RemoveObject(ObjectEntry* e) {
  assert(e->second.readable);
  EmitRemoved(*e);
  LogRemoved(e->first);
  FreeReplicas(e->second);
  Erase(e);
}

uint64_t MetadataStore::ClearAll(bool force) {
  const int64_t t = now();
  std::vector<ObjectEntry*> doomed;
  objects_.ForEach([&](ObjectEntry& entry) {
    const Object& o = entry.second;
    if (o.readable && (force || o.lease_until_ms <= t)) doomed.push_back(&entry);
  });
  for (ObjectEntry* e : doomed) {
    LogRemoved(e->first);
    FreeReplicas(e->second);
    Erase(e);
  }
  if (!restoring_) {
    events_.emplace_back(events::AllBlocksCleared{});
    ++counters_.events_emitted;
  }
  // Whatever is still readable (leased, not forced) must be in the index again.
  objects_.ForEach([&](const ObjectEntry& entry) {
    if (entry.second.readable) EmitStored(entry);
  });
  return doomed.size();
}

void MetadataStore::GrantLease(ObjectEntry* e, int64_t ttl_ms) {
  Object& o = e->second;
  o.lease_until_ms = std::max(o.lease_until_ms, now() + ttl_ms);
  if (o.listed) {
    lru_.Remove(e);
    lru_.PushBack(e);
  }
}

// ---- periodic work -------------------------------------------------------------------------

void MetadataStore::ExpireAgents() {
  const int64_t t = now();
  std::vector<AgentId> expired;
  for (const auto& [id, a] : agents_) {
    if (t - a.last_seen_ms > options_.agent_ttl_ms) expired.push_back(id);
  }
  for (AgentId id : expired) {
    LOG(WARNING) << "agent " << agents_.at(id).name << " (id " << id << ") sent no heartbeat for "
                 << (t - agents_.at(id).last_seen_ms) << " ms (TTL " << options_.agent_ttl_ms
                 << " ms): dropping it";
    DropAgent(id);
  }
}

void MetadataStore::ExpireWrites() {
  // writing_ is in start order, so the walk stops at the first write still in time.
  const int64_t t = now();
  while (writing_.head &&
         writing_.head->second.pending->started_ms + options_.put_release_timeout_ms <= t) {
    ObjectEntry* e = writing_.head;
    LOG(WARNING) << "abandoning the write of key '" << e->first << "' by agent "
                 << e->second.pending->writer << ": not ended within "
                 << options_.put_release_timeout_ms << " ms";
    ++counters_.timed_out_writes;
    AbortWrite(e, /*writer_may_still_write=*/false);
  }
}

void MetadataStore::ReleaseDiscarded() {
  const int64_t t = now();
  std::erase_if(discarded_, [&](const Discarded& d) {
    if (d.release_at_ms > t) return false;
    auto it = segments_.find(d.replica.segment_id);
    if (it != segments_.end()) it->second.allocator.Free(d.replica.offset, d.replica.length);
    return true;
  });
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
        for (uint32_t r = 0; r < o.replica_total; ++r) {
          used -= std::min(used, SegmentAllocator::Rounded(o.replica(r).length));
        }
        RemoveObject(e);
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
  s.segments = segments_.size();
  s.session_tags = tags_.size();
  if (oplog_) s.oplog_records = oplog_->records_appended();
  s.replication_last_seq = replication_.last_seq();
  return s;
}

}  // namespace kvagent::master

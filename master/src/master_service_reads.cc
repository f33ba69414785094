// MasterService: reads, removal, listing, stats and periodic work.
#include <glog/logging.h>

#include <algorithm>

#include "kvagent/common/validate.h"
#include "kvagent/master/master_service.h"
#include "metadata_store.h"

namespace kvagent::master {

Status MasterService::BatchGet(std::span<const std::string_view> keys, PlacementBatch* out) {
  out->Clear();
  if (Status st = ValidateKeys(keys.size(), [&](size_t i) { return keys[i]; }); !st.ok()) {
    return RejectBatch(st, keys.size(), &out->results);
  }
  out->results.reserve(keys.size());
  out->sizes.reserve(keys.size());
  out->write_ids.reserve(keys.size());
  out->first.reserve(keys.size() + 1);
  out->lease_ttl_ms = static_cast<uint32_t>(options_.lease_ttl_ms);
  store_->FindEach(keys, [&](size_t i, ObjectEntry* e) {
    const std::string_view key = keys[i];
    out->first.push_back(static_cast<uint32_t>(out->placements.size()));
    if (!e) {
      out->results.push_back(
          Status(ErrorCode::kObjectNotFound, "key '" + std::string(key) + "' is not stored"));
      out->sizes.push_back(0);
      out->write_ids.push_back(0);
    } else if (!e->second.readable) {
      out->results.push_back(
          Status(ErrorCode::kReplicaNotReady,
                 "key '" + std::string(key) + "' is being written; retry after the write ends"));
      out->sizes.push_back(0);
      out->write_ids.push_back(0);
    } else if (Status room = CheckReplyRoom(out->placements.size(), e->second.replica_total, key);
               !room.ok()) {
      out->results.push_back(std::move(room));
      out->sizes.push_back(0);
      out->write_ids.push_back(0);
    } else {
      store_->GrantLease(e, options_.lease_ttl_ms);  // rule 6: reads never touch the tag
      store_->AppendReadPlacements(e->second, &out->placements);
      out->results.push_back(Status::Ok());
      out->sizes.push_back(e->second.size);
      out->write_ids.push_back(e->second.version);
    }
  });
  out->first.push_back(static_cast<uint32_t>(out->placements.size()));
  return Status::Ok();
}

Status MasterService::BatchExist(std::span<const std::string_view> keys, KeyResults* out) {
  out->Clear();
  if (Status st = ValidateKeys(keys.size(), [&](size_t i) { return keys[i]; }); !st.ok()) {
    return RejectBatch(st, keys.size(), &out->results);
  }
  out->results.assign(keys.size(), Status::Ok());
  out->exists.reserve(keys.size());
  store_->FindEach(keys, [&](size_t, const ObjectEntry* e) {
    out->exists.push_back(e && e->second.readable ? 1 : 0);
  });
  return Status::Ok();
}

Status MasterService::BatchRemove(std::span<const std::string_view> keys, bool force,
                                  KeyResults* out) {
  out->Clear();
  if (Status st = ValidateKeys(keys.size(), [&](size_t i) { return keys[i]; }); !st.ok()) {
    return RejectBatch(st, keys.size(), &out->results);
  }
  out->results.reserve(keys.size());
  const int64_t now = clock_->NowMs();
  for (std::string_view key : keys) {
    ObjectEntry* e = store_->Find(key);
    if (!e) {
      out->results.push_back(
          Status(ErrorCode::kObjectNotFound, "key '" + std::string(key) + "' is not stored"));
    } else if (!e->second.readable) {
      out->results.push_back(Status(
          ErrorCode::kReplicaNotReady,
          "key '" + std::string(key) + "' is being written; remove it after the write ends"));
    } else if (!force && e->second.lease_until_ms > now) {
      out->results.push_back(
          Status(ErrorCode::kObjectHasLease,
                 "key '" + std::string(key) + "' is being read (lease for another " +
                     std::to_string(e->second.lease_until_ms - now) + " ms); retry or use force"));
    } else if (!store_->RemoveObject(e)) {
      out->results.push_back(store_->LogRefused());
    } else {
      out->results.push_back(Status::Ok());
    }
  }
  return store_->FlushLog();
}

Result<uint64_t> MasterService::RemoveAll(bool force) {
  Result<uint64_t> removed = store_->ClearAll(force);
  if (!removed.ok()) return removed;
  LOG(INFO) << "RemoveAll" << (force ? " (force)" : "") << " removed " << *removed << " object(s)";
  KVAGENT_RETURN_IF_ERROR(store_->FlushLog());
  return removed;
}

Status MasterService::ReportBadReplicas(std::span<const BadReplica> replicas, KeyResults* out) {
  out->Clear();
  if (Status st = ValidateKeys(replicas.size(), [&](size_t i) { return replicas[i].key; });
      !st.ok()) {
    return RejectBatch(st, replicas.size(), &out->results);
  }
  out->results.reserve(replicas.size());
  for (const BadReplica& bad : replicas) {
    ObjectEntry* e = store_->Find(bad.key);
    if (e == nullptr || !e->second.readable || e->second.version != bad.version) {
      out->results.push_back(Status::Ok());  // that value is gone already
      continue;
    }
    LOG(WARNING) << "a reader found the replica of key '" << bad.key << "' part " << bad.part
                 << " in pool " << bad.pool_id << " corrupt (checksum mismatch): dropping it";
    out->results.push_back(store_->DropReplica(e, bad.part, bad.pool_id) ? Status::Ok()
                                                                         : store_->LogRefused());
  }
  return store_->FlushLog();
}

// The cursor is a hash value (ObjectTable::Scan): pages stay correct when the table grows or
// is rebuilt between them.
Status MasterService::ListKeys(uint64_t cursor, uint32_t limit, ListPage* out,
                               std::string_view prefix) const {
  out->keys.clear();
  out->restarted = false;
  if (limit == 0) limit = 1000;
  std::vector<ObjectEntry*> page;
  out->next_cursor = store_->objects().Scan(cursor, limit, &page);
  out->keys.reserve(page.size());
  for (const ObjectEntry* e : page) {
    const Object& o = e->second;
    if (!o.readable) continue;
    if (!prefix.empty() && !std::string_view(e->first).starts_with(prefix)) continue;
    out->keys.push_back(ListedKey{e->first, o.size, std::string(store_->tags().Name(o.tag)),
                                  store_->StoredEvent(*e), o.meta != nullptr});
  }
  return Status::Ok();
}

std::optional<MasterService::PoolView> MasterService::FindPool(PoolId id) const {
  const Pool* s = store_->FindPool(id);
  if (!s) return std::nullopt;
  const Agent* a = store_->FindAgent(s->agent);
  return PoolView{s->id, s->agent, a ? a->incarnation : 0, s->endpoints};
}

std::optional<std::string> MasterService::SessionOf(std::string_view key) const {
  const ObjectEntry* e = store_->Find(key);
  if (!e) return std::nullopt;
  return std::string(store_->tags().Name(e->second.tag));
}

bool MasterService::HasSessionTag(std::string_view session_id) const {
  return store_->tags().Contains(session_id);
}

void MasterService::SessionStats(std::string_view session_id, uint64_t cursor, uint32_t limit,
                                 std::vector<SessionUsage>* out, uint64_t* next_cursor) const {
  out->clear();
  *next_cursor = 0;
  if (!session_id.empty()) {
    const SessionTags::Usage u = store_->tags().UsageOf(session_id);
    out->push_back(SessionUsage{std::string(session_id), u.blocks, u.bytes});
    return;
  }
  std::vector<SessionTags::Usage> page;
  *next_cursor = store_->tags().Page(cursor, std::clamp<uint32_t>(limit, 1, kMaxListLimit), &page);
  out->reserve(page.size());
  for (const SessionTags::Usage& u : page) {
    out->push_back(SessionUsage{std::string(u.session_id), u.blocks, u.bytes});
  }
}

MasterStats MasterService::Stats() const {
  MasterStats s = store_->stats();
  s.bad_requests = bad_requests_;
  s.name_conflicts = name_conflicts_;
  s.agent_key_refusals = agent_key_refusals_;
  return s;
}

void MasterService::CountBadRequest() { ++bad_requests_; }

void MasterService::Tick() {
  store_->AdvanceLiveClock();
  store_->ExpireAgents();
  store_->ExpireWrites();
  store_->EvictByWatermark();
  store_->MaintainLog();
  store_->ExpireBuiltSnapshot();
  if (Status st = store_->FlushLog(); !st.ok()) LOG(ERROR) << st.ToString();
}

Status MasterService::Flush() { return store_->FlushLog(); }

Status MasterService::ReadReplication(uint64_t after_seq, uint64_t master_epoch, size_t max_bytes,
                                      ReplicationPage* out, bool background) {
  if (!store_->replicating()) {
    return InvalidParams(
        "this master keeps no records for standbys; start it with --replication-log-bytes > 0");
  }
  store_->ReadReplication(after_seq, master_epoch != epoch_, max_bytes, out, background);
  return Status::Ok();
}

bool MasterService::SnapshotBuilding() { return store_->SnapshotBuilding(); }

std::vector<events::KvEvent> MasterService::TakeEvents() { return store_->TakeEvents(); }

void MasterService::TakeEvents(std::vector<events::KvEvent>* out) { store_->TakeEvents(out); }

uint64_t MasterService::replication_last_seq() const { return store_->replication_last_seq(); }

}  // namespace kvagent::master

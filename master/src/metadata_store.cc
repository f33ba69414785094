#include "metadata_store.h"

#include <glog/logging.h>

#include <algorithm>
#include <cassert>

namespace kvagent::master {

std::unique_ptr<StoredBlockMeta> StoredBlockMeta::From(const BlockMetaView& view) {
  if (view.empty()) return nullptr;
  auto m = std::make_unique<StoredBlockMeta>();
  m->block_hashes.assign(view.block_hashes.begin(), view.block_hashes.end());
  m->parent_block_hash = view.parent_block_hash;
  m->token_ids.assign(view.token_ids.begin(), view.token_ids.end());
  m->block_size = view.block_size;
  if (view.lora_name) m->lora_name = std::string(*view.lora_name);
  return m;
}

void Object::AssignReplicas(const Replica* r, uint32_t n) {
  if (replica_total > 1) delete[] many_replicas;
  replica_total = n;
  if (n > 1) {
    many_replicas = new Replica[n];
    std::copy(r, r + n, many_replicas);
  } else {
    one_replica = n ? r[0] : Replica{};
  }
}

void Object::KeepReplicas(uint32_t n) {
  if (replica_total > 1 && n <= 1) {
    Replica* heap = many_replicas;
    one_replica = n ? heap[0] : Replica{};
    delete[] heap;
  }
  replica_total = n;
}

void ObjectList::PushBack(ObjectEntry* e) {
  Object& o = e->second;
  assert(!o.listed);
  o.prev = tail;
  o.next = nullptr;
  if (tail) tail->second.next = e;
  tail = e;
  if (!head) head = e;
  o.listed = true;
  ++size;
}

void ObjectList::Remove(ObjectEntry* e) {
  Object& o = e->second;
  assert(o.listed);
  if (o.prev) o.prev->second.next = o.next;
  if (o.next) o.next->second.prev = o.prev;
  if (head == e) head = o.next;
  if (tail == e) tail = o.prev;
  o.prev = o.next = nullptr;
  o.listed = false;
  --size;
}

MetadataStore::MetadataStore(const MasterOptions& options, const Clock* clock)
    : options_(options), clock_(clock) {
  RefreshPartBytes();
}

MetadataStore::~MetadataStore() {
  if (snapshot_build_ != nullptr) {
    snapshot_build_->child.reset();  // killed and waited for
    ::close(snapshot_build_->fd);
  }
  (void)FlushLog();
}

// ---- events --------------------------------------------------------------------------------

namespace {

std::vector<events::BlockHash> HashesOf(const ObjectEntry& e) {
  if (e.second.meta) return e.second.meta->block_hashes;
  std::vector<events::BlockHash> out;
  if (auto h = events::BlockHashFromKey(e.first)) out.push_back(*h);
  return out;
}

}  // namespace

// object_key is always sent: it is the identity Mooncake-style indexers keep, and the only one
// when neither the writer's metadata nor the key yield a hash.
void MetadataStore::EmitStored(const ObjectEntry& e) {
  if (restoring_) return;
  events_.emplace_back(StoredEvent(e));
  ++counters_.events_emitted;
}

events::BlockStored MetadataStore::StoredEvent(const ObjectEntry& e) const {
  events::BlockStored writer;
  if (const StoredBlockMeta* m = e.second.meta.get()) {
    writer.block_hashes = m->block_hashes;
    writer.parent_block_hash = m->parent_block_hash;
    writer.token_ids = m->token_ids;
    writer.block_size = m->block_size;
    writer.lora_name = m->lora_name;
  }
  return events::StoredEventFor(e.first, tags_.Name(e.second.tag), std::move(writer));
}

void MetadataStore::EmitRemoved(const ObjectEntry& e) {
  if (restoring_) return;
  events::BlockRemoved ev;
  ev.block_hashes = HashesOf(e);
  ev.object_key = e.first;
  events_.emplace_back(std::move(ev));
  ++counters_.events_emitted;
}

std::vector<events::KvEvent> MetadataStore::TakeEvents() {
  std::vector<events::KvEvent> out;
  out.swap(events_);
  // The next round emits about as many: room for them up front, so that appending never moves
  // the events already there (a regrowth moves every one of them).
  events_.reserve(out.size());
  return out;
}

Status MetadataStore::FlushLog() {
  if (!oplog_) return Status::Ok();
  counters_.oplog_records = oplog_->records_appended();
  Status st = oplog_->Flush();
  if (!st.ok()) FailStop(st);
  return st;
}

// ---- agents and pools -------------------------------------------------------------------

Status MetadataStore::LogRefused() const {
  return Status(ErrorCode::kMasterUnavailable,
                oplog_ ? oplog_->error() : std::string("the operation log refused the change"));
}

bool MetadataStore::ReserveLog(uint64_t payload_bytes, uint64_t records) {
  if (!oplog_ || restoring_ || snapshot_sink_) return true;
  if (oplog_->Reserve(payload_bytes, records)) return true;
  ++counters_.log_refusals;
  return false;
}

Result<AgentId> MetadataStore::AddAgent(std::string_view name, uint64_t incarnation, uint64_t key,
                                        uint64_t replaced, std::vector<uint64_t> replaced_earlier) {
  if (replaced_earlier.size() > kReplacedChain - 1) replaced_earlier.resize(kReplacedChain - 1);
  if (!ReserveLog(34 + 8 * replaced_earlier.size() + name.size(), 1)) return LogRefused();
  Agent a;
  a.id = next_agent_id_++;
  a.name = std::string(name);
  a.incarnation = incarnation;
  a.key = key;
  a.key_bound = true;
  a.replaced = replaced;
  a.replaced_earlier = std::move(replaced_earlier);
  a.last_seen_live = LiveNow();
  a.registered_here = true;
  LogAgent(a);
  AgentId id = a.id;
  agents_.emplace(id, std::move(a));
  return id;
}

Agent* MetadataStore::FindAgent(AgentId id) {
  auto it = agents_.find(id);
  return it == agents_.end() ? nullptr : &it->second;
}

const Agent* MetadataStore::FindAgent(AgentId id) const {
  auto it = agents_.find(id);
  return it == agents_.end() ? nullptr : &it->second;
}

Agent* MetadataStore::FindAgentByName(std::string_view name) {
  for (auto& [id, a] : agents_) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

void MetadataStore::RefreshPartBytes() {
  uint64_t smallest = 0;
  capacity_ = 0;
  for (auto& [id, s] : pools_) {
    if (smallest == 0 || s.allocator.size() < smallest) smallest = s.allocator.size();
    capacity_ += s.allocator.size();
  }
  part_bytes_ = options_.max_part_bytes;
  // A pool below the minimum (mounted by an older master, restored from its log) cannot
  // shrink the parts below it either.
  if (smallest > 0)
    part_bytes_ = std::min(part_bytes_, std::max(smallest, options_.min_pool_bytes));
  part_bytes_ = std::max<uint64_t>(part_bytes_, PoolAllocator::kAlignment);
  RefreshCandidates();
}

void MetadataStore::RefreshCandidates() {
  live_pools_.clear();
  live_pools_by_agent_.clear();
  for (auto& [id, s] : pools_) {
    s.slot = PlacementIndex::kNone;
    auto a = agents_.find(s.agent);
    if (a != agents_.end() && !a->second.suspect) {
      live_pools_.push_back(&s);
      live_pools_by_agent_.emplace_back(s.agent, &s);
    }
  }
  // By agent, then by pool id as live_pools_ (ties in placement go to the lower id).
  std::sort(live_pools_by_agent_.begin(), live_pools_by_agent_.end(),
            [](const auto& a, const auto& b) {
              return a.first != b.first ? a.first < b.first : a.second->id < b.second->id;
            });
  placement_.Reset(live_pools_);
}

namespace {

uint64_t PoolRecordBytes(const std::vector<std::string>& endpoints) {
  uint64_t n = 25;
  for (const std::string& ep : endpoints) n += 4 + ep.size();
  return n;
}

}  // namespace

Result<MountResult> MetadataStore::MountPool(AgentId agent_id, uint32_t index, uint64_t size,
                                             std::vector<std::string> endpoints) {
  Agent* agent = FindAgent(agent_id);
  if (!agent) {
    return Status(ErrorCode::kAgentUnavailable,
                  "agent " + std::to_string(agent_id) + " is not registered; register first");
  }
  for (PoolId pool_id : agent->pools) {
    Pool& s = pools_.at(pool_id);
    if (s.index != index) continue;
    if (s.allocator.size() != size / PoolAllocator::kAlignment * PoolAllocator::kAlignment) {
      // A different pool under the same index: its content is unknown, start it empty.
      const std::string name = agent->name;
      if (!DropAgent(agent_id)) return LogRefused();  // invalidates `agent`
      return Status(ErrorCode::kAgentUnavailable,
                    "pool " + std::to_string(index) + " of agent " + name +
                        " changed size; the agent was dropped: register again");
    }
    if (!ReserveLog(PoolRecordBytes(endpoints), 1)) return LogRefused();
    s.endpoints = std::move(endpoints);
    // What this master restored into the pool from its log, reported at the first mount after
    // it started; 0 on a later mount (a reconnect: the pool kept its objects, nothing was
    // restored). O(1): a scan of every object here held the serving loop ~8 ms per million
    // objects at every agent's reconnect.
    const uint64_t restored = s.restored_objects;
    s.restored_objects = 0;
    LogPool(s);
    return MountResult{pool_id, restored};
  }
  if (size < std::max(options_.min_pool_bytes, PoolAllocator::kAlignment)) {
    return InvalidParams("pool size " + std::to_string(size) + " is below the minimum of " +
                         std::to_string(options_.min_pool_bytes) +
                         " bytes; give the agent a larger --pool-size (at least 1MiB)");
  }
  if (size > kMaxPoolBytes) {
    return InvalidParams("pool size " + std::to_string(size) + " is above the maximum of " +
                         std::to_string(kMaxPoolBytes) + " bytes (256 TiB)");
  }
  if (capacity_ + size > kMaxClusterBytes) {
    return InvalidParams("pool size " + std::to_string(size) +
                         " would take the cluster's pools to " + "more than " +
                         std::to_string(kMaxClusterBytes) + " bytes");
  }
  if (!ReserveLog(PoolRecordBytes(endpoints), 1)) return LogRefused();
  Pool s{next_pool_id_++, agent_id, index, std::move(endpoints), PoolAllocator(size)};
  PoolId pool_id = s.id;
  LogPool(s);
  pools_.emplace(pool_id, std::move(s));
  agent->pools.push_back(pool_id);
  RefreshPartBytes();
  return MountResult{pool_id, 0};
}

const Pool* MetadataStore::FindPool(PoolId id) const {
  auto it = pools_.find(id);
  return it == pools_.end() ? nullptr : &it->second;
}

bool MetadataStore::DropAgent(AgentId id) {
  auto it = agents_.find(id);
  if (it == agents_.end()) return true;
  std::vector<PoolId> dropped = it->second.pools;
  auto on_dropped = [&](PoolId pool_id) {
    return std::find(dropped.begin(), dropped.end(), pool_id) != dropped.end();
  };
  // First find what goes, to reserve its records; then change things. One pass over the
  // objects, allocating only for those with a replica in a dropped pool (an agent's death must
  // not cost the loop an allocation per object of the whole table).
  std::vector<ObjectEntry*> touched;  // a replica in a dropped pool
  std::vector<ObjectEntry*> lost_readable;
  std::vector<ObjectEntry*> lost_writes;
  std::vector<bool> part_alive;  // of the object looked at, reused
  uint64_t record_bytes = 5;
  objects_.ForEach([&](ObjectEntry& entry) {
    Object& o = entry.second;
    bool in_dropped = false;
    for (uint32_t r = 0; r < o.replica_total && !in_dropped; ++r) {
      in_dropped = on_dropped(o.replica(r).pool_id);
    }
    if (in_dropped) touched.push_back(&entry);
    if (o.pending && o.pending->writer == id) {
      lost_writes.push_back(&entry);
      return;
    }
    if (!in_dropped) return;
    part_alive.assign(o.parts(), false);
    for (uint32_t r = 0; r < o.replica_total; ++r) {
      if (!on_dropped(o.replica(r).pool_id)) part_alive[o.replica(r).part] = true;
    }
    if (std::all_of(part_alive.begin(), part_alive.end(), [](bool b) { return b; })) return;
    if (o.readable) {
      lost_readable.push_back(&entry);
      record_bytes += RemovedRecordBytes(entry.first);
    } else {
      lost_writes.push_back(&entry);
    }
  });
  if (!ReserveLog(record_bytes, 1 + lost_readable.size())) return false;
  LOG(WARNING) << "dropping agent " << it->second.name << " (id " << id << ", " << dropped.size()
               << " pool(s)); its replicas are invalidated";
  // Replicas in the dropped pools go from every object that has one (the log needs no record
  // for that: replicas in pools of a dropped agent are filtered out when it is replayed).
  for (ObjectEntry* entry : touched) {
    Object& o = entry->second;
    uint32_t kept = 0;
    for (uint32_t r = 0; r < o.replica_total; ++r) {
      if (on_dropped(o.replica(r).pool_id)) continue;
      o.replica(kept++) = o.replica(r);
    }
    if (kept != o.replica_total) o.KeepReplicas(kept);
  }
  if (it->second.suspect) --suspects_;
  for (PoolId pool_id : dropped) pools_.erase(pool_id);
  agents_.erase(it);
  LogAgentDropped(id);
  RefreshPartBytes();
  // Freeing goes to pools that still exist only (FreeReplica skips dropped ones). The
  // removals were reserved above, and so is the room for their events: appended one at a time
  // to a vector that doubles, 250 000 of them took 3.4x the time (each regrowth moves every
  // event and touches new memory).
  ReserveEvents(lost_readable.size());
  for (ObjectEntry* e : lost_readable) {
    EmitRemoved(*e);
    LogRemoved(e->first);
    FreeReplicas(e->second);
    Erase(e);
  }
  for (ObjectEntry* e : lost_writes) AbortWrite(e);
  ++counters_.expired_agents;
  return true;
}

void MetadataStore::AppendReadPlacements(const Object& o, std::vector<Placement>* out) const {
  const size_t start = out->size();
  for (uint32_t i = 0; i < o.replica_total; ++i) {
    out->push_back(o.replica(i).ToPlacement(o.checksummed));
  }
  if (suspects_ == 0 || o.replicas_per_part < 2) return;
  // Within each part, replicas on suspect agents go last (a stable partition keeps parts
  // grouped and in order).
  auto healthy = [this](const Placement& p) {
    auto pool = pools_.find(p.pool_id);
    if (pool == pools_.end()) return false;
    const Agent* a = FindAgent(pool->second.agent);
    return a != nullptr && !a->suspect;
  };
  auto begin = out->begin() + static_cast<std::ptrdiff_t>(start);
  while (begin != out->end()) {
    auto end = std::find_if(begin, out->end(),
                            [part = begin->part](const Placement& p) { return p.part != part; });
    std::stable_partition(begin, end, healthy);
    begin = end;
  }
}

// ---- allocation ----------------------------------------------------------------------------

bool MetadataStore::TryAllocate(AgentId writer, uint64_t size, uint8_t replicas_per_part,
                                std::vector<Placement>* out) {
  const size_t mark = out->size();
  const uint64_t parts = size == 0 ? 1 : size / part_bytes_ + (size % part_bytes_ != 0);
  AgentId used[256];
  // The writer's own live pools (usually one).
  const auto own = std::equal_range(live_pools_by_agent_.begin(), live_pools_by_agent_.end(),
                                    std::pair<AgentId, Pool*>(writer, nullptr),
                                    [](const auto& a, const auto& b) { return a.first < b.first; });
  for (uint64_t p = 0; p < parts; ++p) {
    const uint64_t len = std::min(part_bytes_, size - p * part_bytes_);
    const uint64_t need = PoolAllocator::Rounded(len);
    int n_used = 0;
    for (int r = 0; r < replicas_per_part; ++r) {
      // The writer's own pool first (one local memcpy), then the pool with most free bytes,
      // never two replicas of a part on one agent. The first replica looks at the writer's
      // own pools alone when one of them fits: with many agents, the scan of every pool was
      // the master's largest cost per key (master_bench, 123 agents).
      Pool* best = nullptr;
      if (n_used == 0) {
        for (auto it = own.first; it != own.second; ++it) {
          Pool* s = it->second;
          if (s->allocator.largest_free() < need) continue;
          if (!best || s->allocator.free_bytes() > best->allocator.free_bytes()) best = s;
        }
      }
      // Else, and for every further replica, the live pool with most free bytes that fits, on
      // an agent this part does not use yet (a writer's own pool that could take the part was
      // taken above; one that could not cannot now). The placement index finds it in
      // O(log pools) where a scan of every pool cost O(pools) per replica.
      if (!best) {
        best = placement_.Best([&](const Pool& s) {
          return std::find(used, used + n_used, s.agent) == used + n_used &&
                 s.allocator.largest_free() >= need;
        });
      }
      if (!best) break;
      auto off = AllocateIn(*best, len);
      if (!off) break;
      used[n_used++] = best->agent;
      out->push_back(Placement{static_cast<uint32_t>(p), best->id, *off, len, 0, false});
    }
    if (n_used == 0) {
      for (size_t i = mark; i < out->size(); ++i) {
        const Placement& r = (*out)[i];
        FreeIn(pools_.at(r.pool_id), r.offset, r.length);
      }
      out->resize(mark);
      return false;
    }
  }
  return true;
}

bool MetadataStore::AllocateReplicas(AgentId writer, uint64_t size, uint8_t replicas_per_part,
                                     std::vector<Placement>* out) {
  if (TryAllocate(writer, size, replicas_per_part, out)) return true;
  // No room: evict down to the low watermark (and at least the bytes needed), retry once.
  const uint64_t capacity = bytes_capacity();
  const uint64_t used = bytes_used();
  if (size > capacity) return false;  // would not fit in an empty pool: evict nothing
  const uint64_t need = PoolAllocator::Rounded(size);
  uint64_t target = static_cast<uint64_t>(static_cast<double>(capacity) * options_.low_watermark);
  target = std::min(target, used > need ? used - need : 0);
  if (EvictTo(target) == 0) return false;
  return TryAllocate(writer, size, replicas_per_part, out);
}

uint64_t MetadataStore::bytes_used() const {
  uint64_t u = 0;
  for (const auto& [id, s] : pools_) u += s.allocator.used();
  return u;
}

uint64_t MetadataStore::bytes_capacity() const { return capacity_; }

void MetadataStore::FreeReplicas(const Object& o) {
  for (uint32_t r = 0; r < o.replica_total; ++r) FreeReplica(o.replica(r));
}

void MetadataStore::FreeReplica(const Replica& rep) {
  auto it = pools_.find(rep.pool_id);
  if (it != pools_.end()) FreeIn(it->second, rep.offset, rep.length);
}

std::optional<uint64_t> MetadataStore::AllocateIn(Pool& pool, uint64_t length) {
  auto offset = pool.allocator.Allocate(length);
  if (offset) placement_.Touched(pool.slot);
  return offset;
}

bool MetadataStore::AllocateAtIn(Pool& pool, uint64_t offset, uint64_t length) {
  if (!pool.allocator.AllocateAt(offset, length)) return false;
  placement_.Touched(pool.slot);
  return true;
}

void MetadataStore::FreeIn(Pool& pool, uint64_t offset, uint64_t length) {
  pool.allocator.Free(offset, length);
  placement_.Touched(pool.slot);
}

void MetadataStore::SetReplicas(Object& o, uint64_t size, const std::vector<Placement>* replicas) {
  o.size = size;
  scratch_replicas_.clear();
  for (const Placement& p : *replicas) scratch_replicas_.push_back(Replica::Of(p));
  o.AssignReplicas(scratch_replicas_.data(), static_cast<uint32_t>(scratch_replicas_.size()));
}

bool MetadataStore::SoftPinned(const Object& o) const {
  return o.soft_pin && int64_t{o.soft_pin_until_s} * 1000 > now();
}

}  // namespace kvagent::master

// MetadataStore: the operation-log records, replay at start and the compacting snapshot.
//
// Record types (first byte of the payload; fields in order, see oplog.h for the encoding):
//   1 agent        id u32, incarnation u64, name str, agent key u64 (the key is absent in
//                  records of builds before it was logged: such an agent binds its key when it
//                  registers again; an older build reads past the key)
//   2 pool         id u32, agent u32, index u32, size u64, endpoint count u32, endpoints str...
//   3 agent gone   id u32 (its pools go with it)
//   4 object (v1)  key str, size u64, session str, flags u8 (1 hard pin, 2 soft pin),
//                  replicas per part u8, soft pin ttl ms u64, block metadata, replica count u32,
//                  replicas (pool u32, part u32, offset u64, length u64)... (read only)
//   5 removed      key str
//   6 object       as 4, then version u64 after the block metadata, and each replica also
//                  carries its part's checksum u32 and a flags u8 (1: checksummed)
// Only committed state is logged: in-flight writes are not (their writers get OBJECT_NOT_FOUND
// at End after a restart and retry). Leases and LRU order are not persistent.
#include <glog/logging.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>

#include "kvagent/common/errno_text.h"
#include "kvagent/common/validate.h"
#include "metadata_store.h"

namespace kvagent::master {
namespace {

enum RecordType : uint8_t {
  kAgentRecord = 1,
  kPoolRecord = 2,
  kAgentGoneRecord = 3,
  kObjectRecordV1 = 4,
  kRemovedRecord = 5,
  kObjectRecord = 6,
};

void WriteHash(RecordWriter& w, const events::BlockHash& h) {
  w.U64(h.bits);
  w.U8(h.is_signed ? 1 : 0);
}

events::BlockHash ReadHash(RecordReader& r) {
  events::BlockHash h;
  h.bits = r.U64();
  h.is_signed = r.U8() != 0;
  return h;
}

void WriteMeta(RecordWriter& w, const StoredBlockMeta* m) {
  w.U8(m ? 1 : 0);
  if (!m) return;
  w.U32(static_cast<uint32_t>(m->block_hashes.size()));
  for (const auto& h : m->block_hashes) WriteHash(w, h);
  w.U8(m->parent_block_hash ? 1 : 0);
  if (m->parent_block_hash) WriteHash(w, *m->parent_block_hash);
  w.U32(static_cast<uint32_t>(m->token_ids.size()));
  for (uint32_t t : m->token_ids) w.U32(t);
  w.U32(m->block_size);
  w.U8(m->lora_name ? 1 : 0);
  if (m->lora_name) w.Str(*m->lora_name);
}

std::unique_ptr<StoredBlockMeta> ReadMeta(RecordReader& r) {
  if (r.U8() == 0) return nullptr;
  auto m = std::make_unique<StoredBlockMeta>();
  uint32_t n = r.U32();
  for (uint32_t i = 0; i < n && r.ok(); ++i) m->block_hashes.push_back(ReadHash(r));
  if (r.U8()) m->parent_block_hash = ReadHash(r);
  n = r.U32();
  for (uint32_t i = 0; i < n && r.ok(); ++i) m->token_ids.push_back(r.U32());
  m->block_size = r.U32();
  if (r.U8()) m->lora_name = std::string(r.Str());
  return m;
}

}  // namespace

void MetadataStore::LogAgent(const Agent& a) {
  if (!ShouldLog()) return;
  record_.clear();
  RecordWriter w(&record_);
  w.U8(kAgentRecord);
  w.U32(a.id);
  w.U64(a.incarnation);
  w.Str(a.name);
  if (a.key_bound) {  // fields of later builds follow, in order (older builds read past them)
    w.U64(a.key);
    w.U64(a.replaced);
    w.U8(static_cast<uint8_t>(a.replaced_earlier.size()));
    for (uint64_t inc : a.replaced_earlier) w.U64(inc);
  }
  AppendRecord();
}

void MetadataStore::LogPool(const Pool& s) {
  if (!ShouldLog()) return;
  record_.clear();
  RecordWriter w(&record_);
  w.U8(kPoolRecord);
  w.U32(s.id);
  w.U32(s.agent);
  w.U32(s.index);
  w.U64(s.allocator.size());
  w.U32(static_cast<uint32_t>(s.endpoints.size()));
  for (const auto& ep : s.endpoints) w.Str(ep);
  AppendRecord();
}

void MetadataStore::LogAgentDropped(AgentId id) {
  if (!ShouldLog()) return;
  record_.clear();
  RecordWriter w(&record_);
  w.U8(kAgentGoneRecord);
  w.U32(id);
  AppendRecord();
}

// The largest object record EncodeObject makes: key, session, options, block metadata (hashes of
// 9 bytes, a parent, token IDs, LoRA name) and the replicas (29 bytes each), each at its limit.
// Replay must read it back: a longer record would look damaged.
constexpr uint64_t kMaxObjectRecordBytes = 64 + kMaxKeyBytes + kMaxSessionIdBytes +
                                           9 * (kMaxBlockHashes + 1) + 4 * kMaxBlockTokens +
                                           kMaxLoraNameBytes + 29 * kMaxReplicasPerValue;
static_assert(kMaxObjectRecordBytes <= OpLog::kMaxRecordBytes);

// The object record of `o` as it is, or (with `w`) as it will be once write `w` commits.
void MetadataStore::EncodeObject(std::string_view key, const Object& o, TagId tag,
                                 const PendingWrite* w, std::span<const Replica> replicas,
                                 bool checksummed, std::string* out) const {
  RecordWriter rw(out);
  rw.U8(kObjectRecord);
  rw.Str(key);
  rw.U64(o.size);
  rw.Str(tags_.Name(tag));
  if (w) {
    const int64_t ttl =
        w->options.soft_pin_ttl_ms ? int64_t{w->options.soft_pin_ttl_ms} : options_.soft_pin_ttl_ms;
    rw.U8((w->options.hard_pin ? 1 : 0) | (w->options.soft_pin ? 2 : 0));
    rw.U8(w->options.replica_count);
    rw.U64(w->options.soft_pin ? static_cast<uint64_t>(ttl) : 0);
    WriteMeta(rw, w->meta.get());
    rw.U64(w->write_id);
  } else {
    rw.U8((o.hard_pin ? 1 : 0) | (o.soft_pin ? 2 : 0));
    rw.U8(o.replicas_per_part);
    rw.U64(static_cast<uint64_t>(std::max<int64_t>(0, int64_t{o.soft_pin_until_s} * 1000 - now())));
    WriteMeta(rw, o.meta.get());
    rw.U64(o.version);
  }
  rw.U32(static_cast<uint32_t>(replicas.size()));
  for (const Replica& r : replicas) {
    rw.U32(r.pool_id);
    rw.U32(r.part);
    rw.U64(r.offset);
    rw.U64(r.length);
    rw.U32(r.checksum);
    rw.U8(checksummed ? 1 : 0);
  }
}

void MetadataStore::LogObject(const ObjectEntry& e) {
  if (!ShouldLog()) return;
  record_.clear();
  EncodeObject(e.first, e.second, e.second.tag, nullptr,
               {e.second.replica_data(), e.second.replica_total}, e.second.checksummed, &record_);
  AppendRecord();
}

void MetadataStore::LogRemoved(std::string_view key) {
  if (!ShouldLog()) return;
  record_.clear();
  RecordWriter w(&record_);
  w.U8(kRemovedRecord);
  w.Str(key);
  AppendRecord();
}

// ---- records read back: parsed and checked first (state-free), then applied ------------------

struct AgentRecord {
  AgentId id = 0;
  uint64_t incarnation = 0;
  std::string_view name;
  std::optional<uint64_t> key;
  uint64_t replaced = 0;                   // records written before it: none known
  std::vector<uint64_t> replaced_earlier;  // the same
};

struct PoolRecord {
  PoolId id = 0;
  AgentId agent = 0;
  uint32_t index = 0;
  uint64_t size = 0;
  std::vector<std::string> endpoints;
};

struct ObjectRecord {
  std::string_view key;
  uint64_t size = 0;
  std::string_view session;
  uint8_t flags = 0;
  uint8_t replicas_per_part = 0;
  uint64_t soft_left_ms = 0;
  std::unique_ptr<StoredBlockMeta> meta;
  uint64_t version = 0;
  std::vector<Replica> replicas;
  bool checksummed = false;
};

struct ParsedRecord {
  uint8_t type = 0;
  AgentRecord agent;
  PoolRecord pool;
  AgentId gone = 0;
  std::string_view removed;
  ObjectRecord object;
};

namespace {

bool ReadAgent(RecordReader& r, AgentRecord* out) {
  out->id = r.U32();
  out->incarnation = r.U64();
  out->name = r.Str();
  if (r.ok() && r.remaining() > 0) out->key = r.U64();
  if (r.ok() && r.remaining() >= 8) out->replaced = r.U64();
  if (r.ok() && r.remaining() >= 1) {
    const uint8_t n = r.U8();
    if (n > r.remaining() / 8) return false;  // each takes 8 bytes: a count beyond is damage
    out->replaced_earlier.resize(n);
    for (uint64_t& inc : out->replaced_earlier) inc = r.U64();
    // A later build may keep a longer chain: the newest are kept.
    if (n > MetadataStore::kReplacedChain - 1) {
      out->replaced_earlier.resize(MetadataStore::kReplacedChain - 1);
    }
  }
  return r.ok();
}

bool ReadPool(RecordReader& r, PoolRecord* out) {
  out->id = r.U32();
  out->agent = r.U32();
  out->index = r.U32();
  out->size = r.U64();
  const uint32_t count = r.U32();
  // Each endpoint takes at least its 4-byte length: a count beyond what is left is damage.
  if (!r.ok() || count > r.remaining() / 4) return false;
  out->endpoints.resize(count);
  for (auto& ep : out->endpoints) ep = std::string(r.Str());
  return r.ok();
}

Status ReadObject(RecordReader& r, bool v2, ObjectRecord* out) {
  out->key = r.Str();
  out->size = r.U64();
  out->session = r.Str();
  out->flags = r.U8();
  out->replicas_per_part = r.U8();
  out->soft_left_ms = r.U64();
  out->meta = ReadMeta(r);
  out->version = v2 ? r.U64() : 0;
  const uint32_t n = r.U32();
  // Each replica takes at least 24 bytes: a count beyond what is left is damage, not a size.
  if (!r.ok() || n > r.remaining() / 24) return Internal("malformed object record");
  out->replicas.resize(n);
  for (Replica& rep : out->replicas) {
    rep.pool_id = r.U32();
    rep.part = r.U32();
    rep.offset = r.U64();
    const uint64_t length = r.U64();
    if (length > kMaxPartBytes) return Internal("malformed object record (part length)");
    rep.length = static_cast<uint32_t>(length);
    if (v2) {
      rep.checksum = r.U32();
      out->checksummed = (r.U8() & 1) != 0;
    }
  }
  if (!r.ok() || !IsValidUtf8(out->session) || !IsValidUtf8(out->key) || out->key.empty()) {
    return Internal("malformed object record");
  }
  // Parts are numbered from 0 and the replicas ordered by part (Object::parts): a part number
  // beyond that is damage, and would otherwise size the restore's per-part state (up to 2^32).
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t part = out->replicas[i].part;
    const uint32_t before = i == 0 ? 0 : out->replicas[i - 1].part;
    const bool next = i > 0 && part == before + 1;
    if (part != before && !next) {
      return Internal("malformed object record (replica " + std::to_string(i) + " of part " +
                      std::to_string(part) + " after part " + std::to_string(before) + ")");
    }
  }
  return Status::Ok();
}

// Reads every field of a record and checks what can be checked without the state it applies to.
Status ParseRecord(std::string_view payload, ParsedRecord* out) {
  RecordReader r(payload);
  out->type = r.U8();
  bool parsed = false;
  switch (out->type) {
    case kAgentRecord:
      parsed = ReadAgent(r, &out->agent);
      break;
    case kPoolRecord:
      parsed = ReadPool(r, &out->pool);
      break;
    case kAgentGoneRecord:
      out->gone = r.U32();
      parsed = r.ok();
      break;
    case kObjectRecordV1:
    case kObjectRecord:
      return ReadObject(r, out->type == kObjectRecord, &out->object);
    case kRemovedRecord:
      out->removed = r.Str();
      parsed = r.ok();
      break;
    default:
      break;
  }
  if (parsed) return Status::Ok();
  return Internal("malformed record of type " + std::to_string(out->type));
}

}  // namespace

Status MetadataStore::CheckRecord(std::string_view payload) {
  ParsedRecord record;
  return ParseRecord(payload, &record);
}

Status MetadataStore::ApplyRecord(std::string_view payload) {
  ParsedRecord record;
  KVAGENT_RETURN_IF_ERROR(ParseRecord(payload, &record));
  switch (record.type) {
    case kAgentRecord:
      ApplyAgent(record.agent);
      break;
    case kPoolRecord:
      ApplyPool(record.pool);
      break;
    case kAgentGoneRecord:
      ApplyAgentGone(record.gone);
      break;
    case kRemovedRecord:
      ApplyRemoved(record.removed);
      break;
    default:  // the two object records (ParseRecord refuses every other type)
      ApplyObject(record.object);
      break;
  }
  return Status::Ok();
}

void MetadataStore::ApplyAgent(const AgentRecord& record) {
  Agent a;
  a.id = record.id;
  a.incarnation = record.incarnation;
  a.name = std::string(record.name);
  a.key = record.key.value_or(0);
  a.key_bound = record.key.has_value();
  a.replaced = record.replaced;
  a.replaced_earlier = record.replaced_earlier;
  next_agent_id_ = std::max(next_agent_id_, a.id + 1);
  agents_[a.id] = std::move(a);
}

void MetadataStore::ApplyPool(PoolRecord& record) {
  auto a = agents_.find(record.agent);
  if (a == agents_.end()) return;  // agent gone: ignore
  next_pool_id_ = std::max(next_pool_id_, record.id + 1);
  auto it = pools_.find(record.id);
  if (it != pools_.end()) {
    it->second.endpoints = std::move(record.endpoints);
  } else {
    pools_.emplace(record.id, Pool{record.id, record.agent, record.index,
                                   std::move(record.endpoints), PoolAllocator(record.size)});
    a->second.pools.push_back(record.id);
  }
}

void MetadataStore::ApplyAgentGone(AgentId id) {
  auto a = agents_.find(id);
  if (a == agents_.end()) return;
  for (PoolId pool_id : a->second.pools) pools_.erase(pool_id);
  agents_.erase(a);
}

void MetadataStore::ApplyRemoved(std::string_view key) {
  if (ObjectEntry* old = objects_.Find(key)) {
    tags_.Unstored(old->second.tag, old->second.size);
    tags_.Release(old->second.tag);
    objects_.Erase(old);
  }
}

void MetadataStore::ApplyObject(ObjectRecord& record) {
  ApplyRemoved(record.key);
  Object& o = objects_.FindOrInsert(record.key).first->second;
  o.size = record.size;
  o.version = record.version;
  o.hard_pin = record.flags & 1;
  o.soft_pin = (record.flags & 2) != 0;
  o.replicas_per_part = record.replicas_per_part;
  if (o.soft_pin) {
    // What the record says is left, within what the field can hold (a damaged or hostile
    // record may say anything up to 2^64 - 1 ms).
    constexpr uint64_t kMaxLeftMs = uint64_t{UINT32_MAX} * 1000;
    const int64_t until_ms =
        now() + static_cast<int64_t>(std::min(record.soft_left_ms, kMaxLeftMs));
    o.soft_pin_until_s =
        static_cast<uint32_t>(std::min<int64_t>((until_ms + 999) / 1000, UINT32_MAX));
  }
  o.meta = std::move(record.meta);
  o.checksummed = record.checksummed;
  o.AssignReplicas(record.replicas.data(), static_cast<uint32_t>(record.replicas.size()));
  o.readable = true;
  o.tag = tags_.Acquire(record.session);
  tags_.Stored(o.tag, o.size);
  next_write_id_ = std::max(next_write_id_, record.version + 1);
}

// Re-reserves every restored replica in its pool; replicas whose pool is gone (or that
// overlap, which only a damaged log could produce) are dropped, and objects left without a
// replica of some part with them.
void MetadataStore::FinishRestore() {
  std::vector<ObjectEntry*> lost;
  objects_.ForEach([&](ObjectEntry& entry) {
    Object& o = entry.second;
    uint32_t kept = 0;
    const uint32_t parts = o.parts();
    std::vector<bool> part_alive(parts, false);
    for (uint32_t i = 0; i < o.replica_total; ++i) {
      const Replica rep = o.replica(i);
      auto it = pools_.find(rep.pool_id);
      if (it == pools_.end() || rep.part >= parts) continue;
      if (!AllocateAtIn(it->second, rep.offset, rep.length)) continue;
      part_alive[rep.part] = true;
      o.replica(kept++) = rep;
    }
    o.KeepReplicas(kept);
    if (parts == 0 ||
        !std::all_of(part_alive.begin(), part_alive.end(), [](bool b) { return b; })) {
      lost.push_back(&entry);
    }
  });
  for (ObjectEntry* e : lost) {
    FreeReplicas(e->second);
    tags_.Unstored(e->second.tag, e->second.size);
    tags_.Release(e->second.tag);
    objects_.Erase(e);
  }
  if (!lost.empty()) LOG(WARNING) << lost.size() << " restored object(s) lost their pools";
  objects_.ForEach([&](ObjectEntry& entry) {
    const Object& o = entry.second;
    if (!o.hard_pin) lru_.PushBack(&entry);
    // Each pool the object has a replica in counts it once (replicas are ordered by part).
    for (uint32_t i = 0; i < o.replica_total; ++i) {
      const PoolId pool = o.replica(i).pool_id;
      bool seen = false;
      for (uint32_t j = 0; j < i && !seen; ++j) seen = o.replica(j).pool_id == pool;
      auto it = seen ? pools_.end() : pools_.find(pool);
      if (it != pools_.end()) ++it->second.restored_objects;
    }
  });
  // Write ids go on far past the predecessor's: it may have started writes the log never saw
  // (in flight when it stopped), and a resent End of one of them must not match a new write
  // that got the same id here (it would be answered OK for another writer's bytes).
  next_write_id_ += kWriteIdGapAfterRestore;
  // Restored agents are suspect until they register again: nothing is placed in their pools
  // before they have fenced this master's predecessor's writes (a new master epoch), and they
  // have the dead timeout to come back.
  for (auto& [id, a] : agents_) {
    a.last_seen_live = LiveNow();
    if (!a.suspect) {
      a.suspect = true;
      ++suspects_;
    }
  }
  RefreshPartBytes();
}

bool MetadataStore::ShouldLog() const {
  return snapshot_sink_ != nullptr || ((oplog_ || replication_.enabled()) && !restoring_);
}

void MetadataStore::AppendRecord() {
  if (snapshot_sink_) {
    (*snapshot_sink_)(record_);
    return;
  }
  if (oplog_) oplog_->Append(record_);
  replication_.Append(record_);
}

void MetadataStore::ReadReplication(uint64_t after_seq, bool snapshot, size_t max_bytes,
                                    ReplicationPage* out, bool background) {
  out->records.clear();
  out->shared = {};
  out->shared_owner.reset();
  out->pending = false;
  out->snapshot = snapshot || !replication_.Covers(after_seq);
  if (!out->snapshot) {
    out->last_seq = replication_.ReadAfter(after_seq, max_bytes, &out->records);
    return;
  }
  if (background) {
    if (TakeBuiltSnapshot(out)) return;
    if (!snapshot_on_loop_ && (snapshot_build_ != nullptr || StartSnapshotBuild())) {
      out->pending = true;
      return;
    }
    snapshot_on_loop_ = false;
  }
  // The state after the newest record, as the records that rebuild it.
  out->last_seq = replication_.last_seq();
  const std::function<void(std::string_view)> sink = [out](std::string_view payload) {
    AppendFramedRecord(payload, &out->records);
  };
  snapshot_sink_ = &sink;
  WriteSnapshot();
  snapshot_sink_ = nullptr;
}

bool MetadataStore::StartSnapshotBuild() {
  const int fd = ::memfd_create("kvmaster-follower-snapshot", MFD_CLOEXEC);
  if (fd < 0) {
    LOG(WARNING) << "cannot build a follower's snapshot in the background (memfd_create: "
                 << ErrnoText(errno) << "); building it on the loop";
    return false;
  }
  auto child = ForkedWriter::Start(
      fd,
      [this](int out_fd) {
        std::string out;
        int failed = 0;
        const std::function<void(std::string_view)> sink = [&](std::string_view payload) {
          AppendFramedRecord(payload, &out);
          if (out.size() >= (1u << 20) && failed == 0) {
            failed = ForkedWriter::WriteAll(out_fd, out);
            out.clear();
          }
        };
        snapshot_sink_ = &sink;
        WriteSnapshot();
        snapshot_sink_ = nullptr;
        return failed != 0 ? failed : ForkedWriter::WriteAll(out_fd, out);
      },
      "building a follower's snapshot");
  if (!child.ok()) {
    ::close(fd);
    LOG(WARNING) << child.status().message() << "; building it on the loop";
    return false;
  }
  snapshot_build_ = std::make_unique<SnapshotBuild>();
  snapshot_build_->child = std::move(child.value());
  snapshot_build_->fd = fd;
  snapshot_build_->last_seq = replication_.last_seq();
  LOG(INFO) << "building a follower's snapshot of " << objects_.size()
            << " object(s) in the background (process " << snapshot_build_->child->pid() << ")";
  return true;
}

bool MetadataStore::SnapshotBuilding() {
  if (snapshot_build_ == nullptr) return false;
  Status st;
  if (!snapshot_build_->child->Done(&st)) return true;
  std::unique_ptr<SnapshotBuild> build = std::move(snapshot_build_);
  auto built = std::make_shared<BuiltSnapshot>();
  built->last_seq = build->last_seq;
  built->built_ms = now();
  struct stat file {};
  if (st.ok() && ::fstat(build->fd, &file) != 0) {
    st = Internal("cannot stat the snapshot's memfd: " + ErrnoText(errno));
  }
  if (st.ok() && file.st_size > 0) {
    // Mapped, not copied: a copy into fresh memory costs the loop far more (~2 ms per MiB
    // measured on the development VM) than the page tables of a populated mapping.
    void* map = ::mmap(nullptr, static_cast<size_t>(file.st_size), PROT_READ,
                       MAP_SHARED | MAP_POPULATE, build->fd, 0);
    if (map == MAP_FAILED) {
      st = Internal("cannot map the snapshot's memfd: " + ErrnoText(errno));
    } else {
      built->map = static_cast<const char*>(map);
      built->size = static_cast<size_t>(file.st_size);
    }
  }
  ::close(build->fd);
  if (!st.ok()) {
    LOG(WARNING) << st.message() << "; the next follower's snapshot is built on the loop";
    snapshot_on_loop_ = true;
    return false;
  }
  LOG(INFO) << "a follower's snapshot is built: " << built->size
            << " bytes, the state after record " << built->last_seq;
  built_snapshot_ = std::move(built);
  return false;
}

MetadataStore::BuiltSnapshot::~BuiltSnapshot() {
  if (map != nullptr) ::munmap(const_cast<char*>(map), size);
}

bool MetadataStore::TakeBuiltSnapshot(ReplicationPage* out) {
  (void)SnapshotBuilding();
  if (built_snapshot_ == nullptr) return false;
  if (!replication_.Covers(built_snapshot_->last_seq)) {
    built_snapshot_.reset();  // a follower could not continue from it: a newer one is needed
    return false;
  }
  out->last_seq = built_snapshot_->last_seq;
  // A view (valid until the next call): never a null one, which bytes() takes for none.
  static constexpr char kEmpty[1] = {};
  out->shared = built_snapshot_->map != nullptr
                    ? std::string_view(built_snapshot_->map, built_snapshot_->size)
                    : std::string_view(kEmpty, 0);
  out->shared_owner = built_snapshot_;
  return true;
}

void MetadataStore::ExpireBuiltSnapshot() {
  if (built_snapshot_ != nullptr && now() - built_snapshot_->built_ms > 60'000) {
    built_snapshot_.reset();
  }
}

void MetadataStore::WriteSnapshot() {
  for (const auto& [id, a] : agents_) {
    LogAgent(a);
    for (PoolId pool_id : a.pools) LogPool(pools_.at(pool_id));
  }
  // Committed state only: a write in flight (a put not ended, an upsert rewriting its object)
  // has bytes that may never arrive, so it must not come back readable from a snapshot.
  objects_.ForEach([&](const ObjectEntry& entry) {
    if (entry.second.readable) LogObject(entry);
  });
}

Status MetadataStore::Open() {
  live_mark_ms_ = now();
  if (!options_.state_dir.empty()) {
    OpLogOptions log_options;
    log_options.sync = options_.log_sync;
    log_options.truncate_damaged = options_.truncate_damaged_log;
    auto log = OpLog::Open(options_.state_dir, log_options);
    if (!log.ok()) return log.status();
    oplog_ = std::move(log.value());
    restoring_ = true;
    auto count = oplog_->Replay([this](std::string_view p) { return ApplyRecord(p); });
    if (!count.ok()) return count.status();
    FinishRestore();
    restoring_ = false;
    // Compact: the new log is the restored state, written as fresh records. The records
    // replayed stay valid without it, so a disk too full for the copy only costs the compaction
    // (a version-1 log, though, must be rewritten before records can be appended to it).
    Status compacted = oplog_->Rewrite([this](const std::function<void(std::string_view)>& append) {
      snapshot_sink_ = &append;
      WriteSnapshot();
      snapshot_sink_ = nullptr;
    });
    if (!compacted.ok()) {
      if (oplog_->needs_rewrite()) return compacted;
      LOG(WARNING) << "operation log: not compacted at start (" << compacted.message()
                   << "); kvmaster goes on appending to the log as it is";
    }
    snapshot_bytes_ = oplog_->file_bytes();
    LOG(INFO) << "restored " << objects_.size() << " object(s), " << agents_.size() << " agent(s), "
              << pools_.size() << " pool(s) from " << oplog_->path() << " (" << count.value()
              << " records; log sync: " << LogSyncName(options_.log_sync) << ")";
  }
  if (agents_.empty()) {
    // A master without state numbers agents and pools from a random base, so an id held by
    // an agent of a previous master is not taken for a new agent's (its Heartbeat answers
    // known=false and it registers again).
    std::random_device rd;
    next_agent_id_ = std::max(next_agent_id_, 1 + rd() % (1u << 30));
    next_pool_id_ = std::max(next_pool_id_, 1 + rd() % (1u << 30));
  }
  ReserveEvents(1 + objects_.size());  // at once (see DropAgent)
  events_.emplace_back(events::AllBlocksCleared{});
  ++counters_.events_emitted;
  objects_.ForEach([&](const ObjectEntry& entry) { EmitStored(entry); });
  return Status::Ok();
}

void MetadataStore::MaintainLog() {
  if (!oplog_) return;
  if (!oplog_->writable()) {
    oplog_->Probe();
    return;
  }
  // The records buffered so far reach the file first, or kvmaster stops (FailStop): a rewrite
  // flushes them too, but a failure there would only end the rewrite, with memory ahead of
  // the log.
  if (!FlushLog().ok()) return;
  if (oplog_->rewriting()) {
    Status st;
    if (!oplog_->FinishRewrite(&st)) return;  // the child still writes the snapshot
    FinishCompaction(st, compaction_started_, "in the background");
    return;
  }
  const uint64_t size = oplog_->file_bytes();
  if (options_.compact_log_bytes == 0 || size < options_.compact_log_bytes ||
      size < 2 * snapshot_bytes_ || now() < next_compaction_ms_) {
    return;
  }
  compaction_started_ = std::chrono::steady_clock::now();
  compacted_from_ = size;
  const auto write_all = [this](const std::function<void(std::string_view)>& append) {
    snapshot_sink_ = &append;
    WriteSnapshot();
    snapshot_sink_ = nullptr;
  };
  // In a child process, from its copy of the state: the loop goes on answering meanwhile.
  Status started = oplog_->StartRewrite(write_all);
  if (started.ok()) return;
  LOG(WARNING) << "operation log: cannot compact in the background (" << started.message()
               << "); compacting on the loop";
  FinishCompaction(oplog_->Rewrite(write_all), compaction_started_, "on the loop");
}

void MetadataStore::FinishCompaction(const Status& st,
                                     std::chrono::steady_clock::time_point started,
                                     const char* how) {
  if (!st.ok()) {
    LOG(WARNING) << "operation log: compaction failed (" << st.message()
                 << "); the log keeps growing, next try in 60 s";
    next_compaction_ms_ = now() + 60'000;
    return;
  }
  ++counters_.log_compactions;
  snapshot_bytes_ = oplog_->file_bytes();
  LOG(INFO) << "operation log: compacted " << compacted_from_ << " -> " << snapshot_bytes_
            << " bytes (" << objects_.size() << " object(s)) " << how << " in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - started)
                   .count()
            << " ms";
}

void MetadataStore::FailStop(const Status& st) {
  LOG(ERROR) << "kvmaster cannot write its operation log: " << st.message()
             << ". Changes already applied in memory are not on disk, and memory must never run "
                "ahead of the log: exiting now. Every change acknowledged before is in "
             << oplog_->path() << "; fix the disk, then restart kvmaster (systemd does).";
  google::FlushLogFiles(google::GLOG_INFO);
  _exit(1);
}

}  // namespace kvagent::master

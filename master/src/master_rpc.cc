#include "kvagent/master/master_rpc.h"

#include <flatbuffers/flatbuffers.h>

#include <algorithm>
#include <cstring>

#include "kvagent/common/validate.h"
#include "kvagent/schemas/master_generated.h"
#include "request_check.h"

namespace kvagent::master {

namespace fb = kvagent::master_proto;

class MasterRpc::Scratch {
 public:
  flatbuffers::FlatBufferBuilder builder{1 << 16};
  std::vector<std::string_view> keys;
  std::vector<std::string_view> sessions;
  std::vector<std::string_view> endpoints;
  std::vector<BlockMetaView> blocks;
  std::vector<events::BlockHash> hashes;
  std::vector<uint16_t> codes;
  std::vector<SegmentId> segment_ids;
  std::vector<flatbuffers::Offset<flatbuffers::String>> strings;
  std::vector<flatbuffers::Offset<fb::SegmentInfo>> segments;
  std::vector<fb::Placement> placements;
  std::vector<uint64_t> aligned;  // a copy of a misaligned request
  std::vector<FailedReplica> failed;
  std::vector<BadReplica> bad;
  PlacementBatch placement_batch;
  KeyResults key_results;
  ListPage page;
};

namespace {

// The block fields of a stored object's announcement as the writer gave them (ListKeys).
flatbuffers::Offset<fb::BlockMeta> EncodeBlockMeta(flatbuffers::FlatBufferBuilder& b,
                                                   const events::BlockStored& e) {
  std::vector<fb::BlockHash> hashes;
  hashes.reserve(e.block_hashes.size());
  for (const events::BlockHash& h : e.block_hashes) hashes.emplace_back(h.bits, h.is_signed);
  auto hash_vec = b.CreateVectorOfStructs(hashes);
  flatbuffers::Offset<flatbuffers::Vector<const fb::BlockHash*>> parent;
  if (e.parent_block_hash) {
    fb::BlockHash p(e.parent_block_hash->bits, e.parent_block_hash->is_signed);
    parent = b.CreateVectorOfStructs(&p, 1);
  }
  auto tokens = e.token_ids.empty() ? 0 : b.CreateVector(e.token_ids).o;
  auto lora = e.lora_name ? b.CreateString(*e.lora_name).o : 0;
  fb::BlockMetaBuilder m(b);
  m.add_block_hashes(hash_vec);
  if (!parent.IsNull()) m.add_parent_block_hash(parent);
  if (tokens) m.add_token_ids(flatbuffers::Offset<flatbuffers::Vector<uint32_t>>(tokens));
  m.add_block_size(e.block_size);
  if (lora) m.add_lora_name(flatbuffers::Offset<flatbuffers::String>(lora));
  return m.Finish();
}

using Builder = flatbuffers::FlatBufferBuilder;

template <typename T>
std::span<const T> SpanOf(const flatbuffers::Vector<T>* v) {
  if (!v) return {};
  return {v->data(), v->size()};
}

void CollectStrings(const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* v,
                    std::vector<std::string_view>* out) {
  out->clear();
  if (!v) return;
  out->reserve(v->size());
  for (const flatbuffers::String* s : *v) out->emplace_back(s->data(), s->size());
}

// Every reply names the answering master's epoch (master.fbs Reply.master_epoch).
std::span<const uint8_t> Finish(Builder& b, uint64_t epoch, uint64_t request_id,
                                const Status& status, fb::ReplyBody type,
                                flatbuffers::Offset<void> body, bool not_serving = false) {
  auto message = status.ok() ? 0 : b.CreateString(status.message()).o;
  fb::ReplyBuilder r(b);
  r.add_request_id(request_id);
  r.add_status(static_cast<uint16_t>(status.code()));
  if (!status.ok()) r.add_message(flatbuffers::Offset<flatbuffers::String>(message));
  if (body.o != 0) {
    r.add_body_type(type);
    r.add_body(body);
  }
  r.add_master_epoch(epoch);
  if (not_serving) r.add_not_serving(true);
  b.Finish(r.Finish());
  return {b.GetBufferPointer(), b.GetSize()};
}

// codes + messages (only when some key failed) from per-key results.
std::pair<flatbuffers::Offset<flatbuffers::Vector<uint16_t>>,
          flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>>>
BuildCodes(Builder& b, const std::vector<Status>& results, std::vector<uint16_t>* codes,
           std::vector<flatbuffers::Offset<flatbuffers::String>>* strings) {
  codes->clear();
  bool any_error = false;
  for (const Status& s : results) {
    codes->push_back(static_cast<uint16_t>(s.code()));
    any_error |= !s.ok();
  }
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> msgs;
  if (any_error) {
    strings->clear();
    for (const Status& s : results) strings->push_back(b.CreateString(s.message()));
    msgs = b.CreateVector(*strings);
  }
  return {b.CreateVector(*codes), msgs};
}

}  // namespace

MasterRpc::MasterRpc(MasterService* service)
    : service_(service), scratch_(std::make_unique<Scratch>()) {}

MasterRpc::~MasterRpc() = default;

std::span<const uint8_t> MasterRpc::Handle(std::span<const uint8_t> request) {
  Scratch& s = *scratch_;
  Builder& b = s.builder;
  b.Clear();
  const uint64_t epoch = service_->incarnation();
  // FlatBuffers reads scalars in place and needs them aligned; ZMQ keeps small messages inside
  // the message object at any offset. Copy those (they are small).
  if (reinterpret_cast<uintptr_t>(request.data()) % alignof(uint64_t) != 0) {
    s.aligned.assign((request.size() + 7) / 8, 0);
    std::memcpy(s.aligned.data(), request.data(), request.size());
    request = std::span(reinterpret_cast<const uint8_t*>(s.aligned.data()), request.size());
  }
  flatbuffers::Verifier verifier(request.data(), request.size(), flatbuffers::Verifier::Options{});
  if (request.empty() || !fb::VerifyRequestBuffer(verifier)) {
    service_->CountBadRequest();
    return Finish(b, epoch, 0,
                  InvalidParams("the request is not a valid master.fbs Request (" +
                                std::to_string(request.size()) +
                                " bytes failed verification); check the client's protocol "
                                "version"),
                  fb::ReplyBody::NONE, 0);
  }
  const fb::Request* req = fb::GetRequest(request.data());
  const uint64_t id = req->request_id();
  last_ = LastRequest{};
  last_.type = static_cast<uint8_t>(req->body_type());
  // A master that may not serve (its leadership is not confirmed) changes nothing and says so;
  // it still hands out its records (a follower may fetch what it made while it led).
  if (may_serve_ && req->body_type() != fb::Body::Replicate && !may_serve_()) {
    last_.refused = true;
    return Finish(b, epoch, id,
                  Status(ErrorCode::kMasterUnavailable,
                         "this kvmaster does not serve now: it could not confirm its leadership "
                         "in etcd in time (or lost it); nothing was done. Ask etcd for the "
                         "leader (the agent does this by itself)"),
                  fb::ReplyBody::NONE, 0, /*not_serving=*/true);
  }

  // Per-key replies (placements or codes) from the service's result containers.
  auto placement_reply = [&](const Status& status) {
    const PlacementBatch& pb = s.placement_batch;
    auto [codes, msgs] = BuildCodes(b, pb.results, &s.codes, &s.strings);
    s.placements.clear();
    s.segment_ids.clear();
    for (const Placement& p : pb.placements) {
      s.placements.emplace_back(p.part, p.segment_id, p.offset, p.length, p.checksum,
                                p.checksummed);
      s.segment_ids.push_back(p.segment_id);
    }
    std::sort(s.segment_ids.begin(), s.segment_ids.end());
    s.segment_ids.erase(std::unique(s.segment_ids.begin(), s.segment_ids.end()),
                        s.segment_ids.end());
    s.segments.clear();
    for (SegmentId sid : s.segment_ids) {
      auto view = service_->FindSegment(sid);
      if (!view) continue;
      std::vector<flatbuffers::Offset<flatbuffers::String>> eps;
      for (const std::string& ep : view->endpoints) eps.push_back(b.CreateString(ep));
      s.segments.push_back(
          fb::CreateSegmentInfo(b, sid, view->agent, b.CreateVector(eps), view->incarnation));
    }
    auto first = b.CreateVector(pb.first);
    auto placements = b.CreateVectorOfStructs(s.placements);
    auto segments = b.CreateVector(s.segments);
    auto sizes = pb.sizes.empty() ? 0 : b.CreateVector(pb.sizes).o;
    auto write_ids = pb.write_ids.empty() ? 0 : b.CreateVector(pb.write_ids).o;
    fb::PlacementReplyBuilder r(b);
    r.add_codes(codes);
    if (!msgs.IsNull()) r.add_messages(msgs);
    r.add_first(first);
    r.add_placements(placements);
    r.add_segments(segments);
    if (sizes) r.add_sizes(flatbuffers::Offset<flatbuffers::Vector<uint64_t>>(sizes));
    if (write_ids) {
      r.add_write_ids(flatbuffers::Offset<flatbuffers::Vector<uint64_t>>(write_ids));
    }
    r.add_lease_ttl_ms(pb.lease_ttl_ms);
    r.add_master_epoch(service_->incarnation());
    return Finish(b, epoch, id, status, fb::ReplyBody::PlacementReply, r.Finish().Union());
  };
  auto codes_reply = [&](const Status& status, uint64_t removed_count) {
    const KeyResults& kr = s.key_results;
    auto [codes, msgs] = BuildCodes(b, kr.results, &s.codes, &s.strings);
    flatbuffers::Offset<flatbuffers::Vector<uint8_t>> exists;
    if (!kr.exists.empty()) exists = b.CreateVector(kr.exists);
    flatbuffers::Offset<flatbuffers::Vector<uint8_t>> replicas;
    if (!kr.replicas.empty()) replicas = b.CreateVector(kr.replicas);
    fb::KeyCodesReplyBuilder r(b);
    r.add_codes(codes);
    if (!msgs.IsNull()) r.add_messages(msgs);
    if (!exists.IsNull()) r.add_exists(exists);
    if (!replicas.IsNull()) r.add_replicas(replicas);
    r.add_removed_count(removed_count);
    return Finish(b, epoch, id, status, fb::ReplyBody::KeyCodesReply, r.Finish().Union());
  };
  auto bad = [&](Status status) {
    service_->CountBadRequest();
    return Finish(b, epoch, id, status, fb::ReplyBody::NONE, 0);
  };
  // The typed view of a WriteStart (spans into the message and the scratch).
  auto read_start = [&](const fb::WriteStart* m) {
    CollectStrings(m->keys(), &s.keys);
    CollectStrings(m->session_ids(), &s.sessions);
    s.blocks.clear();
    s.hashes.clear();
    if (const auto* blocks = m->blocks()) {
      // One flat hash store for the whole batch; reserved first so the views stay valid.
      size_t total = 0;
      for (const fb::BlockMeta* bm : *blocks) {
        total += bm->block_hashes() ? bm->block_hashes()->size() : 0;
      }
      s.hashes.reserve(total);
      for (const fb::BlockMeta* bm : *blocks) {
        BlockMetaView v;
        const size_t start = s.hashes.size();
        if (bm->block_hashes()) {
          for (const fb::BlockHash* h : *bm->block_hashes()) {
            s.hashes.push_back(events::BlockHash{h->bits(), h->is_signed()});
          }
        }
        v.block_hashes = std::span(s.hashes).subspan(start, s.hashes.size() - start);
        if (bm->parent_block_hash() && bm->parent_block_hash()->size() > 0) {
          const fb::BlockHash* p = bm->parent_block_hash()->Get(0);
          v.parent_block_hash = events::BlockHash{p->bits(), p->is_signed()};
        }
        v.token_ids = SpanOf(bm->token_ids());
        v.block_size = bm->block_size();
        if (bm->lora_name()) v.lora_name = bm->lora_name()->string_view();
        s.blocks.push_back(v);
      }
    }
    WriteStartRequest w;
    w.agent = m->agent_id();
    w.keys = s.keys;
    w.sizes = SpanOf(m->sizes());
    w.session_ids = s.sessions;
    w.blocks = s.blocks;
    if (const fb::WriteOptions* o = m->options()) {
      w.options.replica_count = o->replica_count();
      w.options.soft_pin = o->soft_pin();
      w.options.soft_pin_ttl_ms = o->soft_pin_ttl_ms();
      w.options.hard_pin = o->hard_pin();
    }
    return w;
  };
  auto write_start = [&](const fb::WriteStart* m, bool upsert) {
    const WriteStartRequest w = read_start(m);
    Status st = upsert ? service_->BatchUpsertStart(w, &s.placement_batch)
                       : service_->BatchPutStart(w, &s.placement_batch);
    return placement_reply(st);
  };
  // The typed view of a WriteFinish for `keys`.
  auto read_finish = [&](const fb::WriteFinish* m, std::span<const std::string_view> keys) {
    WriteEndRequest w;
    w.agent = m->agent_id();
    w.keys = keys;
    w.write_ids = SpanOf(m->write_ids());
    w.part_counts = SpanOf(m->part_counts());
    w.checksums = SpanOf(m->checksums());
    s.failed.clear();
    if (const auto* failed = m->failed()) {
      s.failed.reserve(failed->size());
      for (const fb::FailedReplica* f : *failed) {
        s.failed.push_back(FailedReplica{f->key(), f->part(), f->segment_id()});
      }
    }
    w.failed = s.failed;
    return w;
  };
  auto write_end = [&](const fb::WriteFinish* m) {
    CollectStrings(m->keys(), &s.keys);
    return codes_reply(service_->BatchPutEnd(read_finish(m, s.keys), &s.key_results), 0);
  };
  auto write_commit = [&](const fb::WriteCommit* m) {
    if (m == nullptr || m->start() == nullptr || m->finish() == nullptr) {
      return bad(InvalidParams("BatchPutCommit needs its start and its finish"));
    }
    WriteCommitRequest c;
    c.start = read_start(m->start());
    c.finish = read_finish(m->finish(), s.keys);  // the start's keys
    if (c.finish.agent != c.start.agent) {
      return bad(InvalidParams("a commit's start and finish name different agents"));
    }
    c.master_epoch = m->master_epoch();
    return codes_reply(service_->BatchPutCommit(c, &s.key_results), 0);
  };
  auto reserve_writes = [&](const fb::ReserveWrites* m) {
    if (m == nullptr) return bad(InvalidParams("ReserveWrites without its body"));
    ReserveWritesRequest r;
    r.agent = m->agent_id();
    r.size = m->size();
    r.replica_count = m->replica_count();
    r.count = m->count();
    r.returned = SpanOf(m->returned());
    return placement_reply(service_->ReserveWrites(r, &s.placement_batch));
  };
  auto write_revoke = [&](const fb::WriteFinish* m) {
    CollectStrings(m->keys(), &s.keys);
    return codes_reply(
        service_->BatchPutRevoke(m->agent_id(), s.keys, SpanOf(m->write_ids()), &s.key_results), 0);
  };

  if (Status shape = CheckRequestShape(*req, request.size()); !shape.ok()) return bad(shape);

  switch (req->body_type()) {
    case fb::Body::RegisterAgent: {
      const auto* m = req->body_as_RegisterAgent();
      auto r = service_->RegisterAgent(m->name() ? m->name()->string_view() : "", m->incarnation());
      if (!r.ok()) return Finish(b, epoch, id, r.status(), fb::ReplyBody::NONE, 0);
      return Finish(b, epoch, id, Status::Ok(), fb::ReplyBody::RegisterAgentReply,
                    fb::CreateRegisterAgentReplyDirect(
                        b, r.value(), service_->incarnation(),
                        events_endpoint_.empty() ? nullptr : events_endpoint_.c_str(),
                        events_endpoint_.empty() ? nullptr : events_replay_endpoint_.c_str())
                        .Union());
    }
    case fb::Body::MountSegment: {
      const auto* m = req->body_as_MountSegment();
      CollectStrings(m->endpoints(), &s.endpoints);
      auto r = service_->MountSegment(m->agent_id(), m->segment_index(), m->size(), s.endpoints);
      if (!r.ok()) return Finish(b, epoch, id, r.status(), fb::ReplyBody::NONE, 0);
      return Finish(b, epoch, id, Status::Ok(), fb::ReplyBody::MountSegmentReply,
                    fb::CreateMountSegmentReply(b, r->segment_id, r->restored_objects).Union());
    }
    case fb::Body::Heartbeat: {
      const auto* m = req->body_as_Heartbeat();
      const HeartbeatResult h = service_->Heartbeat(m->agent_id(), m->fence_ack());
      auto fenced = h.fenced_writes.empty() ? 0 : b.CreateVector(h.fenced_writes).o;
      fb::HeartbeatReplyBuilder r(b);
      r.add_known(h.known);
      r.add_fence_seq(h.fence_seq);
      r.add_write_watermark(h.write_watermark);
      if (fenced) r.add_fenced_writes(flatbuffers::Offset<flatbuffers::Vector<uint64_t>>(fenced));
      return Finish(b, epoch, id, Status::Ok(), fb::ReplyBody::HeartbeatReply, r.Finish().Union());
    }
    case fb::Body::BatchPutStart:
      return write_start(req->body_as_BatchPutStart(), false);
    case fb::Body::BatchUpsertStart:
      return write_start(req->body_as_BatchUpsertStart(), true);
    case fb::Body::BatchPutEnd:
      return write_end(req->body_as_BatchPutEnd());
    case fb::Body::BatchPutRevoke:
      return write_revoke(req->body_as_BatchPutRevoke());
    case fb::Body::BatchUpsertEnd:
      return write_end(req->body_as_BatchUpsertEnd());
    case fb::Body::BatchUpsertRevoke:
      return write_revoke(req->body_as_BatchUpsertRevoke());
    case fb::Body::ReserveWrites:
      return reserve_writes(req->body_as_ReserveWrites());
    case fb::Body::BatchPutCommit:
      return write_commit(req->body_as_BatchPutCommit());
    case fb::Body::ReportBadReplicas: {
      const auto* m = req->body_as_ReportBadReplicas();
      CollectStrings(m->keys(), &s.keys);
      const auto versions = SpanOf(m->versions());
      const auto parts = SpanOf(m->parts());
      const auto segments = SpanOf(m->segment_ids());
      if (versions.size() != s.keys.size() || parts.size() != s.keys.size() ||
          segments.size() != s.keys.size()) {
        return bad(
            InvalidParams("ReportBadReplicas: keys, versions, parts and segment_ids must "
                          "have the same length"));
      }
      s.bad.clear();
      for (size_t i = 0; i < s.keys.size(); ++i) {
        s.bad.push_back(BadReplica{s.keys[i], versions[i], parts[i], segments[i]});
      }
      return codes_reply(service_->ReportBadReplicas(s.bad, &s.key_results), 0);
    }
    case fb::Body::BatchGet: {
      CollectStrings(req->body_as_BatchGet()->keys(), &s.keys);
      return placement_reply(service_->BatchGet(s.keys, &s.placement_batch));
    }
    case fb::Body::BatchExist: {
      CollectStrings(req->body_as_BatchExist()->keys(), &s.keys);
      return codes_reply(service_->BatchExist(s.keys, &s.key_results), 0);
    }
    case fb::Body::BatchRemove: {
      const auto* m = req->body_as_BatchRemove();
      CollectStrings(m->keys(), &s.keys);
      return codes_reply(service_->BatchRemove(s.keys, m->force(), &s.key_results), 0);
    }
    case fb::Body::RemoveAll: {
      auto r = service_->RemoveAll(req->body_as_RemoveAll()->force());
      s.key_results.Clear();
      if (!r.ok()) return codes_reply(r.status(), 0);
      return codes_reply(Status::Ok(), r.value());
    }
    case fb::Body::ListKeys: {
      const auto* m = req->body_as_ListKeys();
      const std::string_view prefix = m->prefix() ? m->prefix()->string_view() : "";
      Status st = service_->ListKeys(m->cursor(), m->limit(), &s.page, prefix);
      std::vector<flatbuffers::Offset<fb::ListedKey>> keys;
      keys.reserve(s.page.keys.size());
      for (const ListedKey& k : s.page.keys) {
        auto key = b.CreateString(k.key);
        auto session = k.session_id.empty() ? 0 : b.CreateString(k.session_id).o;
        auto block = k.has_writer_meta ? EncodeBlockMeta(b, k.announcement).o : 0;
        fb::ListedKeyBuilder lk(b);
        lk.add_key(key);
        lk.add_size(k.size);
        if (session) lk.add_session_id(flatbuffers::Offset<flatbuffers::String>(session));
        if (block) lk.add_block(flatbuffers::Offset<fb::BlockMeta>(block));
        keys.push_back(lk.Finish());
      }
      auto body =
          fb::CreateListKeysReply(b, b.CreateVector(keys), s.page.next_cursor, s.page.restarted);
      return Finish(b, epoch, id, st, fb::ReplyBody::ListKeysReply, body.Union());
    }
    case fb::Body::SessionStats: {
      const auto* m = req->body_as_SessionStats();
      const std::string_view session =
          m->session_id() ? m->session_id()->string_view() : std::string_view();
      if (!session.empty()) {
        if (Status st = ValidateSessionId(session); !st.ok()) return bad(st);
      }
      std::vector<MasterService::SessionUsage> usage;
      uint64_t next_cursor = 0;
      service_->SessionStats(session, m->cursor(), m->limit(), &usage, &next_cursor);
      std::vector<flatbuffers::Offset<fb::SessionUsage>> out;
      out.reserve(usage.size());
      for (const MasterService::SessionUsage& u : usage) {
        out.push_back(fb::CreateSessionUsageDirect(b, u.session_id.c_str(), u.blocks, u.bytes));
      }
      auto body = fb::CreateSessionStatsReply(b, b.CreateVector(out), next_cursor);
      return Finish(b, epoch, id, Status::Ok(), fb::ReplyBody::SessionStatsReply, body.Union());
    }
    case fb::Body::Stats: {
      const std::vector<std::pair<std::string, uint64_t>> all = StatCounters();
      std::vector<flatbuffers::Offset<flatbuffers::String>> names;
      std::vector<uint64_t> values;
      for (const auto& [n, v] : all) {
        names.push_back(b.CreateString(n));
        values.push_back(v);
      }
      auto body = fb::CreateStatsReply(b, b.CreateVector(names), b.CreateVector(values));
      return Finish(b, epoch, id, Status::Ok(), fb::ReplyBody::StatsReply, body.Union());
    }
    case fb::Body::Replicate: {
      const auto* m = req->body_as_Replicate();
      last_.replicate = true;
      last_.after_seq = m->after_seq();
      last_.incarnation = m->incarnation();
      last_.wait_ms = m->wait_ms();
      if (m->follower() != nullptr) last_.follower = m->follower()->str();
      ReplicationPage page;
      const size_t max_bytes = std::clamp<size_t>(m->max_bytes(), 4096, 64u << 20);
      Status st = service_->ReadReplication(m->after_seq(), m->incarnation(), max_bytes, &page);
      if (!st.ok()) return Finish(b, epoch, id, st, fb::ReplyBody::NONE, 0);
      last_.replicate_empty = !page.snapshot && page.records.empty();
      auto records = b.CreateVector(reinterpret_cast<const uint8_t*>(page.records.data()),
                                    page.records.size());
      auto body = fb::CreateReplicateReply(b, service_->incarnation(), page.snapshot, page.last_seq,
                                           records);
      return Finish(b, epoch, id, Status::Ok(), fb::ReplyBody::ReplicateReply, body.Union());
    }
    default:
      break;
  }
  return bad(InvalidParams("unknown request type " +
                           std::to_string(static_cast<int>(req->body_type())) +
                           "; the master speaks master.fbs as of this build: upgrade it"));
}

std::vector<std::pair<std::string, uint64_t>> MasterRpc::StatCounters() const {
  const MasterStats st = service_->Stats();
  std::vector<std::pair<std::string, uint64_t>> all = {
      {"keys", st.keys},
      {"writes_in_flight", st.writes_in_flight},
      {"bytes_used", st.bytes_used},
      {"bytes_capacity", st.bytes_capacity},
      {"agents", st.agents},
      {"segments", st.segments},
      {"session_tags", st.session_tags},
      {"evictions", st.evictions},
      {"expired_agents", st.expired_agents},
      {"taken_over_puts", st.taken_over_puts},
      {"timed_out_writes", st.timed_out_writes},
      {"bad_requests", st.bad_requests},
      {"events_emitted", st.events_emitted},
      {"oplog_records", st.oplog_records},
      {"replication_last_seq", st.replication_last_seq},
      {"suspect_agents", st.suspect_agents},
      {"agents_suspected", st.agents_suspected},
      {"fenced_bytes", st.fenced_bytes},
      {"pending_fences", st.pending_fences},
      {"bad_replicas", st.bad_replicas},
      {"stalls_forgiven", st.stalls_forgiven},
      {"log_writable", st.log_writable},
      {"log_refusals", st.log_refusals},
      {"log_bytes", st.log_bytes},
      {"log_compactions", st.log_compactions},
      {"oversized_values", st.oversized_values},
      {"reserved_writes", st.reserved_writes},
      {"reserved_bytes", st.reserved_bytes},
      {"writes_reserved", st.writes_reserved},
      {"reserved_commits", st.reserved_commits},
      {"reserved_returned", st.reserved_returned},
  };
  if (extra_stats_) extra_stats_(&all);
  return all;
}

}  // namespace kvagent::master

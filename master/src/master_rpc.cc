#include "kvagent/master/master_rpc.h"

#include <flatbuffers/flatbuffers.h>
#include <glog/logging.h>

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
  std::vector<PoolId> pool_ids;
  std::vector<flatbuffers::Offset<flatbuffers::String>> strings;
  std::vector<flatbuffers::Offset<fb::PoolInfo>> pools;
  std::vector<flatbuffers::Offset<flatbuffers::String>> pool_endpoints;  // one pool's at a time
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
  std::vector<block_proto::BlockHash> hashes;
  hashes.reserve(e.block_hashes.size());
  for (const events::BlockHash& h : e.block_hashes) hashes.emplace_back(h.bits, h.is_signed);
  auto hash_vec = b.CreateVectorOfStructs(hashes);
  flatbuffers::Offset<flatbuffers::Vector<const block_proto::BlockHash*>> parent;
  if (e.parent_block_hash) {
    block_proto::BlockHash p(e.parent_block_hash->bits, e.parent_block_hash->is_signed);
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

using Reply = std::span<const uint8_t>;

// One request, after verification and the shape checks: a step per body type, each reading its
// message into the service's request types and building the reply from the service's result
// containers in the scratch.
class MasterRpc::Call {
 public:
  Call(MasterRpc& rpc, uint64_t id)
      : rpc_(rpc),
        service_(*rpc.service_),
        s_(*rpc.scratch_),
        b_(s_.builder),
        id_(id),
        epoch_(service_.epoch()) {}

  Reply Dispatch(const fb::Request& req);
  // A refused request: counted in bad_requests, nothing changed.
  Reply Bad(Status status) {
    service_.CountBadRequest();
    return Finish(b_, epoch_, id_, status, fb::ReplyBody::NONE, 0);
  }

 private:
  // Replies built from the service's result containers.
  Reply PlacementReply(const Status& status);
  Reply CodesReply(const Status& status, uint64_t removed_count);

  // Typed views of the messages (spans into the message and the scratch).
  WriteStartRequest ReadStart(const fb::WriteStart* m);
  WriteEndRequest ReadFinish(const fb::WriteFinish* m, std::span<const std::string_view> keys);

  Reply RegisterAgent(const fb::RegisterAgent* m, uint64_t agent_key);
  Reply MountPool(const fb::MountPool* m);
  Reply Heartbeat(const fb::Heartbeat* m);
  Reply WriteStart(const fb::WriteStart* m, bool upsert);
  Reply WriteEnd(const fb::WriteFinish* m);
  Reply WriteRevoke(const fb::WriteFinish* m);
  Reply WriteCommit(const fb::WriteCommit* m);
  Reply ReserveWrites(const fb::ReserveWrites* m);
  Reply ReportBadReplicas(const fb::ReportBadReplicas* m);
  Reply BatchGet(const fb::BatchGet* m);
  Reply BatchExist(const fb::BatchExist* m);
  Reply BatchRemove(const fb::BatchRemove* m);
  Reply RemoveAll(const fb::RemoveAll* m);
  Reply ListKeys(const fb::ListKeys* m);
  Reply SessionStats(const fb::SessionStats* m);
  Reply Stats();
  Reply Replicate(const fb::Replicate* m);

  MasterRpc& rpc_;
  MasterService& service_;
  Scratch& s_;
  Builder& b_;
  const uint64_t id_;
  const uint64_t epoch_;
};

// FlatBuffers reads scalars in place and needs them aligned; ZMQ keeps small messages inside the
// message object at any offset. Those are copied (they are small).
std::span<const uint8_t> MasterRpc::Aligned(std::span<const uint8_t> request) {
  if (reinterpret_cast<uintptr_t>(request.data()) % alignof(uint64_t) == 0) return request;
  std::vector<uint64_t>& aligned = scratch_->aligned;
  aligned.assign((request.size() + 7) / 8, 0);
  std::memcpy(aligned.data(), request.data(), request.size());
  return std::span(reinterpret_cast<const uint8_t*>(aligned.data()), request.size());
}

std::span<const uint8_t> MasterRpc::Handle(std::span<const uint8_t> request, bool may_detach) {
  scratch_->builder.Clear();
  may_detach_ = may_detach;
  last_ = LastRequest{};  // a request that fails verification is none of the kinds last() names
  request = Aligned(request);
  flatbuffers::Verifier verifier(request.data(), request.size(), flatbuffers::Verifier::Options{});
  if (request.empty() || !fb::VerifyRequestBuffer(verifier)) {
    service_->CountBadRequest();
    return Finish(scratch_->builder, service_->epoch(), 0,
                  InvalidParams("the request is not a valid master.fbs Request (" +
                                std::to_string(request.size()) +
                                " bytes failed verification); check the client's protocol "
                                "version"),
                  fb::ReplyBody::NONE, 0);
  }
  return Serve(request, /*own=*/false);
}

std::span<const uint8_t> MasterRpc::HandleOwn(std::span<const uint8_t> request) {
  scratch_->builder.Clear();
  may_detach_ = false;
  return Serve(Aligned(request), /*own=*/true);
}

// A verified request (or one of our own, `own`: its shape is not checked either).
std::span<const uint8_t> MasterRpc::Serve(std::span<const uint8_t> request, bool own) {
  Builder& b = scratch_->builder;
  const uint64_t epoch = service_->epoch();
  const fb::Request* req = fb::GetRequest(request.data());
  last_ = LastRequest{};
  last_.type = static_cast<uint8_t>(req->body_type());
  // A master that may not serve (its leadership is not confirmed) changes nothing and says so;
  // it still hands out its records (a follower may fetch what it made while it led).
  if (may_serve_ && req->body_type() != fb::Body::Replicate && !may_serve_()) {
    last_.refused = true;
    return Finish(b, epoch, req->request_id(),
                  Status(ErrorCode::kMasterUnavailable,
                         "this kvmaster does not serve now: it could not confirm its leadership "
                         "in etcd in time (or lost it); nothing was done. Ask etcd for the "
                         "leader (the agent does this by itself)"),
                  fb::ReplyBody::NONE, 0, /*not_serving=*/true);
  }
  Call call(*this, req->request_id());
  if (!own) {
    if (Status shape = CheckRequestShape(*req, request.size()); !shape.ok()) {
      return call.Bad(shape);
    }
  }
  return call.Dispatch(*req);
}

// The agent a request acts for (its body's agent_id), if its type names one.
static std::optional<AgentId> ActingAgent(const fb::Request& req) {
  auto id = [](const auto* body) -> std::optional<AgentId> {
    if (body == nullptr) return std::nullopt;
    return body->agent_id();
  };
  switch (req.body_type()) {
    case fb::Body::MountPool:
      return id(req.body_as_MountPool());
    case fb::Body::Heartbeat:
      return id(req.body_as_Heartbeat());
    case fb::Body::BatchPutStart:
    case fb::Body::BatchUpsertStart:
      return id(static_cast<const fb::WriteStart*>(req.body()));
    case fb::Body::BatchPutEnd:
    case fb::Body::BatchPutRevoke:
    case fb::Body::BatchUpsertEnd:
    case fb::Body::BatchUpsertRevoke:
      return id(static_cast<const fb::WriteFinish*>(req.body()));
    case fb::Body::ReserveWrites:
      return id(req.body_as_ReserveWrites());
    case fb::Body::BatchPutCommit: {
      const fb::WriteCommit* c = req.body_as_BatchPutCommit();
      return c == nullptr ? std::nullopt : id(c->start());  // its finish must name the same
    }
    case fb::Body::ReportBadReplicas:
      return id(req.body_as_ReportBadReplicas());
    default:
      return std::nullopt;
  }
}

Reply MasterRpc::Call::Dispatch(const fb::Request& req) {
  // Only the agent process that registered acts for its agent (master.fbs RegisterAgent).
  if (const std::optional<AgentId> agent = ActingAgent(req)) {
    if (Status key = service_.CheckAgentKey(*agent, req.agent_key()); !key.ok()) {
      rpc_.last_.agent_key_refused = true;
      return Finish(b_, epoch_, id_, key, fb::ReplyBody::NONE, 0);
    }
  }
  switch (req.body_type()) {
    case fb::Body::RegisterAgent:
      return RegisterAgent(req.body_as_RegisterAgent(), req.agent_key());
    case fb::Body::MountPool:
      return MountPool(req.body_as_MountPool());
    case fb::Body::Heartbeat:
      return Heartbeat(req.body_as_Heartbeat());
    case fb::Body::BatchPutStart:
      return WriteStart(req.body_as_BatchPutStart(), false);
    case fb::Body::BatchUpsertStart:
      return WriteStart(req.body_as_BatchUpsertStart(), true);
    case fb::Body::BatchPutEnd:
      return WriteEnd(req.body_as_BatchPutEnd());
    case fb::Body::BatchPutRevoke:
      return WriteRevoke(req.body_as_BatchPutRevoke());
    case fb::Body::BatchUpsertEnd:
      return WriteEnd(req.body_as_BatchUpsertEnd());
    case fb::Body::BatchUpsertRevoke:
      return WriteRevoke(req.body_as_BatchUpsertRevoke());
    case fb::Body::ReserveWrites:
      return ReserveWrites(req.body_as_ReserveWrites());
    case fb::Body::BatchPutCommit:
      return WriteCommit(req.body_as_BatchPutCommit());
    case fb::Body::ReportBadReplicas:
      return ReportBadReplicas(req.body_as_ReportBadReplicas());
    case fb::Body::BatchGet:
      return BatchGet(req.body_as_BatchGet());
    case fb::Body::BatchExist:
      return BatchExist(req.body_as_BatchExist());
    case fb::Body::BatchRemove:
      return BatchRemove(req.body_as_BatchRemove());
    case fb::Body::RemoveAll:
      return RemoveAll(req.body_as_RemoveAll());
    case fb::Body::ListKeys:
      return ListKeys(req.body_as_ListKeys());
    case fb::Body::SessionStats:
      return SessionStats(req.body_as_SessionStats());
    case fb::Body::Stats:
      return Stats();
    case fb::Body::Replicate:
      return Replicate(req.body_as_Replicate());
    default:
      break;
  }
  return Bad(InvalidParams("unknown request type " +
                           std::to_string(static_cast<int>(req.body_type())) +
                           "; the master speaks master.fbs as of this build: upgrade it"));
}

Reply MasterRpc::Call::PlacementReply(const Status& status) {
  const PlacementBatch& pb = s_.placement_batch;
  auto [codes, msgs] = BuildCodes(b_, pb.results, &s_.codes, &s_.strings);
  s_.placements.clear();
  s_.pool_ids.clear();
  for (const Placement& p : pb.placements) {
    s_.placements.emplace_back(p.part, p.pool_id, p.offset, p.length, p.checksum, p.checksummed);
    s_.pool_ids.push_back(p.pool_id);
  }
  std::sort(s_.pool_ids.begin(), s_.pool_ids.end());
  s_.pool_ids.erase(std::unique(s_.pool_ids.begin(), s_.pool_ids.end()), s_.pool_ids.end());
  s_.pools.clear();
  for (PoolId pool_id : s_.pool_ids) {
    auto view = service_.FindPool(pool_id);
    if (!view) continue;
    s_.pool_endpoints.clear();
    for (const std::string& ep : view->endpoints) s_.pool_endpoints.push_back(b_.CreateString(ep));
    s_.pools.push_back(fb::CreatePoolInfo(b_, pool_id, view->agent,
                                          b_.CreateVector(s_.pool_endpoints), view->incarnation));
  }
  auto first = b_.CreateVector(pb.first);
  auto placements = b_.CreateVectorOfStructs(s_.placements);
  auto pools = b_.CreateVector(s_.pools);
  auto sizes = pb.sizes.empty() ? 0 : b_.CreateVector(pb.sizes).o;
  auto write_ids = pb.write_ids.empty() ? 0 : b_.CreateVector(pb.write_ids).o;
  fb::PlacementReplyBuilder r(b_);
  r.add_codes(codes);
  if (!msgs.IsNull()) r.add_messages(msgs);
  r.add_first(first);
  r.add_placements(placements);
  r.add_pools(pools);
  if (sizes) r.add_sizes(flatbuffers::Offset<flatbuffers::Vector<uint64_t>>(sizes));
  if (write_ids) {
    r.add_write_ids(flatbuffers::Offset<flatbuffers::Vector<uint64_t>>(write_ids));
  }
  r.add_lease_ttl_ms(pb.lease_ttl_ms);
  r.add_master_epoch(service_.epoch());
  return Finish(b_, epoch_, id_, status, fb::ReplyBody::PlacementReply, r.Finish().Union());
}

Reply MasterRpc::Call::CodesReply(const Status& status, uint64_t removed_count) {
  const KeyResults& kr = s_.key_results;
  auto [codes, msgs] = BuildCodes(b_, kr.results, &s_.codes, &s_.strings);
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> exists;
  if (!kr.exists.empty()) exists = b_.CreateVector(kr.exists);
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> replicas;
  if (!kr.replicas.empty()) replicas = b_.CreateVector(kr.replicas);
  fb::KeyCodesReplyBuilder r(b_);
  r.add_codes(codes);
  if (!msgs.IsNull()) r.add_messages(msgs);
  if (!exists.IsNull()) r.add_exists(exists);
  if (!replicas.IsNull()) r.add_replicas(replicas);
  r.add_removed_count(removed_count);
  return Finish(b_, epoch_, id_, status, fb::ReplyBody::KeyCodesReply, r.Finish().Union());
}

WriteStartRequest MasterRpc::Call::ReadStart(const fb::WriteStart* m) {
  CollectStrings(m->keys(), &s_.keys);
  CollectStrings(m->session_ids(), &s_.sessions);
  s_.blocks.clear();
  s_.hashes.clear();
  if (const auto* blocks = m->blocks()) {
    // One flat hash store for the whole batch; reserved first so the views stay valid.
    size_t total = 0;
    for (const fb::BlockMeta* bm : *blocks) {
      total += bm->block_hashes() ? bm->block_hashes()->size() : 0;
    }
    s_.hashes.reserve(total);
    for (const fb::BlockMeta* bm : *blocks) {
      BlockMetaView v;
      const size_t start = s_.hashes.size();
      if (bm->block_hashes()) {
        for (const block_proto::BlockHash* h : *bm->block_hashes()) {
          s_.hashes.push_back(events::BlockHash{h->bits(), h->is_signed()});
        }
      }
      v.block_hashes = std::span(s_.hashes).subspan(start, s_.hashes.size() - start);
      if (bm->parent_block_hash() && bm->parent_block_hash()->size() > 0) {
        const block_proto::BlockHash* p = bm->parent_block_hash()->Get(0);
        v.parent_block_hash = events::BlockHash{p->bits(), p->is_signed()};
      }
      v.token_ids = SpanOf(bm->token_ids());
      v.block_size = bm->block_size();
      if (bm->lora_name()) v.lora_name = bm->lora_name()->string_view();
      s_.blocks.push_back(v);
    }
  }
  WriteStartRequest w;
  w.agent = m->agent_id();
  w.keys = s_.keys;
  w.sizes = SpanOf(m->sizes());
  w.session_ids = s_.sessions;
  w.blocks = s_.blocks;
  if (const fb::WriteOptions* o = m->options()) {
    w.options.replica_count = o->replica_count();
    w.options.soft_pin = o->soft_pin();
    w.options.soft_pin_ttl_ms = o->soft_pin_ttl_ms();
    w.options.hard_pin = o->hard_pin();
  }
  return w;
}

WriteEndRequest MasterRpc::Call::ReadFinish(const fb::WriteFinish* m,
                                            std::span<const std::string_view> keys) {
  WriteEndRequest w;
  w.agent = m->agent_id();
  w.keys = keys;
  w.write_ids = SpanOf(m->write_ids());
  w.part_counts = SpanOf(m->part_counts());
  w.checksums = SpanOf(m->checksums());
  s_.failed.clear();
  if (const auto* failed = m->failed()) {
    s_.failed.reserve(failed->size());
    for (const fb::FailedReplica* f : *failed) {
      s_.failed.push_back(FailedReplica{f->key(), f->part(), f->pool_id()});
    }
  }
  w.failed = s_.failed;
  return w;
}

Reply MasterRpc::Call::RegisterAgent(const fb::RegisterAgent* m, uint64_t agent_key) {
  const uint64_t refusals = service_.agent_key_refusals();
  auto r = service_.RegisterAgent(m->name() ? m->name()->string_view() : "", m->incarnation(),
                                  agent_key);
  if (!r.ok()) {
    rpc_.last_.agent_key_refused = service_.agent_key_refusals() != refusals;
    return Finish(b_, epoch_, id_, r.status(), fb::ReplyBody::NONE, 0);
  }
  const std::string& events = rpc_.events_endpoint_;
  const std::string& framed = rpc_.framed_endpoint_;
  return Finish(b_, epoch_, id_, Status::Ok(), fb::ReplyBody::RegisterAgentReply,
                fb::CreateRegisterAgentReplyDirect(
                    b_, r.value(), service_.epoch(), events.empty() ? nullptr : events.c_str(),
                    events.empty() ? nullptr : rpc_.events_replay_endpoint_.c_str(),
                    framed.empty() ? nullptr : framed.c_str())
                    .Union());
}

Reply MasterRpc::Call::MountPool(const fb::MountPool* m) {
  CollectStrings(m->endpoints(), &s_.endpoints);
  auto r = service_.MountPool(m->agent_id(), m->pool_index(), m->size(), s_.endpoints);
  if (!r.ok()) return Finish(b_, epoch_, id_, r.status(), fb::ReplyBody::NONE, 0);
  return Finish(b_, epoch_, id_, Status::Ok(), fb::ReplyBody::MountPoolReply,
                fb::CreateMountPoolReply(b_, r->pool_id, r->restored_objects).Union());
}

Reply MasterRpc::Call::Heartbeat(const fb::Heartbeat* m) {
  const HeartbeatResult h = service_.Heartbeat(m->agent_id(), m->fence_ack());
  auto fenced = h.fenced_writes.empty() ? 0 : b_.CreateVector(h.fenced_writes).o;
  fb::HeartbeatReplyBuilder r(b_);
  r.add_known(h.known);
  r.add_fence_seq(h.fence_seq);
  r.add_write_watermark(h.write_watermark);
  if (fenced) r.add_fenced_writes(flatbuffers::Offset<flatbuffers::Vector<uint64_t>>(fenced));
  return Finish(b_, epoch_, id_, Status::Ok(), fb::ReplyBody::HeartbeatReply, r.Finish().Union());
}

Reply MasterRpc::Call::WriteStart(const fb::WriteStart* m, bool upsert) {
  const WriteStartRequest w = ReadStart(m);
  Status st = upsert ? service_.BatchUpsertStart(w, &s_.placement_batch)
                     : service_.BatchPutStart(w, &s_.placement_batch);
  return PlacementReply(st);
}

Reply MasterRpc::Call::WriteEnd(const fb::WriteFinish* m) {
  CollectStrings(m->keys(), &s_.keys);
  return CodesReply(service_.BatchPutEnd(ReadFinish(m, s_.keys), &s_.key_results), 0);
}

Reply MasterRpc::Call::WriteRevoke(const fb::WriteFinish* m) {
  CollectStrings(m->keys(), &s_.keys);
  return CodesReply(
      service_.BatchPutRevoke(m->agent_id(), s_.keys, SpanOf(m->write_ids()), &s_.key_results), 0);
}

Reply MasterRpc::Call::WriteCommit(const fb::WriteCommit* m) {
  if (m == nullptr || m->start() == nullptr || m->finish() == nullptr) {
    return Bad(InvalidParams("BatchPutCommit needs its start and its finish"));
  }
  WriteCommitRequest c;
  c.start = ReadStart(m->start());
  c.finish = ReadFinish(m->finish(), s_.keys);  // the start's keys
  if (c.finish.agent != c.start.agent) {
    return Bad(InvalidParams("a commit's start and finish name different agents"));
  }
  c.master_epoch = m->master_epoch();
  return CodesReply(service_.BatchPutCommit(c, &s_.key_results), 0);
}

Reply MasterRpc::Call::ReserveWrites(const fb::ReserveWrites* m) {
  if (m == nullptr) return Bad(InvalidParams("ReserveWrites without its body"));
  ReserveWritesRequest r;
  r.agent = m->agent_id();
  r.size = m->size();
  r.replica_count = m->replica_count();
  r.count = m->count();
  r.returned = SpanOf(m->returned());
  return PlacementReply(service_.ReserveWrites(r, &s_.placement_batch));
}

Reply MasterRpc::Call::ReportBadReplicas(const fb::ReportBadReplicas* m) {
  CollectStrings(m->keys(), &s_.keys);
  const auto versions = SpanOf(m->versions());
  const auto parts = SpanOf(m->parts());
  const auto pools = SpanOf(m->pool_ids());
  if (versions.size() != s_.keys.size() || parts.size() != s_.keys.size() ||
      pools.size() != s_.keys.size()) {
    return Bad(
        InvalidParams("ReportBadReplicas: keys, versions, parts and pool_ids must "
                      "have the same length"));
  }
  s_.bad.clear();
  for (size_t i = 0; i < s_.keys.size(); ++i) {
    s_.bad.push_back(BadReplica{s_.keys[i], versions[i], parts[i], pools[i]});
  }
  return CodesReply(service_.ReportBadReplicas(s_.bad, &s_.key_results), 0);
}

Reply MasterRpc::Call::BatchGet(const fb::BatchGet* m) {
  CollectStrings(m->keys(), &s_.keys);
  return PlacementReply(service_.BatchGet(s_.keys, &s_.placement_batch));
}

Reply MasterRpc::Call::BatchExist(const fb::BatchExist* m) {
  CollectStrings(m->keys(), &s_.keys);
  return CodesReply(service_.BatchExist(s_.keys, &s_.key_results), 0);
}

Reply MasterRpc::Call::BatchRemove(const fb::BatchRemove* m) {
  CollectStrings(m->keys(), &s_.keys);
  return CodesReply(service_.BatchRemove(s_.keys, m->force(), &s_.key_results), 0);
}

Reply MasterRpc::Call::RemoveAll(const fb::RemoveAll* m) {
  auto r = service_.RemoveAll(m->force());
  s_.key_results.Clear();
  if (!r.ok()) return CodesReply(r.status(), 0);
  return CodesReply(Status::Ok(), r.value());
}

Reply MasterRpc::Call::ListKeys(const fb::ListKeys* m) {
  const std::string_view prefix = m->prefix() ? m->prefix()->string_view() : "";
  Status st = service_.ListKeys(m->cursor(), m->limit(), &s_.page, prefix);
  std::vector<flatbuffers::Offset<fb::ListedKey>> keys;
  keys.reserve(s_.page.keys.size());
  for (const ListedKey& k : s_.page.keys) {
    auto key = b_.CreateString(k.key);
    auto session = k.session_id.empty() ? 0 : b_.CreateString(k.session_id).o;
    auto block = k.has_writer_meta ? EncodeBlockMeta(b_, k.announcement).o : 0;
    fb::ListedKeyBuilder lk(b_);
    lk.add_key(key);
    lk.add_size(k.size);
    if (session) lk.add_session_id(flatbuffers::Offset<flatbuffers::String>(session));
    if (block) lk.add_block(flatbuffers::Offset<fb::BlockMeta>(block));
    keys.push_back(lk.Finish());
  }
  auto body =
      fb::CreateListKeysReply(b_, b_.CreateVector(keys), s_.page.next_cursor, s_.page.restarted);
  return Finish(b_, epoch_, id_, st, fb::ReplyBody::ListKeysReply, body.Union());
}

Reply MasterRpc::Call::SessionStats(const fb::SessionStats* m) {
  const std::string_view session =
      m->session_id() ? m->session_id()->string_view() : std::string_view();
  if (!session.empty()) {
    if (Status st = ValidateSessionId(session); !st.ok()) return Bad(st);
  }
  std::vector<MasterService::SessionUsage> usage;
  uint64_t next_cursor = 0;
  service_.SessionStats(session, m->cursor(), m->limit(), &usage, &next_cursor);
  std::vector<flatbuffers::Offset<fb::SessionUsage>> out;
  out.reserve(usage.size());
  for (const MasterService::SessionUsage& u : usage) {
    out.push_back(fb::CreateSessionUsageDirect(b_, u.session_id.c_str(), u.blocks, u.bytes));
  }
  auto body = fb::CreateSessionStatsReply(b_, b_.CreateVector(out), next_cursor);
  return Finish(b_, epoch_, id_, Status::Ok(), fb::ReplyBody::SessionStatsReply, body.Union());
}

Reply MasterRpc::Call::Stats() {
  const std::vector<std::pair<std::string, uint64_t>> all = rpc_.StatCounters();
  std::vector<flatbuffers::Offset<flatbuffers::String>> names;
  std::vector<uint64_t> values;
  for (const auto& [n, v] : all) {
    names.push_back(b_.CreateString(n));
    values.push_back(v);
  }
  auto body = fb::CreateStatsReply(b_, b_.CreateVector(names), b_.CreateVector(values));
  return Finish(b_, epoch_, id_, Status::Ok(), fb::ReplyBody::StatsReply, body.Union());
}

Reply MasterRpc::Call::Replicate(const fb::Replicate* m) {
  LastRequest& last = rpc_.last_;
  last.replicate = true;
  last.after_seq = m->after_seq();
  last.master_epoch = m->master_epoch();
  last.wait_ms = m->wait_ms();
  if (m->follower() != nullptr) last.follower = m->follower()->str();
  last.electable = m->electable();
  ReplicationPage page;
  const size_t max_bytes = std::clamp<size_t>(m->max_bytes(), 4096, 64u << 20);
  Status st = service_.ReadReplication(m->after_seq(), m->master_epoch(), max_bytes, &page,
                                       rpc_.background_snapshots_);
  if (!st.ok()) return Finish(b_, epoch_, id_, st, fb::ReplyBody::NONE, 0);
  if (page.pending) {
    last.replicate_pending = true;
    return Finish(b_, epoch_, id_,
                  Status(ErrorCode::kMasterUnavailable,
                         "the snapshot of the state this follower needs is being built; ask again"),
                  fb::ReplyBody::NONE, 0);
  }
  last.replicate_empty = !page.snapshot && page.bytes().empty();
  // A page of records after the follower's position is usually small and frequent: copied, it
  // costs less than a part of its own. A snapshot, or a page of 64 KiB or more, is detached.
  constexpr size_t kMinDetachedPageBytes = 64 << 10;
  const bool detach = m->detached_records() && rpc_.may_detach_ && !page.bytes().empty() &&
                      (page.snapshot || page.bytes().size() >= kMinDetachedPageBytes);
  const uint64_t limit = detach ? rpc_.max_detached_replication_ : rpc_.max_inline_replication_;
  if (page.bytes().size() > limit) {
    // Only a snapshot can be this large (a page of records stops at max_bytes, 64 MiB at most).
    const std::string what =
        "the " + std::string(page.snapshot ? "snapshot" : "page") + " this follower needs is " +
        std::to_string(page.bytes().size()) + " bytes, more than the " + std::to_string(limit) +
        " one reply can carry" +
        (detach ? std::string()
                : std::string(" inside it (a follower that asks for detached_records takes up "
                              "to ") +
                      std::to_string(rpc_.max_detached_replication_) + ")") +
        "; this master's state cannot be replicated to it";
    LOG_EVERY_N(ERROR, 100) << "Replicate from follower '" << last.follower << "': " << what;
    return Finish(b_, epoch_, id_, Status(ErrorCode::kNoSpace, what), fb::ReplyBody::NONE, 0);
  }
  if (detach) {
    // Sent from where they lie: a snapshot the background built stays mapped until the
    // transport is done with it; records read here move into memory the transport holds.
    if (page.shared_owner != nullptr) {
      last.detached = page.shared;
      last.detached_owner = std::move(page.shared_owner);
    } else {
      auto owned = std::make_shared<const std::string>(std::move(page.records));
      last.detached = *owned;
      last.detached_owner = std::move(owned);
    }
    auto body = fb::CreateReplicateReply(b_, service_.epoch(), page.snapshot, page.last_seq, 0,
                                         last.detached.size());
    return Finish(b_, epoch_, id_, Status::Ok(), fb::ReplyBody::ReplicateReply, body.Union());
  }
  auto records =
      b_.CreateVector(reinterpret_cast<const uint8_t*>(page.bytes().data()), page.bytes().size());
  auto body = fb::CreateReplicateReply(b_, service_.epoch(), page.snapshot, page.last_seq, records);
  return Finish(b_, epoch_, id_, Status::Ok(), fb::ReplyBody::ReplicateReply, body.Union());
}

std::vector<std::pair<std::string, uint64_t>> MasterRpc::StatCounters() const {
  std::vector<std::pair<std::string, uint64_t>> all;
  StatCounters(&all);
  return all;
}

void MasterRpc::StatCounters(std::vector<std::pair<std::string, uint64_t>>* out) const {
  const MasterStats st = service_->Stats();
  out->clear();  // keeps its capacity
  const std::pair<const char*, uint64_t> own[] = {
      {"keys", st.keys},
      {"writes_in_flight", st.writes_in_flight},
      {"bytes_used", st.bytes_used},
      {"bytes_capacity", st.bytes_capacity},
      {"agents", st.agents},
      {"pools", st.pools},
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
      {"name_conflicts", st.name_conflicts},
      {"agent_key_refusals", st.agent_key_refusals},
  };
  for (const auto& [name, value] : own) out->emplace_back(name, value);
  if (extra_stats_) extra_stats_(out);
}

}  // namespace kvagent::master

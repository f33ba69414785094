#include "pipeline_fakes.h"

#include "kvagent/common/checksum.h"

#include <algorithm>

namespace kvagent::agent::testing {

using flatbuffers::Offset;

// ---- MasterCall, FakeMaster -----------------------------------------------------------------

std::vector<std::string> MasterCall::keys() const {
  const mfb::Request& r = request();
  const flatbuffers::Vector<Offset<flatbuffers::String>>* keys = nullptr;
  switch (r.body_type()) {
    case mfb::Body::BatchPutStart:
    case mfb::Body::BatchUpsertStart:
      keys = static_cast<const mfb::WriteStart*>(r.body())->keys();
      break;
    case mfb::Body::BatchPutEnd:
    case mfb::Body::BatchPutRevoke:
    case mfb::Body::BatchUpsertEnd:
    case mfb::Body::BatchUpsertRevoke:
      keys = finish()->keys();
      break;
    case mfb::Body::BatchGet:
      keys = r.body_as_BatchGet()->keys();
      break;
    case mfb::Body::BatchExist:
      keys = r.body_as_BatchExist()->keys();
      break;
    case mfb::Body::BatchRemove:
      keys = r.body_as_BatchRemove()->keys();
      break;
    case mfb::Body::ReportBadReplicas:
      keys = r.body_as_ReportBadReplicas()->keys();
      break;
    default:
      break;
  }
  std::vector<std::string> out;
  if (keys != nullptr) {
    for (const flatbuffers::String* k : *keys) out.push_back(k->str());
  }
  return out;
}

const mfb::WriteFinish* MasterCall::finish() const {
  return static_cast<const mfb::WriteFinish*>(request().body());
}

void FakeMaster::Record(flatbuffers::DetachedBuffer request, MasterReplyFn done, bool until,
                        Clock::time_point retry_until) {
  MasterCall call;
  call.bytes.assign(request.data(), request.data() + request.size());
  flatbuffers::Verifier verifier(call.bytes.data(), call.bytes.size());
  EXPECT_TRUE(verifier.VerifyBuffer<mfb::Request>(nullptr)) << "the pipeline sent a bad request";
  call.done = std::move(done);
  call.until_answered = until;
  call.retry_until = retry_until;
  log_.push_back(call.bytes);
  pending_.push_back(std::move(call));
}

MasterCall FakeMaster::Take(mfb::Body type) {
  if (pending_.empty()) {
    ADD_FAILURE() << "no master call is waiting; expected " << mfb::EnumNameBody(type);
    return MasterCall{};
  }
  MasterCall call = std::move(pending_.front());
  pending_.pop_front();
  EXPECT_EQ(call.type(), type) << "got " << mfb::EnumNameBody(call.type()) << ", expected "
                               << mfb::EnumNameBody(type);
  return call;
}

size_t FakeMaster::CountCalls(mfb::Body type) const {
  return std::count_if(log_.begin(), log_.end(), [type](const std::vector<uint8_t>& b) {
    return flatbuffers::GetRoot<mfb::Request>(b.data())->body_type() == type;
  });
}

// ---- replies --------------------------------------------------------------------------------

namespace {

std::vector<uint8_t> Bytes(flatbuffers::FlatBufferBuilder& fbb) {
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

Offset<flatbuffers::Vector<Offset<flatbuffers::String>>> Messages(
    flatbuffers::FlatBufferBuilder& fbb, const std::vector<std::string>& messages) {
  bool any = std::any_of(messages.begin(), messages.end(), [](auto& m) { return !m.empty(); });
  return any ? fbb.CreateVectorOfStrings(messages) : 0;
}

}  // namespace

std::vector<uint8_t> PlacementReply(uint64_t id, const std::vector<PlacedKey>& keys,
                                    const std::vector<PoolAt>& pools, bool with_sizes,
                                    uint32_t lease_ttl_ms) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<uint16_t> codes;
  std::vector<std::string> messages;
  std::vector<uint32_t> first = {0};
  std::vector<mfb::Placement> placements;
  std::vector<uint64_t> sizes, write_ids;
  for (const PlacedKey& k : keys) {
    codes.push_back(static_cast<uint16_t>(k.code));
    messages.push_back(k.message);
    sizes.push_back(k.size);
    write_ids.push_back(k.write_id);
    for (const ReplicaAt& r : k.replicas) {
      placements.emplace_back(r.part, r.pool, r.offset, r.length, r.checksum, r.checksummed);
    }
    first.push_back(static_cast<uint32_t>(placements.size()));
  }
  std::vector<Offset<mfb::PoolInfo>> infos;
  for (const PoolAt& s : pools) {
    infos.push_back(
        mfb::CreatePoolInfo(fbb, s.id, 1, fbb.CreateVectorOfStrings({s.endpoint}), s.incarnation));
  }
  const auto body =
      mfb::CreatePlacementReply(fbb, fbb.CreateVector(codes), Messages(fbb, messages),
                                fbb.CreateVector(first), fbb.CreateVectorOfStructs(placements),
                                fbb.CreateVector(infos), with_sizes ? fbb.CreateVector(sizes) : 0,
                                lease_ttl_ms, fbb.CreateVector(write_ids), kMasterEpoch);
  fbb.Finish(mfb::CreateReply(fbb, id, 0, 0, mfb::ReplyBody::PlacementReply, body.Union()));
  return Bytes(fbb);
}

std::vector<uint8_t> KeyCodesReply(uint64_t id, const std::vector<ErrorCode>& codes,
                                   const std::vector<uint8_t>& replicas,
                                   const std::vector<bool>& exists, uint64_t removed_count) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<uint16_t> wire;
  std::vector<std::string> messages;
  for (ErrorCode c : codes) {
    wire.push_back(static_cast<uint16_t>(c));
    messages.push_back(
        c == ErrorCode::kOk ? "" : "the fake master says " + std::string(ErrorCodeName(c)));
  }
  std::vector<uint8_t> exist_bytes(exists.begin(), exists.end());
  const auto body =
      mfb::CreateKeyCodesReply(fbb, fbb.CreateVector(wire), Messages(fbb, messages),
                               exists.empty() ? 0 : fbb.CreateVector(exist_bytes), removed_count,
                               replicas.empty() ? 0 : fbb.CreateVector(replicas));
  fbb.Finish(mfb::CreateReply(fbb, id, 0, 0, mfb::ReplyBody::KeyCodesReply, body.Union()));
  return Bytes(fbb);
}

std::vector<uint8_t> ListKeysReply(uint64_t id, const std::vector<ListedAt>& keys,
                                   uint64_t next_cursor, bool restarted) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<Offset<mfb::ListedKey>> listed;
  for (const ListedAt& k : keys) {
    listed.push_back(mfb::CreateListedKey(fbb, fbb.CreateString(k.key), k.size,
                                          k.session.empty() ? 0 : fbb.CreateString(k.session)));
  }
  const auto body = mfb::CreateListKeysReply(fbb, fbb.CreateVector(listed), next_cursor, restarted);
  fbb.Finish(mfb::CreateReply(fbb, id, 0, 0, mfb::ReplyBody::ListKeysReply, body.Union()));
  return Bytes(fbb);
}

std::vector<uint8_t> StatsReply(uint64_t id,
                                const std::vector<std::pair<std::string, uint64_t>>& stats) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<std::string> names;
  std::vector<uint64_t> values;
  for (const auto& [n, v] : stats) {
    names.push_back(n);
    values.push_back(v);
  }
  const auto body =
      mfb::CreateStatsReply(fbb, fbb.CreateVectorOfStrings(names), fbb.CreateVector(values));
  fbb.Finish(mfb::CreateReply(fbb, id, 0, 0, mfb::ReplyBody::StatsReply, body.Union()));
  return Bytes(fbb);
}

std::vector<uint8_t> RefusedReply(uint64_t id, ErrorCode code, const std::string& message) {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(mfb::CreateReply(fbb, id, static_cast<uint16_t>(code), fbb.CreateString(message)));
  return Bytes(fbb);
}

// ---- FakeDataPlane --------------------------------------------------------------------------

std::vector<transfer::TransferOp> FakeDataPlane::RunOne() {
  if (batches_.empty()) {
    ADD_FAILURE() << "no transfer batch is waiting";
    return {};
  }
  Batch batch = std::move(batches_.front());
  batches_.pop_front();
  std::vector<Status> results;
  for (const transfer::TransferOp& op : batch.ops) {
    ops_run_.push_back(op);
    if (auto r = refused_.find(op.peer); r != refused_.end()) {
      results.push_back(r->second);
      continue;
    }
    auto p = peers_.find(op.peer);
    if (p == peers_.end()) {
      results.push_back(Status(ErrorCode::kTransferFailed, "no such peer " + op.peer));
      continue;
    }
    std::vector<uint8_t>& pool = p->second;
    if (op.remote_offset > pool.size() || op.length > pool.size() - op.remote_offset) {
      results.push_back(Status(ErrorCode::kBufferOutOfRange, "outside the peer's pool"));
      continue;
    }
    auto* local = static_cast<uint8_t*>(op.local);
    if (op.kind == transfer::TransferKind::kWrite) {
      std::memcpy(pool.data() + op.remote_offset, local, op.length);
    } else {
      std::memcpy(local, pool.data() + op.remote_offset, op.length);
      // As the TCP transport: the CRC of the bytes as they arrived, not of `local` afterwards.
      if (op.received != nullptr) {
        *op.received = {Crc32c(pool.data() + op.remote_offset, op.length), true};
      }
    }
    results.push_back(Status::Ok());
  }
  batch.done(std::move(results));
  return batch.ops;
}

// ---- FakeSink -------------------------------------------------------------------------------

const CompletionData& FakeSink::Of(uint64_t request_id) const {
  for (const Completed& c : completed) {
    if (c.request_id == request_id) return c.data;
  }
  ADD_FAILURE() << "request " << request_id << " was not completed";
  static const CompletionData kNone;
  return kNone;
}

bool FakeSink::Has(uint64_t request_id) const {
  return std::any_of(completed.begin(), completed.end(),
                     [&](const Completed& c) { return c.request_id == request_id; });
}

// ---- TestClient -----------------------------------------------------------------------------

TestClient::TestClient(ClientId id, uint64_t arena_bytes) : id_(id) {
  auto layout = ipc::SegmentLayout::Compute(4096, 4096, arena_bytes);
  EXPECT_TRUE(layout.ok());
  auto segment = ipc::Segment::Create(*layout, 1, id);
  EXPECT_TRUE(segment.ok()) << segment.status().ToString();
  segment_ = std::make_shared<ipc::Segment>(std::move(*segment));
}

proto::BufferRef TestClient::Reserve(uint64_t bytes) {
  const uint64_t offset = next_offset_;
  next_offset_ += (bytes + 63) / 64 * 64;
  EXPECT_LE(next_offset_, arena().size()) << "the test client's arena is full";
  return proto::BufferRef(offset, bytes);
}

proto::BufferRef TestClient::Place(const std::string& value) {
  proto::BufferRef ref = Reserve(value.size());
  std::memcpy(arena().data() + ref.offset(), value.data(), value.size());
  return ref;
}

uint64_t TestClient::NextRequestId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

ClientRequest TestClient::Make(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id) {
  ClientRequest r;
  r.client_id = id_;
  r.request_id = request_id;
  r.frame.assign(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  r.segment = segment_;
  return r;
}

namespace {

uint64_t DeadlineNs(std::optional<Clock::time_point> deadline) {
  if (!deadline) return 0;
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline->time_since_epoch()).count());
}

}  // namespace

ClientRequest TestClient::Put(const std::vector<std::string>& keys,
                              const std::vector<std::string>& values, const WriteArgs& args) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<proto::BufferRef> refs;
  for (const std::string& v : values) refs.push_back(Place(v));
  const uint64_t id = NextRequestId();
  const auto k = fbb.CreateVectorOfStrings(keys);
  const auto s = args.sessions.empty() ? 0 : fbb.CreateVectorOfStrings(args.sessions);
  const auto b = fbb.CreateVectorOfStructs(refs);
  const auto o = proto::CreateWriteOptions(fbb, args.replicas);
  proto::RequestBuilder rb(fbb);
  rb.add_request_id(id);
  rb.add_op(args.upsert ? proto::Op::Upsert : proto::Op::Put);
  rb.add_keys(k);
  if (!s.IsNull()) rb.add_session_ids(s);
  rb.add_buffers(b);
  rb.add_options(o);
  if (args.deadline) {
    rb.add_timeout_ms(60000);
    rb.add_deadline_ns(DeadlineNs(args.deadline));
  }
  fbb.Finish(rb.Finish());
  return Make(fbb, id);
}

ClientRequest TestClient::Get(const std::vector<std::string>& keys,
                              const std::vector<uint64_t>& capacities,
                              std::optional<Clock::time_point> deadline) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<proto::BufferRef> refs;
  for (uint64_t c : capacities) {
    refs.push_back(Reserve(c));
    std::memset(arena().data() + refs.back().offset(), 0xEE, c);
  }
  const uint64_t id = NextRequestId();
  const auto k = fbb.CreateVectorOfStrings(keys);
  const auto b = fbb.CreateVectorOfStructs(refs);
  proto::RequestBuilder rb(fbb);
  rb.add_request_id(id);
  rb.add_op(proto::Op::Get);
  rb.add_keys(k);
  rb.add_buffers(b);
  if (deadline) {
    rb.add_timeout_ms(60000);
    rb.add_deadline_ns(DeadlineNs(deadline));
  }
  fbb.Finish(rb.Finish());
  return Make(fbb, id);
}

ClientRequest TestClient::Keys(proto::Op op, const std::vector<std::string>& keys, bool force) {
  flatbuffers::FlatBufferBuilder fbb;
  const uint64_t id = NextRequestId();
  const auto k = fbb.CreateVectorOfStrings(keys);
  proto::RequestBuilder rb(fbb);
  rb.add_request_id(id);
  rb.add_op(op);
  rb.add_keys(k);
  rb.add_force(force);
  fbb.Finish(rb.Finish());
  return Make(fbb, id);
}

ClientRequest TestClient::List(const std::string& prefix, uint64_t cursor, uint32_t limit) {
  flatbuffers::FlatBufferBuilder fbb;
  const uint64_t id = NextRequestId();
  const auto p = prefix.empty() ? 0 : fbb.CreateString(prefix);
  proto::RequestBuilder rb(fbb);
  rb.add_request_id(id);
  rb.add_op(proto::Op::List);
  if (!p.IsNull()) rb.add_prefix(p);
  rb.add_cursor(cursor);
  rb.add_limit(limit);
  fbb.Finish(rb.Finish());
  return Make(fbb, id);
}

ClientRequest TestClient::Single(proto::Op op, bool force) {
  flatbuffers::FlatBufferBuilder fbb;
  const uint64_t id = NextRequestId();
  proto::RequestBuilder rb(fbb);
  rb.add_request_id(id);
  rb.add_op(op);
  rb.add_force(force);
  fbb.Finish(rb.Finish());
  return Make(fbb, id);
}

std::string TestClient::Bytes(const ClientRequest& request, size_t i, uint64_t length) const {
  const proto::BufferRef* b = request.request().buffers()->Get(static_cast<uint32_t>(i));
  return std::string(reinterpret_cast<const char*>(arena().data() + b->offset()), length);
}

// ---- PipelineRig ----------------------------------------------------------------------------

PipelineRig::PipelineRig(bool checksums, uint64_t pool_bytes) {
  transfer::NodePoolOptions o;
  o.size_bytes = pool_bytes;
  o.huge_pages = false;
  auto pool = transfer::NodePool::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  pool_ = std::move(*pool);
  auto m = std::make_unique<FakeMaster>();
  master = m.get();
  auto d = std::make_unique<FakeDataPlane>();
  data = d.get();
  fence_ = std::make_unique<transfer::PoolFence>(kOwnIncarnation);
  fence_->SetEpoch(kMasterEpoch);
  pipeline_ = std::make_unique<RequestPipeline>(std::move(m), pool_.get(), std::move(d),
                                                fence_.get(), checksums);
  pipeline_->OnStart(sink);
}

PipelineRig::~PipelineRig() { pipeline_->OnServiceStop(); }

uint64_t PipelineRig::Send(ClientRequest request) {
  const uint64_t id = request.request_id;
  pipeline_->Handle(std::move(request), sink);
  pipeline_->OnPassEnd();
  return id;
}

void PipelineRig::SendTogether(std::vector<ClientRequest> requests) {
  for (ClientRequest& r : requests) pipeline_->Handle(std::move(r), sink);
  pipeline_->OnPassEnd();
}

void PipelineRig::Settle() {
  while (data->waiting() > 0) {
    data->RunAll();
    sink.RunPosted();
  }
  sink.RunPosted();
  pipeline_->OnPassEnd();
}

uint64_t PipelineRig::Counter(const std::string& name) {
  TestClient client(999, 4096);
  const uint64_t id = Send(client.Single(proto::Op::Stat));
  MasterCall call = master->Take(mfb::Body::Stats);
  Answer(call, StatsReply(call.id(), {}));
  pipeline_->OnPassEnd();
  for (const kvagent::agent::Counter& c : sink.Of(id).counters) {
    if (c.name == name) return c.value;
  }
  ADD_FAILURE() << "no counter " << name;
  return 0;
}

std::string Pattern(const std::string& seed, size_t n) {
  std::string out(n, '\0');
  uint32_t x = Crc(seed) | 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245 + 12345;
    out[i] = static_cast<char>(x >> 16);
  }
  return out;
}

}  // namespace kvagent::agent::testing

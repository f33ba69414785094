// The batch base, and the batches of one master call: Exist, Remove, RemoveAll, List, Stat.
#include "batch.h"

#include <algorithm>

#include "pipeline_stats.h"

namespace kvagent::agent {
namespace {

using flatbuffers::uoffset_t;

// The master pages ListKeys by hash slots; a page this large keeps round trips few while a
// page of maximal keys (4 KiB each) still fits the default 1 MiB completion ring.
constexpr uint32_t kListPageLimit = 256;
// Key bytes after which a List page is returned even when short of its limit.
constexpr uint64_t kListPageBytes = 128 << 10;
// Master pages scanned for one List page before returning what was found (a rare prefix must
// not make one request scan the whole store).
constexpr uint32_t kListMaxMasterPages = 64;
constexpr uint32_t kDefaultListLimit = 1000;

}  // namespace

Batch::Batch(PipelineContext& ctx, MasterMessages& messages, std::vector<HeldRequest> requests)
    : ctx_(ctx), messages_(messages), requests_(std::move(requests)) {}

void Batch::ClientGone(ClientId client) {
  for (HeldRequest& h : requests_) {
    if (h.request.client_id == client && !h.gone) {
      h.gone = true;
      ++ctx_.counters.abandoned_requests;
    }
  }
}

void Batch::CompleteAll() {
  for (HeldRequest& h : requests_) ctx_.Complete(h);
  ctx_.sink->PublishCompletions();  // the callers stop waiting now, not at the end of the pass
  finished_ = true;
}

void Batch::FailAll(const Status& status) {
  if (status.code() == ErrorCode::kMasterUnavailable || status.code() == ErrorCode::kTimeout) {
    ++ctx_.counters.master_failures;
  }
  for (HeldRequest& h : requests_) h.FailAll(status);
  CompleteAll();
}

void Batch::FailExpired(KeyRef k, std::string_view skipped) {
  ++ctx_.counters.expired_keys;
  const Status late = DeadlinePassed(skipped);
  held(k).SetKey(k.index, late.code(), late.message());
}

void Batch::CountCall(proto::Op op, size_t keys) {
  const auto i = static_cast<size_t>(op);
  ++ctx_.counters.batches[i];
  ctx_.counters.keys[i] += keys;
}

void Batch::CollectKeys() {
  size_t total = 0;
  for (const HeldRequest& h : requests_) total += h.result.codes.size();
  keys_.reserve(total);
  for (uint32_t r = 0; r < requests_.size(); ++r) {
    const auto n = static_cast<uint32_t>(requests_[r].result.codes.size());
    for (uint32_t i = 0; i < n; ++i) keys_.push_back(KeyRef{r, i});
  }
}

// ---- Exist, Remove ------------------------------------------------------------------------

KeyBatch::KeyBatch(PipelineContext& ctx, MasterMessages& messages, proto::Op op,
                   std::vector<HeldRequest> requests)
    : Batch(ctx, messages, std::move(requests)), op_(op) {}

void KeyBatch::Start() {
  CollectKeys();
  if (op_ == proto::Op::Exist) {
    for (HeldRequest& h : requests_) h.result.exists.assign(h.result.codes.size(), false);
  }
  CountCall(op_, keys_.size());
  const bool force = requests_.front().request.request().force();
  const auto type = op_ == proto::Op::Exist ? mfb::Body::BatchExist : mfb::Body::BatchRemove;
  ctx_.master->Call(messages_.KeyList(ctx_.NextMasterRequestId(), type, requests_, keys_, force),
                    [this](Result<std::span<const uint8_t>> reply) { OnReply(reply); });
}

void KeyBatch::OnReply(Result<std::span<const uint8_t>> reply) {
  if (!reply.ok()) return FailAll(reply.status());
  const bool exist = op_ == proto::Op::Exist;
  auto codes = ReadKeyCodes(*reply, keys_.size(), exist);
  if (!codes.ok()) return FailAll(codes.status());
  for (uint32_t k = 0; k < keys_.size(); ++k) {
    HeldRequest& h = held(keys_[k]);
    Status st = KeyStatus((*codes)->codes(), (*codes)->messages(), k);
    if (!st.ok()) h.SetKey(keys_[k].index, st.code(), st.message());
    if (exist) h.result.exists[keys_[k].index] = (*codes)->exists()->Get(k) != 0;
  }
  CompleteAll();
}

// ---- RemoveAll, List, Stat ------------------------------------------------------------------

SingleCall::SingleCall(PipelineContext& ctx, MasterMessages& messages, HeldRequest request)
    : Batch(ctx, messages, {}) {
  requests_.push_back(std::move(request));
}

void SingleCall::Start() {
  const proto::Request& r = requests_.front().request.request();
  switch (r.op()) {
    case proto::Op::RemoveAll:
      CountCall(r.op(), 0);
      ctx_.master->Call(messages_.RemoveAll(ctx_.NextMasterRequestId(), r.force()),
                        [this](Result<std::span<const uint8_t>> reply) { OnRemoveAll(reply); });
      return;
    case proto::Op::List:
      cursor_ = r.cursor();
      return ListPage();
    case proto::Op::Stat:
      CountCall(r.op(), 0);
      ctx_.master->Call(messages_.Stats(ctx_.NextMasterRequestId()),
                        [this](Result<std::span<const uint8_t>> reply) { OnStats(reply); });
      return;
    case proto::Op::Sessions: {
      CountCall(r.op(), 0);
      const std::string_view session = r.session_ids() != nullptr && r.session_ids()->size() == 1
                                           ? r.session_ids()->Get(0)->string_view()
                                           : std::string_view();
      const uint32_t limit = r.limit() == 0 ? kDefaultListLimit : r.limit();
      ctx_.master->Call(
          messages_.SessionStats(ctx_.NextMasterRequestId(), session, r.cursor(), limit),
          [this](Result<std::span<const uint8_t>> reply) { OnSessions(reply); });
      return;
    }
    default:
      return FailAll(Internal("op " + std::string(proto::EnumNameOp(r.op())) +
                              " reached the single-call path; report this bug"));
  }
}

void SingleCall::OnRemoveAll(Result<std::span<const uint8_t>> reply) {
  if (!reply.ok()) return FailAll(reply.status());
  auto codes = ReadKeyCodes(*reply, 0, false);
  if (!codes.ok()) return FailAll(codes.status());
  requests_.front().result.removed_count = (*codes)->removed_count();
  CompleteAll();
}

void SingleCall::ListPage() {
  const proto::Request& r = requests_.front().request.request();
  const uint32_t limit = r.limit() == 0 ? kDefaultListLimit : r.limit();
  const auto have = static_cast<uint32_t>(requests_.front().result.listed.size());
  const uint32_t ask = std::clamp<uint32_t>(limit - std::min(limit, have), 1, kListPageLimit);
  CountCall(proto::Op::List, 0);
  ++pages_;
  const std::string_view prefix =
      r.prefix() == nullptr ? std::string_view() : r.prefix()->string_view();
  ctx_.master->Call(messages_.ListKeys(ctx_.NextMasterRequestId(), cursor_, ask, prefix),
                    [this](Result<std::span<const uint8_t>> reply) { OnListPage(reply); });
}

void SingleCall::OnListPage(Result<std::span<const uint8_t>> reply) {
  if (!reply.ok()) return FailAll(reply.status());
  const auto* root = flatbuffers::GetRoot<mfb::Reply>(reply->data());
  if (Status st = ReplyStatus(*root, mfb::ReplyBody::ListKeysReply); !st.ok()) return FailAll(st);
  const mfb::ListKeysReply* page = root->body_as_ListKeysReply();
  HeldRequest& h = requests_.front();
  if (page->restarted()) h.result.listed.clear();  // a new master: the scan starts over
  const proto::Request& r = h.request.request();
  const std::string_view prefix =
      r.prefix() == nullptr ? std::string_view() : r.prefix()->string_view();
  if (page->keys() != nullptr) {
    for (const mfb::ListedKey* k : *page->keys()) {
      if (k->key() == nullptr) continue;
      const std::string_view key = k->key()->string_view();
      if (key.substr(0, prefix.size()) != prefix) continue;  // the master filters; so do we
      ListedKey out;
      out.key = std::string(key);
      out.size = k->size();
      if (k->session_id() != nullptr) out.session_id = k->session_id()->str();
      listed_bytes_ += out.key.size() + out.session_id.size();
      h.result.listed.push_back(std::move(out));
    }
  }
  cursor_ = page->next_cursor();
  const uint32_t limit = r.limit() == 0 ? kDefaultListLimit : r.limit();
  const bool full = h.result.listed.size() >= limit || listed_bytes_ >= kListPageBytes;
  if (cursor_ != 0 && !full && pages_ < kListMaxMasterPages) return ListPage();
  h.result.next_cursor = cursor_;
  CompleteAll();
}

void SingleCall::OnSessions(Result<std::span<const uint8_t>> reply) {
  if (!reply.ok()) return FailAll(reply.status());
  const auto* root = flatbuffers::GetRoot<mfb::Reply>(reply->data());
  if (Status st = ReplyStatus(*root, mfb::ReplyBody::SessionStatsReply); !st.ok()) {
    return FailAll(st);
  }
  const mfb::SessionStatsReply* page = root->body_as_SessionStatsReply();
  HeldRequest& h = requests_.front();
  if (page->sessions() != nullptr) {
    h.result.sessions.reserve(page->sessions()->size());
    for (const mfb::SessionUsage* u : *page->sessions()) {
      h.result.sessions.push_back(SessionUsage{
          u->session_id() ? u->session_id()->str() : std::string(), u->blocks(), u->bytes()});
    }
  }
  h.result.next_cursor = page->next_cursor();
  CompleteAll();
}

void SingleCall::OnStats(Result<std::span<const uint8_t>> reply) {
  HeldRequest& h = requests_.front();
  h.result.counters = AgentCounters(ctx_, ctx_.sink->ClientCount());
  // The agent's counters are worth having even when the master is away.
  if (!reply.ok()) {
    ++ctx_.counters.master_failures;
    h.result.counters.push_back(Counter{"master.error", 0, reply.status().ToString()});
    return CompleteAll();
  }
  const auto* root = flatbuffers::GetRoot<mfb::Reply>(reply->data());
  if (Status st = ReplyStatus(*root, mfb::ReplyBody::StatsReply); !st.ok()) {
    h.result.counters.push_back(Counter{"master.error", 0, st.ToString()});
    return CompleteAll();
  }
  const mfb::StatsReply* stats = root->body_as_StatsReply();
  if (stats->names() != nullptr && stats->values() != nullptr) {
    const uoffset_t n = std::min(stats->names()->size(), stats->values()->size());
    for (uoffset_t i = 0; i < n; ++i) {
      h.result.counters.push_back(
          Counter{"master." + stats->names()->Get(i)->str(), stats->values()->Get(i), ""});
    }
  }
  CompleteAll();
}

}  // namespace kvagent::agent

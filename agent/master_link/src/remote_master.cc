#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>

#include "kvagent/common/errno_text.h"
#include "kvagent/common/host_port.h"
#include "kvagent/schemas/flatbuffer_checks.h"
#include "kvagent/schemas/master_generated.h"
#include "link_shared.h"

namespace kvagent::master_link {

namespace mfb = kvagent::master_proto;

// ---- Shared -------------------------------------------------------------------------------

bool RemoteMaster::Shared::Push(Outgoing o, bool wake) {
  bool was_empty = false;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (closed_) return false;
    was_empty = queue_.empty();
    queue_.push_back(std::move(o));
  }
  if (was_empty && wake) Wake();
  return true;
}

std::vector<Outgoing> RemoteMaster::Shared::Take() {
  std::vector<Outgoing> out;
  std::lock_guard<std::mutex> lock(queue_mu_);
  out.swap(queue_);
  return out;
}

std::vector<Outgoing> RemoteMaster::Shared::Close() {
  std::lock_guard<std::mutex> lock(queue_mu_);
  closed_ = true;
  return std::move(queue_);
}

void RemoteMaster::Shared::Wake() {
  const uint64_t one = 1;
  // A full counter (never in practice) still leaves the fd readable: the wake is not lost.
  (void)!::write(wake.get(), &one, sizeof(one));
}

void RemoteMaster::Shared::SetState(LinkState s, std::string text) {
  {
    std::lock_guard<std::mutex> lock(state_mu);
    detail_ = std::move(text);
    state.store(s, std::memory_order_release);
  }
  ready_cv.notify_all();
}

std::string RemoteMaster::Shared::detail() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(state_mu));
  return detail_;
}

std::string RemoteMaster::Shared::Where() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(state_mu));
  return where_.empty() ? options.endpoint : where_;
}

void RemoteMaster::Shared::SetWhere(std::string where) {
  std::lock_guard<std::mutex> lock(state_mu);
  where_ = std::move(where);
}

void RemoteMaster::Shared::SetEventEndpoints(std::string events, std::string replay) {
  std::lock_guard<std::mutex> lock(state_mu);
  event_endpoints_ = {std::move(events), std::move(replay)};
}

std::pair<std::string, std::string> RemoteMaster::Shared::event_endpoints() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(state_mu));
  return event_endpoints_;
}

// ---- RemoteMaster -------------------------------------------------------------------------

Status CheckMasterEndpoint(std::string_view endpoint) {
  if (coord::IsClusterAddress(endpoint)) return coord::ParseClusterAddress(endpoint).status();
  if (endpoint.rfind("ipc://", 0) == 0 && endpoint.size() > 6) return Status::Ok();
  if (endpoint.rfind("tcp://", 0) == 0) {
    HostPortRules rules;
    rules.scheme = "tcp://";
    rules.unbracketed_ipv6 = true;  // as ZMQ reads it
    auto address = ParseHostPort(endpoint, "--master", rules);
    if (address.ok()) return Status::Ok();
    return InvalidParams(address.status().message() +
                         "; use tcp://HOST:PORT (e.g. tcp://10.0.0.1:50051)");
  }
  return InvalidParams("--master \"" + std::string(endpoint) +
                       "\" is not a kvmaster address; use tcp://HOST:PORT (e.g. "
                       "tcp://10.0.0.1:50051), or etcd://HOST:PORT/CLUSTER for a cluster of "
                       "kvmasters coordinated through etcd");
}

namespace {

Status CheckOptions(const RemoteMasterOptions& o) {
  KVAGENT_RETURN_IF_ERROR(CheckMasterEndpoint(o.endpoint));
  if (o.heartbeat.count() <= 0) return InvalidParams("--heartbeat-ms must be positive");
  if (o.timeout.count() <= 0) return InvalidParams("--master-timeout-ms must be positive");
  if (o.backoff_min.count() <= 0 || o.backoff_max < o.backoff_min) {
    return InvalidParams("the reconnect backoff must be positive and its maximum >= its minimum");
  }
  if (o.agent_name.empty()) return InvalidParams("--agent-name is empty");
  const bool tcp_or_cluster =
      o.endpoint.rfind("tcp://", 0) == 0 || coord::IsClusterAddress(o.endpoint);
  if (o.transport == MasterTransport::kFramed && (o.curve || !tcp_or_cluster)) {
    return InvalidParams(
        "--master-transport framed needs --master tcp://HOST:PORT (kvmaster's --framed-listen) "
        "or a cluster address (etcd://...), and its keys as framed_key, not CURVE keys");
  }
  if (o.framed_key && o.transport == MasterTransport::kZmq) {
    return InvalidParams("a framed transport key with --master-transport zmq");
  }
  if (o.transport == MasterTransport::kAuto && o.curve.has_value() != o.framed_key.has_value()) {
    return InvalidParams(
        "--master-transport auto in a cluster with a secret needs the keys of both transports");
  }
  if (o.framed_retry_after.count() <= 0) {
    return InvalidParams("the framed transport's retry interval must be positive");
  }
  return Status::Ok();
}

// The writer's block metadata of a listed key as the fields of its BlockStored.
events::BlockStored BlockOf(const mfb::BlockMeta* m) {
  events::BlockStored out;
  if (m == nullptr) return out;
  if (m->block_hashes() != nullptr) {
    for (const block_proto::BlockHash* h : *m->block_hashes()) {
      out.block_hashes.push_back(events::BlockHash{h->bits(), h->is_signed()});
    }
  }
  if (m->parent_block_hash() != nullptr && m->parent_block_hash()->size() > 0) {
    const block_proto::BlockHash* p = m->parent_block_hash()->Get(0);
    out.parent_block_hash = events::BlockHash{p->bits(), p->is_signed()};
  }
  if (m->token_ids() != nullptr) {
    out.token_ids.assign(m->token_ids()->begin(), m->token_ids()->end());
  }
  out.block_size = m->block_size();
  if (m->lora_name() != nullptr) out.lora_name = m->lora_name()->str();
  return out;
}

// A ListKeys page is read into owned strings and vectors: refuse one whose keys share their
// data (a few bytes from the master would become gigabytes here) or whose 8-byte hash vectors
// are misaligned (reading them would be undefined behaviour).
Status CheckListedKeys(const mfb::ListKeysReply& page, size_t reply_bytes) {
  if (page.keys() == nullptr) return Status::Ok();
  uint64_t referred = 0;
  for (const mfb::ListedKey* k : *page.keys()) {
    referred += fbcheck::StringBytes(k->key()) + fbcheck::StringBytes(k->session_id());
    if (const mfb::BlockMeta* m = k->block()) {
      if (!fbcheck::ElementsAligned(m->block_hashes()) ||
          !fbcheck::ElementsAligned(m->parent_block_hash())) {
        return Internal(
            "kvmaster's ListKeys reply has misaligned block hashes; check that "
            "kvmaster and kvagent are the same version");
      }
      referred += fbcheck::VectorBytes(m->block_hashes()) +
                  fbcheck::VectorBytes(m->parent_block_hash()) +
                  fbcheck::VectorBytes(m->token_ids()) + fbcheck::StringBytes(m->lora_name());
    }
  }
  if (referred > reply_bytes) {
    return Internal("kvmaster's ListKeys reply refers to " + std::to_string(referred) +
                    " bytes in a message of " + std::to_string(reply_bytes) +
                    "; check that kvmaster and kvagent are the same version");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<RemoteMaster>> RemoteMaster::Start(RemoteMasterOptions options) {
  KVAGENT_RETURN_IF_ERROR(CheckOptions(options));
  auto shared = std::make_shared<Shared>(std::move(options));
  shared->wake = ipc::UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!shared->wake.valid()) {
    return Internal(std::string("eventfd: ") + ErrnoText(errno) +
                    "; raise the process's file descriptor limit");
  }
  shared->SetState(LinkState::kConnecting, "connecting");
  if (coord::IsClusterAddress(shared->options.endpoint)) {
    Result<coord::ClusterAddress> address =
        shared->options.cluster ? Result<coord::ClusterAddress>(*shared->options.cluster)
                                : coord::ParseClusterAddress(shared->options.endpoint);
    if (!address.ok()) return address.status();
    KVAGENT_RETURN_IF_ERROR(coord::CheckEtcdTls(address->tls));
    KVAGENT_RETURN_IF_ERROR(coord::CheckEtcdAuth(address->auth, address->tls));
    auto watcher = coord::LeaderWatcher::Start(
        std::move(*address), [s = shared.get()](const std::optional<coord::Leader>&) {
          s->leader_changed.store(true, std::memory_order_release);
          s->Wake();
        });
    if (!watcher.ok()) return watcher.status();
    shared->watcher = std::move(*watcher);
  }
  shared->thread = std::thread([s = shared.get()] { RunLink(s); });
  return std::unique_ptr<RemoteMaster>(new RemoteMaster(std::move(shared)));
}

RemoteMaster::RemoteMaster(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

RemoteMaster::~RemoteMaster() { Stop(); }

void RemoteMaster::Stop() {
  if (!shared_->thread.joinable()) return;
  shared_->stop.store(true, std::memory_order_release);
  shared_->Wake();
  shared_->thread.join();
  // A blocking call that passed its stop check while the link thread was exiting was queued
  // after the thread's last look: fail it now (and refuse later ones) rather than leave its
  // caller waiting for its timeout (a relay's ListKeys held the agent's exit up to 11 s).
  const Status stopping(ErrorCode::kMasterUnavailable, "the agent is shutting down");
  for (Outgoing& o : shared_->Close()) {
    if (o.on_link_thread) o.done(stopping);
  }
  shared_->watcher.reset();
  shared_->SetState(LinkState::kDown, "stopped");
}

bool RemoteMaster::WaitReady(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(shared_->state_mu);
  return shared_->ready_cv.wait_for(lock, limit, [&] {
    return shared_->state.load(std::memory_order_acquire) == LinkState::kReady;
  });
}

void RemoteMaster::Bind(agent::PostFn post) { shared_->post = std::move(post); }

void RemoteMaster::Call(flatbuffers::DetachedBuffer request, agent::MasterReplyFn done) {
  if (!ready() || shared_->stop.load(std::memory_order_acquire)) {
    // Fail at once rather than queue behind a master that is not there.
    ++shared_->failed_fast;
    done(Status(ErrorCode::kMasterUnavailable,
                "kvmaster " + shared_->Where() + " is not reachable (" + shared_->detail() +
                    "); the agent keeps reconnecting by itself: check that kvmaster runs, then "
                    "retry"));
    return;
  }
  if (shared_->options.transport != MasterTransport::kZmq &&
      CallDirect(request, done, Clock::time_point::min())) {
    return;
  }
  (void)shared_->Push(Outgoing{std::move(request), std::move(done), false});  // false: stopped
}

bool RemoteMaster::CallDirect(flatbuffers::DetachedBuffer& request, agent::MasterReplyFn& done,
                              Clock::time_point retry_until) {
  Shared& s = *shared_;
  const uint64_t id = flatbuffers::GetRoot<mfb::Request>(request.data())->request_id();
  bool reused = false;
  {
    std::lock_guard<std::mutex> lock(s.direct_mu);
    // Not ready on a connection, or a master that stopped reading: the queue (and its refusal).
    if (s.direct == nullptr || s.direct->queued() > kMaxFramedQueueBytes) return false;
    reused = id == 0 || id >= kBlockingIds || s.direct_calls.count(id) != 0;
    if (!reused) {
      s.direct->Send(std::span(request.data(), request.size()));
      DirectCall& call = s.direct_calls[id];
      call.done = std::move(done);
      call.deadline = Clock::now() + s.options.timeout;
      if (retry_until != Clock::time_point::min()) {
        call.request = std::move(request);
        call.retry_until = retry_until;
      }
      s.direct_in_flight.store(s.direct_calls.size(), std::memory_order_relaxed);
      // Its reply is this thread's to read (TakeReplies) from now: the link thread leaves input
      // alone until StopTakingReplies.
      s.service_reads.store(true, std::memory_order_relaxed);
      // A write the socket could not take whole waits in the connection for the link thread's
      // poll, which must then watch for the socket to take it; an error surfaces there too.
      if (!s.direct->Flush().ok() || s.direct->queued() > 0) s.Wake();
    }
  }
  if (reused) {
    done(ReusedOrReservedId(id));
  }
  return true;
}

bool RemoteMaster::TakeReplies() {
  Shared& s = *shared_;
  if (!s.service_reads.load(std::memory_order_relaxed)) {
    if (s.direct_in_flight.load(std::memory_order_relaxed) == 0) return false;
    s.service_reads.store(true, std::memory_order_relaxed);
  }
  bool hand = false;
  {
    std::unique_lock<std::mutex> lock(s.direct_mu, std::try_to_lock);
    // The link thread is at the connection (it passes on what it reads), or it dropped it.
    if (!lock.owns_lock() || s.direct == nullptr || !s.direct_failure.ok()) return false;
    const uint64_t epoch = s.epoch.load(std::memory_order_relaxed);
    Status read = s.direct->OnReady(POLLIN, [&](std::span<const uint8_t> reply) {
      flatbuffers::Verifier verifier(reply.data(), reply.size());
      const mfb::Reply* r = reply.empty() || !verifier.VerifyBuffer<mfb::Reply>(nullptr)
                                ? nullptr
                                : flatbuffers::GetRoot<mfb::Reply>(reply.data());
      auto found = r == nullptr ? s.direct_calls.end() : s.direct_calls.find(r->request_id());
      // Only a plain answer to one of this thread's calls is taken here; the link thread judges
      // everything else (a master that does not serve, or, with discovery, any epoch but the one
      // registered with while no newer one is known).
      const bool plain =
          found != s.direct_calls.end() && !r->not_serving() &&
          (!s.watcher || (r->master_epoch() == epoch && epoch >= s.watcher->highest_epoch()));
      if (!plain) {
        s.handed.emplace_back(reply.begin(), reply.end());
        hand = true;
        return;
      }
      taken_.push_back({std::move(found->second.done), taken_bytes_.size(), reply.size()});
      taken_bytes_.insert(taken_bytes_.end(), reply.begin(), reply.end());
      s.direct_calls.erase(found);
    });
    if (!read.ok()) {
      s.direct_failure = std::move(read);
      hand = true;
    }
    s.direct_in_flight.store(s.direct_calls.size(), std::memory_order_relaxed);
  }
  if (hand) s.Wake();
  // After the lock: a callback may call again.
  for (Taken& t : taken_) {
    t.done(std::span<const uint8_t>(taken_bytes_.data() + t.at, t.size));
  }
  const bool ran = !taken_.empty();
  if (ran) s.taken_by_service.fetch_add(taken_.size(), std::memory_order_relaxed);
  taken_.clear();
  taken_bytes_.clear();
  return ran;
}

void RemoteMaster::StopTakingReplies() {
  if (!shared_->service_reads.exchange(false, std::memory_order_relaxed)) return;
  shared_->Wake();  // the link thread polls the connection for input again
}

void RemoteMaster::CallUntilAnswered(flatbuffers::DetachedBuffer request, agent::MasterReplyFn done,
                                     Clock::time_point retry_until) {
  if (shared_->stop.load(std::memory_order_acquire)) {
    done(Status(ErrorCode::kMasterUnavailable, "the agent is shutting down"));
    return;
  }
  if (ready() && shared_->options.transport != MasterTransport::kZmq &&
      CallDirect(request, done, retry_until)) {
    return;
  }
  Outgoing o{std::move(request), std::move(done), false};
  o.retry_until = retry_until;
  (void)shared_->Push(std::move(o));  // false: stopped (callbacks are dropped after Stop)
}

bool RemoteMaster::ready() const {
  return shared_->state.load(std::memory_order_acquire) == LinkState::kReady;
}

agent::MasterIdentity RemoteMaster::identity() const {
  return {shared_->agent_id.load(std::memory_order_acquire),
          shared_->pool_id.load(std::memory_order_acquire), shared_->options.agent_key};
}

std::optional<std::pair<std::string, std::string>> RemoteMaster::EventEndpoints() const {
  auto e = shared_->event_endpoints();
  if (e.first.empty()) return std::nullopt;
  return e;
}

std::string RemoteMaster::Describe() const {
  std::string out = "kvmaster " + shared_->Where() + ": " + shared_->detail();
  if (ready()) {
    out += ", agent " + std::to_string(identity().agent_id) + ", pool " +
           std::to_string(identity().pool_id);
  }
  return out;
}

void RemoteMaster::AppendStats(std::vector<std::pair<std::string, uint64_t>>* out) const {
  out->emplace_back("ready", ready() ? 1 : 0);
  out->emplace_back("registrations", shared_->registrations.load());
  out->emplace_back("framed", shared_->on_framed.load() ? 1 : 0);
  out->emplace_back("framed_fallbacks", shared_->framed_fallbacks.load());
  out->emplace_back("replies_taken_by_service", shared_->taken_by_service.load());
  out->emplace_back("link_downs", shared_->link_downs.load());
  out->emplace_back("timeouts", shared_->timeouts.load());
  out->emplace_back("heartbeats", shared_->heartbeats.load());
  out->emplace_back("failed_fast", shared_->failed_fast.load());
  out->emplace_back("failed_in_flight", shared_->failed_in_flight.load());
  out->emplace_back("in_flight", shared_->in_flight.load() + shared_->direct_in_flight.load());
  out->emplace_back("retried_calls", shared_->retried_calls.load());
  out->emplace_back("fences_applied", shared_->fences_applied.load());
  out->emplace_back("epoch", shared_->epoch.load());
  if (shared_->watcher) {
    out->emplace_back("leader_changes", shared_->leader_changes.load());
    out->emplace_back("stale_replies", shared_->stale_replies.load());
    out->emplace_back("etcd_reachable", shared_->watcher->etcd_reachable() ? 1 : 0);
  }
}

Result<KeyPage> RemoteMaster::ListKeys(uint64_t cursor, uint32_t limit) {
  if (!ready() || shared_->stop.load(std::memory_order_acquire)) {
    return Status(ErrorCode::kMasterUnavailable,
                  "kvmaster " + shared_->Where() + " is not reachable (" + shared_->detail() + ")");
  }
  flatbuffers::FlatBufferBuilder fbb(256);
  const uint64_t id = kBlockingIds + shared_->blocking_calls.fetch_add(1) % kBlockingIds;
  fbb.Finish(mfb::CreateRequest(fbb, id, mfb::Body::ListKeys,
                                mfb::CreateListKeys(fbb, cursor, limit).Union()));
  auto promise = std::make_shared<std::promise<Result<KeyPage>>>();
  std::future<Result<KeyPage>> future = promise->get_future();
  const bool queued = shared_->Push(Outgoing{
      fbb.Release(),
      [promise](Result<std::span<const uint8_t>> reply) {
        if (!reply.ok()) return promise->set_value(reply.status());
        const auto* root = flatbuffers::GetRoot<mfb::Reply>(reply->data());
        if (root->status() != 0) {
          return promise->set_value(Status(ErrorCodeFromWire(root->status()),
                                           root->message() ? root->message()->str() : ""));
        }
        const mfb::ListKeysReply* page = root->body_as_ListKeysReply();
        if (page == nullptr) {
          return promise->set_value(Internal("kvmaster answered ListKeys with another body"));
        }
        if (Status st = CheckListedKeys(*page, reply->size()); !st.ok()) {
          return promise->set_value(st);
        }
        KeyPage out;
        out.next_cursor = page->next_cursor();
        out.restarted = page->restarted();
        if (page->keys() != nullptr) {
          for (const mfb::ListedKey* k : *page->keys()) {
            if (k->key() == nullptr) continue;
            out.keys.push_back({k->key()->str(), k->size(),
                                k->session_id() ? k->session_id()->str() : std::string(),
                                BlockOf(k->block())});
          }
        }
        promise->set_value(std::move(out));
      },
      true});
  if (!queued) return Status(ErrorCode::kMasterUnavailable, "the agent is shutting down");
  // The link answers every request within its timeout (or fails it when stopping); the margin
  // only guards against a bug turning into a hang.
  if (future.wait_for(shared_->options.timeout * 2 + std::chrono::seconds(1)) !=
      std::future_status::ready) {
    return Status(ErrorCode::kMasterUnavailable,
                  "kvmaster " + shared_->Where() + " did not answer ListKeys in time");
  }
  return future.get();
}

}  // namespace kvagent::master_link

#include "ring_service.h"

#include <glog/logging.h>
#include <pthread.h>

#include <algorithm>
#include <cstring>

#include "client_values.h"
#include "completion_encoder.h"
#include "kvagent/ipc/cpu_yield.h"
#include "request_check.h"

namespace kvagent::agent {
namespace {

// Frames served per client before moving to the next one: fairness between busy clients.
constexpr int kBurst = 64;

}  // namespace

RingService::RingService(RequestHandler* handler, std::chrono::microseconds spin,
                         std::chrono::microseconds watchdog_interval,
                         std::function<std::string()> watchdog_status, DisconnectFn disconnect)
    : handler_(handler),
      spin_(spin),
      disconnect_(std::move(disconnect)),
      watchdog_(watchdog_interval, std::move(watchdog_status)) {}

RingService::~RingService() { Stop(); }

void RingService::Start() {
  started_ = true;
  thread_ = std::thread([this] { Run(); });
}

void RingService::Stop() {
  if (!started_) return;
  started_ = false;
  Enqueue(Command{Command::kStop, nullptr, 0, {}});
  thread_.join();
}

void RingService::Enqueue(Command command) {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    inbox_.push_back(std::move(command));
    inbox_pending_.store(true, std::memory_order_release);
  }
  ipc::NotifyIfSleeping(sleeping_, control_seq_);
}

void RingService::AddClient(std::unique_ptr<ClientConnection> client) {
  Enqueue(Command{Command::kAdd, std::move(client), 0, {}});
}

void RingService::DropClient(ClientId client) {
  Enqueue(Command{Command::kDrop, nullptr, client, {}});
}

void RingService::Post(std::function<void()> task) {
  Enqueue(Command{Command::kTask, nullptr, 0, std::move(task)});
}

bool RingService::DrainInbox() {
  std::vector<Command> commands;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    commands.swap(inbox_);
    inbox_pending_.store(false, std::memory_order_relaxed);
  }
  bool keep_running = true;
  for (Command& c : commands) {
    switch (c.kind) {
      case Command::kAdd:
        if (!keep_running) {
          c.connection->SignalShutdown();
          break;
        }
        by_id_[c.connection->id()] = c.connection.get();
        clients_.push_back(std::move(c.connection));
        client_count_.store(clients_.size(), std::memory_order_relaxed);
        break;
      case Command::kDrop:
        Remove(c.client, /*disconnect=*/false, "");
        break;
      case Command::kTask:
        c.task();
        handler_busy_ = true;
        break;
      case Command::kStop:
        keep_running = false;
        break;
    }
  }
  return keep_running;
}

void RingService::Remove(ClientId client, bool disconnect, const std::string& reason) {
  auto found = by_id_.find(client);
  if (found == by_id_.end()) return;
  by_id_.erase(found);
  for (size_t i = 0; i < clients_.size(); ++i) {
    if (clients_[i]->id() != client) continue;
    // Abandon its in-flight work before the mapping can go (requests the handler still holds
    // keep their own reference to the segment).
    handler_->OnClientGone(client);
    if (disconnect) disconnect_(client, reason);
    clients_.erase(clients_.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
  client_count_.store(clients_.size(), std::memory_order_relaxed);
}

void RingService::RemoveBroken() {
  std::vector<std::pair<ClientId, std::string>> broken;
  for (const auto& c : clients_) {
    if (c->broken()) broken.emplace_back(c->id(), c->broken_reason());
  }
  for (const auto& [id, reason] : broken) {
    LOG(WARNING) << "client " << id << " (" << by_id_[id]->name() << ", pid "
                 << by_id_[id]->peer().pid << ") disconnected: " << reason;
    Remove(id, /*disconnect=*/true, reason);
  }
}

void RingService::Run() {
  pthread_setname_np(pthread_self(), "kvagent-ring");
  using Clock = std::chrono::steady_clock;
  handler_->OnStart(*this);
  auto last_work = Clock::now();
  while (true) {
    if (inbox_pending_.load(std::memory_order_acquire) && !DrainInbox()) break;
    bool worked = false;
    bool any_broken = false;
    for (const auto& client : clients_) {
      worked |= Serve(*client);
      any_broken |= client->broken();
    }
    if (handler_->TakeReplies()) handler_busy_ = true;
    if (handler_busy_) {
      // The natural-batching point: everything ready in every ring has been handed over.
      handler_busy_ = false;
      handler_->OnPassEnd();
      FlushAll();
      worked = true;
    }
    if (any_broken) RemoveBroken();
    const auto now = Clock::now();
    worked |= RunTimer(now);
    watchdog_.Poll(now);  // from this loop: if it hangs, systemd stops hearing from us
    if (worked) {
      last_work = now;
      continue;
    }
    if (now - last_work < spin_) {
      // The thread we wait for may be runnable on this very CPU: let it go first, while that
      // is cheap (ipc/cpu_yield.h).
      if (!handler_->AwaitingOtherThreads() || !ipc::YieldCpu()) {
        ipc::CpuRelax();
      }
      continue;
    }
    handler_->StopTakingReplies();
    Sleep();
    last_work = Clock::now();
  }
  for (const auto& client : clients_) {
    client->SignalShutdown();
    handler_->OnClientGone(client->id());
  }
  clients_.clear();
  by_id_.clear();
  client_count_.store(0, std::memory_order_relaxed);
  handler_->OnServiceStop();
}

void RingService::FlushAll() {
  for (const auto& client : clients_) client->Flush();
  unpublished_.clear();
}

void RingService::PublishCompletions() {
  for (ClientId id : unpublished_) {
    if (auto found = by_id_.find(id); found != by_id_.end()) found->second->Flush();
  }
  unpublished_.clear();
}

bool RingService::RunTimer(std::chrono::steady_clock::time_point now) {
  if (now < handler_->NextDeadline()) return false;
  handler_->OnTimer(now);
  if (handler_busy_) {  // the timer may have produced work of its own (e.g. a retry)
    handler_busy_ = false;
    handler_->OnPassEnd();
  }
  FlushAll();
  return true;
}

bool RingService::Serve(ClientConnection& client) {
  if (client.broken()) return false;
  bool worked = ServeRequests(client);
  client.requests().PublishHead();  // one fence for the whole burst
  client.Flush();
  return worked;
}

bool RingService::ServeRequests(ClientConnection& client) {
  bool worked = false;
  if (client.backlogged()) {
    worked = client.FlushBacklog();
    if (client.backlogged()) return worked;
  }
  for (int n = 0; n < kBurst && !client.backlogged(); ++n) {
    ipc::Frame frame;
    const ipc::PeekResult r = client.requests().Peek(&frame);
    if (r == ipc::PeekResult::kEmpty) break;
    if (r == ipc::PeekResult::kCorrupt) {
      client.MarkBroken("its request ring is corrupt (impossible index or record header)");
      break;
    }
    // Copy out of shared memory before verifying: the client could otherwise change the bytes
    // between the Verifier and their use.
    scratch_.resize(frame.payload.size());
    if (!frame.payload.empty()) {
      std::memcpy(scratch_.data(), frame.payload.data(), frame.payload.size());
    }
    const uint64_t request_id = frame.request_id;
    client.requests().Consume();
    HandleFrame(client, request_id, scratch_);
    worked = true;
  }
  return worked;
}

void RingService::HandleFrame(ClientConnection& client, uint64_t request_id,
                              std::span<const uint8_t> frame) {
  CheckedRequest checked =
      CheckRequest(frame, request_id, client.arena_bytes(), client.memory() != nullptr);
  if (!checked.status.ok()) {
    VLOG(1) << "client " << client.id() << " request " << request_id << ": "
            << checked.status.ToString();
    Send(client, request_id, EncodeFailure(fbb_, request_id, checked.status, checked.key_count));
    return;
  }
  if (checked.request->op() == proto::Op::Ping) {
    Send(client, request_id, EncodePingReply(fbb_, request_id));
    return;
  }
  ClientRequest request;
  request.client_id = client.id();
  request.request_id = request_id;
  request.frame.assign(frame.begin(), frame.end());
  request.segment = client.segment();
  if (checked.request->memory_counts() != nullptr) {
    request.memory = client.memory();
    request.memory_first = FirstMemoryRanges(*checked.request);
  }
  handler_busy_ = true;
  handler_->Handle(std::move(request), *this);
}

void RingService::Send(ClientConnection& client, uint64_t request_id,
                       std::span<const uint8_t> completion) {
  const uint64_t capacity = client.segment()->layout().completion_ring_bytes;
  if (completion.size() > ipc::MaxFramePayload(capacity)) {
    const Status too_large(ErrorCode::kInternal,
                           "the completion (" + std::to_string(completion.size()) +
                               " bytes) does not fit the completion ring; split the batch");
    completion = EncodeFailure(fbb_, request_id, too_large, 0);
  }
  client.PushCompletion(request_id, completion);
}

void RingService::Complete(ClientId client, uint64_t request_id, const CompletionData& data) {
  auto found = by_id_.find(client);
  if (found == by_id_.end()) return;  // gone: nobody to tell
  ClientConnection& connection = *found->second;
  std::span<const uint8_t> completion = EncodeCompletion(fbb_, request_id, data);
  const uint64_t capacity = connection.segment()->layout().completion_ring_bytes;
  if (completion.size() > ipc::MaxFramePayload(capacity)) {
    // The work is done: keep every key's code and say in one line what the messages were.
    completion = EncodeCompletion(fbb_, request_id, data, KeyMessages::kSummary);
  }
  Send(connection, request_id, completion);
  unpublished_.push_back(client);
}

void RingService::Sleep() {
  std::vector<ipc::FutexWaiter> waiters;
  waiters.reserve(clients_.size() + 1);
  const uint32_t control = ipc::AdvertiseSleep(sleeping_, control_seq_);
  waiters.push_back({&control_seq_, control, ipc::FutexScope::kShared});
  bool has_work = inbox_pending_.load(std::memory_order_acquire);
  for (const auto& client : clients_) waiters.push_back(client->BeginWait(&has_work));
  // Sleep at most until the handler's timer is due (negative: no limit).
  std::chrono::nanoseconds timeout(-1);
  if (const auto deadline = handler_->NextDeadline();
      deadline != std::chrono::steady_clock::time_point::max()) {
    timeout = std::max(std::chrono::nanoseconds(0), deadline - std::chrono::steady_clock::now());
    has_work |= timeout.count() == 0;
  }
  // Wake for the next watchdog ping too.
  if (const auto due = watchdog_.next_due(); due != std::chrono::steady_clock::time_point::max()) {
    const auto until_ping =
        std::max(std::chrono::nanoseconds(0), due - std::chrono::steady_clock::now());
    timeout = timeout.count() < 0 ? until_ping : std::min(timeout, until_ping);
    has_work |= timeout.count() == 0;
  }
  if (!has_work) {
    const ipc::WaitResult r = ipc::FutexWaitMany(waiters, timeout);
    if (r == ipc::WaitResult::kUnsupported || r == ipc::WaitResult::kTooManyWaiters) {
      if (!waitv_unsupported_logged_) {
        LOG_IF(WARNING, r == ipc::WaitResult::kUnsupported)
            << "futex_waitv is not available (Linux < 5.16): the idle agent polls every 200 us "
               "instead of sleeping until work arrives";
        LOG_IF(ERROR, r == ipc::WaitResult::kTooManyWaiters)
            << waiters.size() << " wake words are more than one futex_waitv watches ("
            << ipc::kMaxFutexWaiters << "): the idle agent polls every 200 us; report this bug";
        waitv_unsupported_logged_ = true;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  for (const auto& client : clients_) client->EndWait();
  sleeping_.store(0, std::memory_order_relaxed);
}

}  // namespace kvagent::agent

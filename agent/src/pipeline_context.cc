#include "pipeline_context.h"

#include <atomic>

#include <glog/logging.h>

#include "kvagent/ipc/segment.h"

namespace kvagent::agent {

void ServiceGate::Open(CompletionSink* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  sink_ = sink;
}

void ServiceGate::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  sink_ = nullptr;
}

void ServiceGate::Post(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sink_ != nullptr) sink_->Post(std::move(task));
}

void HeldRequest::SetKey(size_t index, ErrorCode code, const std::string& message) {
  result.codes[index] = code;
  if (code == ErrorCode::kOk) return;
  if (result.messages.empty()) result.messages.resize(result.codes.size());
  result.messages[index] = message;
}

void HeldRequest::TakeDeadline(std::chrono::steady_clock::time_point now) {
  deadline_at = std::chrono::steady_clock::time_point::max();
  const proto::Request& r = request.request();
  const uint64_t deadline_ns = r.deadline_ns();
  if (deadline_ns == 0) return;
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  const int64_t submitted_ns =
      static_cast<int64_t>(deadline_ns) - int64_t{r.timeout_ms()} * 1'000'000;
  constexpr int64_t kSameClock = 600'000'000'000;  // 10 minutes
  if (submitted_ns > now_ns + kSameClock || submitted_ns < now_ns - kSameClock) return;
  deadline_at = std::chrono::steady_clock::time_point(
      std::chrono::nanoseconds(static_cast<int64_t>(deadline_ns)));
}

std::optional<std::chrono::steady_clock::time_point> HeldRequest::Deadline() const {
  if (deadline_at == std::chrono::steady_clock::time_point::max()) return std::nullopt;
  return deadline_at;
}

namespace {

// The call's word in the client's arena, or null (none named; CheckRequest bounded it).
uint32_t* CallWord(const ClientRequest& request) {
  const uint64_t word = request.request().call_word();
  if (word == 0) return nullptr;
  const std::span<uint8_t> arena = request.arena();
  if (arena.size() < 4 || word - 1 > arena.size() - 4) return nullptr;
  return reinterpret_cast<uint32_t*>(arena.data() + (word - 1));
}

}  // namespace

bool HeldRequest::MayTouchClientMemory(std::chrono::steady_clock::time_point now) {
  if (claimed) return !Expired(now);
  if (Expired(now)) return false;
  uint32_t* word = CallWord(request);
  if (word == nullptr) return true;
  // Shared with the client's process: an atomic on the mapping (aligned: CheckRequest). Any
  // value but open, a closed call or one the client scribbled on, means hands off.
  std::atomic_ref<uint32_t> state(*word);
  uint32_t expected = ipc::kCallOpen;
  claimed = state.compare_exchange_strong(expected, ipc::kCallMoving, std::memory_order_acq_rel,
                                          std::memory_order_acquire);
  return claimed;
}

void HeldRequest::ReleaseClientMemory() {
  if (!claimed) return;
  claimed = false;
  uint32_t* word = CallWord(request);
  if (word == nullptr) return;
  // Release: every byte moved for the call is visible before the caller may close the word.
  std::atomic_ref<uint32_t>(*word).store(ipc::kCallOpen, std::memory_order_release);
}

Status DeadlinePassed(std::string_view skipped) {
  return Status(ErrorCode::kTimeout,
                "the caller's deadline passed before the agent got to it; " + std::string(skipped));
}

void HeldRequest::FailAll(const Status& status) {
  const size_t keys = result.codes.size();
  result.status = status;
  result.codes.assign(keys, status.code());
  result.messages.assign(keys, status.message());
}

Status ArenaRegistry::Acquire(const ClientRequest& request) {
  auto [it, inserted] = entries_.try_emplace(request.client_id);
  Entry& e = it->second;
  if (inserted) {
    const std::span<uint8_t> arena = request.arena();
    Status registered = engine_->RegisterMemory(arena.data(), arena.size());
    if (!registered.ok()) {
      entries_.erase(it);
      return Status(ErrorCode::kTransferFailed,
                    "the data plane cannot use this client's arena: " + registered.message());
    }
    e.base = arena.data();
  }
  ++e.users;
  return Status::Ok();
}

void ArenaRegistry::Release(ClientId client) {
  auto it = entries_.find(client);
  if (it == entries_.end()) return;
  if (--it->second.users == 0 && it->second.gone) Unregister(client, it->second);
}

void ArenaRegistry::ClientGone(ClientId client) {
  auto it = entries_.find(client);
  if (it == entries_.end()) return;
  it->second.gone = true;
  if (it->second.users == 0) Unregister(client, it->second);
}

void ArenaRegistry::Unregister(ClientId client, Entry& entry) {
  if (Status st = engine_->UnregisterMemory(entry.base); !st.ok()) {
    LOG(WARNING) << "client " << client << ": " << st.message();
  }
  entries_.erase(client);
}

void PipelineContext::Complete(HeldRequest& held) {
  held.ReleaseClientMemory();
  if (held.gone) return;
  sink->Complete(held.request.client_id, held.request.request_id, held.result);
}

}  // namespace kvagent::agent

#include "connection.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "kvagent/common/errno_text.h"
#include "kvagent/schemas/agent_generated.h"

namespace kvagent::sdk_detail {
namespace {

// Longest a waiting thread sleeps before re-checking liveness and its deadline by itself; the
// monitor thread normally wakes it at once.
constexpr auto kSlice = std::chrono::milliseconds(100);
using ipc::kCallClosed;  // the states of a call word (kvagent/ipc/segment.h)
using ipc::kCallMoving;
using ipc::kCallOpen;
// How often a call past its deadline whose bytes the agent is moving tries to close its word.
constexpr auto kMovingSlice = std::chrono::milliseconds(2);

// A thread's per-call scratch keeps the capacity of calls of up to kScratchKeep keys, and its
// request builder up to kScratchKeepBytes; what a larger call grew is given back when it ends.
constexpr size_t kScratchKeep = 4096;
constexpr size_t kScratchKeepBytes = 256 * 1024;
template <typename T>
void TrimScratch(std::vector<T>& v) {
  if (v.capacity() > kScratchKeep) std::vector<T>().swap(v);
}

std::string DefaultClientName() {
  std::ifstream comm("/proc/self/comm");
  std::string name;
  if (!comm || !std::getline(comm, name)) name = "client";
  return name + ":" + std::to_string(getpid());
}

template <typename T>
const T* VerifiedRoot(const std::vector<uint8_t>& message) {
  flatbuffers::Verifier verifier(message.data(), message.size(), 8, 64);
  if (message.size() < sizeof(flatbuffers::uoffset_t) || !verifier.VerifyBuffer<T>(nullptr)) {
    return nullptr;
  }
  return flatbuffers::GetRoot<T>(message.data());
}

Status Unavailable(std::string message) {
  return Status(ErrorCode::kAgentUnavailable, std::move(message));
}

// Under Yama ptrace_scope 1 only a process's ancestors (and the one it names) may read its
// memory: name the agent at the other end of `socket`. Without Yama, or with another scope,
// there is nothing to do (scope 2 and 3 need CAP_SYS_PTRACE, which naming cannot give).
void NameAgentAsPtracer(int socket) {
  std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
  int value = 0;
  if (!(scope >> value) || value != 1) return;
  auto agent = ipc::GetPeerCredentials(socket);
  if (agent.ok() && agent->pid > 0) (void)prctl(PR_SET_PTRACER, agent->pid, 0, 0, 0);
}

// Copies `n` bytes from `src` across `ranges` in order (stops at the end of either).
void CopyToRanges(const uint8_t* src, size_t n, MemoryValue ranges) {
  for (const MemoryRange& r : ranges) {
    if (n == 0) return;
    const size_t take = std::min(n, r.size);
    std::memcpy(r.data, src, take);
    src += take;
    n -= take;
  }
}

}  // namespace

Connection::Connection(const ClientOptions& options)
    : spin_(options.spin),
      call_timeout_(options.call_timeout),
      call_word_bytes_((uint64_t{std::max<uint32_t>(1, options.max_in_flight)} * sizeof(uint32_t) +
                        ipc::kPageBytes - 1) /
                       ipc::kPageBytes * ipc::kPageBytes) {}

Result<std::shared_ptr<Connection>> Connection::Open(const ClientOptions& options) {
  std::shared_ptr<Connection> c(new Connection(options));
  KVAGENT_RETURN_IF_ERROR(c->Handshake(options));
  c->slot_count_ = std::max<uint32_t>(1, options.max_in_flight);
  c->slots_ = std::make_unique<Slot[]>(c->slot_count_);
  c->free_slots_.reserve(c->slot_count_);
  for (uint32_t i = c->slot_count_; i > 0; --i) c->free_slots_.push_back(i - 1);
  c->monitor_wake_ = ipc::UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!c->monitor_wake_.valid()) return Internal("eventfd failed: " + ErrnoText(errno));
  c->monitor_ = std::thread([raw = c.get()] { raw->Monitor(); });
  return c;
}

Status Connection::Handshake(const ClientOptions& options) {
  const std::string path = options.run_dir + "/agent.sock";
  auto fd = ipc::ConnectUnix(path);
  if (!fd.ok()) return fd.status();
  socket_ = std::move(*fd);

  flatbuffers::FlatBufferBuilder fbb;
  auto name =
      fbb.CreateString(options.client_name.empty() ? DefaultClientName() : options.client_name);
  uint64_t probe_address = 0;
  if (options.process_memory) {
    NameAgentAsPtracer(socket_.get());
    std::random_device random;
    memory_probe_ = (uint64_t{random()} << 32 | random()) | 1;  // never 0
    probe_address = reinterpret_cast<uintptr_t>(&memory_probe_);
  }
  fbb.Finish(proto::CreateHello(fbb, static_cast<uint32_t>(proto::ProtocolVersion::Current), name,
                                options.arena_bytes + call_word_bytes_, options.ring_bytes,
                                probe_address, memory_probe_));
  KVAGENT_RETURN_IF_ERROR(ipc::SendMessage(socket_.get(), {fbb.GetBufferPointer(), fbb.GetSize()},
                                           options.connect_timeout));
  ipc::UniqueFd segment_fd;
  auto answer = ipc::ReceiveMessage(socket_.get(), options.connect_timeout, &segment_fd);
  if (!answer.ok()) return answer.status();
  const proto::Welcome* welcome = VerifiedRoot<proto::Welcome>(*answer);
  if (welcome == nullptr) return Unavailable("the agent's Welcome is malformed; upgrade the SDK");
  if (welcome->status() != 0) {
    return Status(ErrorCodeFromWire(welcome->status()),
                  "the agent refused the connection: " +
                      (welcome->message() ? welcome->message()->str() : std::string()));
  }
  if (welcome->protocol_version() != static_cast<uint32_t>(proto::ProtocolVersion::Current)) {
    return Unavailable("the agent speaks protocol version " +
                       std::to_string(welcome->protocol_version()) + " and this SDK " +
                       std::to_string(static_cast<uint32_t>(proto::ProtocolVersion::Current)) +
                       "; upgrade the older of the two");
  }
  auto segment = ipc::Segment::Open(segment_fd.Release(), welcome->segment_bytes());
  if (!segment.ok()) return segment.status();
  if (segment->header().client_id != welcome->client_id() ||
      segment->header().agent_incarnation != welcome->agent_incarnation()) {
    return Unavailable("the segment the agent passed belongs to another client; retry");
  }
  client_id_ = welcome->client_id();
  // The agent's process, to tell an agent that exited from one that dropped this client but may
  // still be moving a call's bytes (AwaitMoved). Not known across pid namespaces.
  if (auto agent = ipc::GetPeerCredentials(socket_.get()); agent.ok() && agent->pid > 0) {
    agent_process_ = ipc::UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, agent->pid, 0)));
  }
  agent_incarnation_ = welcome->agent_incarnation();
  auto shared = std::make_shared<ipc::Segment>(std::move(*segment));
  producer_ = ipc::FrameProducer(shared->request_ring());
  consumer_ = ipc::FrameConsumer(shared->completion_ring());
  // The call words (CallWord) take the arena's last pages, the caller's buffers the rest.
  const uint64_t granted = shared->layout().arena_bytes;
  if (granted <= call_word_bytes_) {
    return InvalidParams("the agent granted an arena of " + std::to_string(granted) +
                         " bytes, and the call words of max_in_flight take " +
                         std::to_string(call_word_bytes_) +
                         "; ask for a larger arena_bytes or a smaller max_in_flight");
  }
  call_words_ = reinterpret_cast<uint32_t*>(shared->arena().data() + (granted - call_word_bytes_));
  arena_ = std::make_shared<ArenaState>(shared, granted - call_word_bytes_);
  process_memory_ = options.process_memory && welcome->process_memory();

  proto::BufferRef scratch(0, 0);
  if (process_memory_) KVAGENT_RETURN_IF_ERROR(SetAsidePeerScratch(options, &scratch));
  flatbuffers::FlatBufferBuilder attached;
  attached.Finish(
      proto::CreateAttached(attached, client_id_, scratch.length() > 0 ? &scratch : nullptr));
  return ipc::SendMessage(socket_.get(), {attached.GetBufferPointer(), attached.GetSize()},
                          options.connect_timeout);
}

Status Connection::SetAsidePeerScratch(const ClientOptions& options, proto::BufferRef* scratch) {
  const uint64_t arena = arena_bytes();
  const uint64_t bytes = options.peer_scratch_bytes != 0
                             ? options.peer_scratch_bytes
                             : std::min<uint64_t>(arena / 4, uint64_t{64} << 20);
  if (bytes == 0) return Status::Ok();
  auto range = Allocate(bytes);
  if (!range.ok()) {
    return InvalidParams("peer_scratch_bytes " + std::to_string(bytes) + " does not fit the " +
                         std::to_string(arena) + "-byte arena; ask for less");
  }
  *scratch = proto::BufferRef(range->offset(), range->size());
  peer_scratch_ = std::move(*range);
  return Status::Ok();
}

Connection::~Connection() { Close(); }

void Connection::Close() {
  if (closed_.exchange(true)) return;
  MarkDead(Unavailable("the client was closed"));
  if (monitor_.joinable()) {
    uint64_t one = 1;
    (void)!write(monitor_wake_.get(), &one, sizeof(one));
    monitor_.join();
  }
  socket_.Reset();
}

// ---- arena --------------------------------------------------------------------------------

Result<ArenaBuffer> Connection::Allocate(size_t bytes) {
  auto offset = arena_->allocator.Allocate(bytes);
  if (!offset.ok()) return offset.status();
  return ArenaBuffer(arena_, *offset, bytes);
}

// ---- liveness -----------------------------------------------------------------------------

void Connection::Monitor() {
  pollfd fds[2] = {{socket_.get(), POLLIN | POLLRDHUP, 0}, {monitor_wake_.get(), POLLIN, 0}};
  while (true) {
    const int rc = ::poll(fds, 2, -1);
    if (rc < 0 && errno == EINTR) continue;
    if (fds[1].revents != 0) return;  // Close()
    if (fds[0].revents != 0) {
      // The agent never sends anything after Welcome: readable means EOF or a broken agent.
      MarkDead(Unavailable(
          "the agent closed the connection (it exited, was killed or dropped this client); "
          "reconnect with Client::Connect once it is back"));
      return;
    }
  }
}

bool Connection::CheckShutdownWord() {
  if (arena_->segment->header().agent_shutdown.load(std::memory_order_acquire) == 0) return false;
  MarkDead(
      Unavailable("the agent is shutting down; reconnect with Client::Connect once it is "
                  "back"));
  return true;
}

void Connection::MarkDead(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(dead_mu_);
    if (dead_.load(std::memory_order_relaxed)) return;
    dead_status_ = why;
    dead_.store(true, std::memory_order_release);
  }
  // Wake every thread of ours that sleeps on a ring or a condition variable.
  if (arena_) {
    auto* completion = arena_->segment->completion_ring().control;
    completion->data_seq.fetch_add(1, std::memory_order_seq_cst);
    ipc::FutexWake(&completion->data_seq);
    auto* request = arena_->segment->request_ring().control;
    request->space_seq.fetch_add(1, std::memory_order_seq_cst);
    ipc::FutexWake(&request->space_seq);
  }
  { std::lock_guard<std::mutex> lock(reap_mu_); }
  reap_cv_.notify_all();
  { std::lock_guard<std::mutex> lock(slots_mu_); }
  slots_cv_.notify_all();
}

Status Connection::DeadStatus() {
  std::lock_guard<std::mutex> lock(dead_mu_);
  return dead_status_;
}

// ---- slots --------------------------------------------------------------------------------

Result<uint32_t> Connection::AcquireSlot(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(slots_mu_);
  while (free_slots_.empty()) {
    if (!alive()) return DeadStatus();
    if (Clock::now() >= deadline) {
      return Status(ErrorCode::kTimeout, "all " + std::to_string(slot_count_) +
                                             " in-flight calls stayed busy until the timeout; "
                                             "wait for replies or raise max_in_flight");
    }
    // Our own pending calls may be what holds the slots: reap them.
    lock.unlock();
    ReapIfNoLeader();
    lock.lock();
    if (!free_slots_.empty()) break;
    slot_waiters_.fetch_add(1);
    slots_cv_.wait_for(lock, std::chrono::milliseconds(1));
    slot_waiters_.fetch_sub(1);
  }
  const uint32_t index = free_slots_.back();
  free_slots_.pop_back();
  return index;
}

void Connection::ReleaseSlot(uint32_t index) {
  Slot& s = slots_[index];
  s.temporaries.clear();  // returns raw-value copies to the arena
  s.scatters.clear();
  s.reply = Reply{};
  s.id.store(0, std::memory_order_relaxed);
  s.state.store(kFree, std::memory_order_release);
  std::lock_guard<std::mutex> lock(slots_mu_);
  free_slots_.push_back(index);
  if (slot_waiters_.load() > 0) slots_cv_.notify_one();
}

PendingCall Connection::Failed(const Status& status, size_t key_count) {
  return PendingCall(nullptr, 0, 0, FailedReply(status, key_count));
}

// ---- submit -------------------------------------------------------------------------------

PendingCall Connection::Submit(const CallSpec& spec) {
  const size_t n = spec.keys.size();
  if (!alive() || CheckShutdownWord()) return Failed(DeadStatus(), n);
  const auto timeout = spec.options->timeout.count() > 0 ? spec.options->timeout : call_timeout_;
  const Clock::time_point deadline = Clock::now() + timeout;
  if (Status valid = ValidateCall(spec); !valid.ok()) return Failed(valid, n);

  // This thread's scratch (Submit does not re-enter): a call allocates none of them.
  thread_local std::vector<proto::BufferRef> refs;
  thread_local std::vector<proto::MemoryRange> memory;
  thread_local std::vector<uint32_t> counts;
  refs.clear();
  memory.clear();
  counts.clear();
  struct Trim {
    ~Trim() {
      TrimScratch(refs);
      TrimScratch(memory);
      TrimScratch(counts);
    }
  } trim;
  std::vector<ArenaBuffer> temporaries;
  std::vector<Slot::ScatterTarget> scatters;
  if (Status located = LocateValues(spec, &refs, &memory, &counts, &temporaries, &scatters);
      !located.ok()) {
    return Failed(located, n);
  }

  auto index = AcquireSlot(deadline);
  if (!index.ok()) return Failed(index.status(), n);
  Slot& slot = slots_[*index];
  slot.generation = slot.generation + 1 == 0 ? 1 : slot.generation + 1;
  const uint64_t id = (uint64_t{slot.generation} << 32) | *index;
  slot.key_count = n;
  slot.deadline = deadline;
  slot.temporaries = std::move(temporaries);
  slot.scatters = std::move(scatters);
  slot.capacities.clear();
  if (spec.op == proto::Op::Get) {
    slot.capacities.reserve(n);
    size_t range = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!refs.empty()) {
        slot.capacities.push_back(refs[i].length());
        continue;
      }
      uint64_t room = 0;
      for (uint32_t j = 0; j < counts[i]; ++j) room += memory[range++].length();
      slot.capacities.push_back(room);
    }
  }
  slot.state.store(kWaiting, std::memory_order_relaxed);
  slot.id.store(id, std::memory_order_release);
  const bool moves_bytes =
      spec.op == proto::Op::Put || spec.op == proto::Op::Upsert || spec.op == proto::Op::Get;
  uint64_t call_word = 0;
  if (moves_bytes) {
    // Open. The agent leaves it open when it answers, so only a word this slot's last call
    // closed is written: otherwise the word's cache line stays with the agent, which then
    // claims and releases it without a transfer between CPUs (~0.5 us a call on the
    // development VM when the SDK touched it on every call). The push below publishes the
    // store (release) before the agent can see the request.
    if (slot.word_closed) {
      std::atomic_ref<uint32_t>(*CallWord(*index)).store(kCallOpen, std::memory_order_relaxed);
      slot.word_closed = false;
    }
    call_word = 1 + static_cast<uint64_t>(reinterpret_cast<uint8_t*>(CallWord(*index)) -
                                          arena_->segment->arena().data());
  }

  thread_local flatbuffers::FlatBufferBuilder fbb(1024);
  const std::span<const uint8_t> frame =
      EncodeRequest(fbb, id, spec, ValueLocations{refs, memory, counts, call_word},
                    std::chrono::duration_cast<std::chrono::milliseconds>(timeout), deadline);
  Status pushed = Push(id, frame, deadline);
  if (fbb.GetSize() > kScratchKeepBytes) fbb = flatbuffers::FlatBufferBuilder(1024);
  if (!pushed.ok()) {
    ReleaseSlot(*index);
    return Failed(pushed, n);
  }
  return PendingCall(shared_from_this(), *index, id, Reply{});
}

bool Connection::InArena(const void* data, size_t size, uint64_t* offset) const {
  const std::span<uint8_t> arena = arena_->segment->arena().first(arena_bytes());
  const auto start = reinterpret_cast<uintptr_t>(arena.data());
  const auto at = reinterpret_cast<uintptr_t>(data);
  if (at < start || size > arena.size() || at - start > arena.size() - size) return false;
  *offset = at - start;
  return true;
}

Status Connection::LocateValues(const CallSpec& spec, std::vector<proto::BufferRef>* refs,
                                std::vector<proto::MemoryRange>* memory,
                                std::vector<uint32_t>* counts,
                                std::vector<ArenaBuffer>* temporaries,
                                std::vector<Slot::ScatterTarget>* scatters) {
  if (spec.values.empty() && spec.memory_targets.empty() && spec.targets.empty()) {
    return Status::Ok();  // an op without values
  }
  const size_t n = spec.keys.size();
  for (size_t i = 0; i < spec.values.size(); ++i) {
    const ArenaBuffer* b = spec.values[i].buffer();
    if (b != nullptr && b->arena_ != arena_) {
      return Status(ErrorCode::kBufferOutOfRange,
                    "values[" + std::to_string(i) +
                        "] was allocated by another Client; allocate it from this one");
    }
  }
  // Where key i's bytes are when they are one range of our arena (an ArenaBuffer, or memory
  // that happens to lie in the arena, e.g. a host pool allocated from it): the agent then
  // copies them from/to the arena without any copy here.
  thread_local std::vector<proto::BufferRef> in_arena;  // this thread's scratch
  thread_local std::vector<uint8_t> is_in_arena;
  in_arena.assign(n, proto::BufferRef());
  is_in_arena.assign(n, 0);
  struct Trim {
    ~Trim() {
      TrimScratch(in_arena);
      TrimScratch(is_in_arena);
    }
  } trim;
  size_t arena_keys = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t offset = 0;
    bool found = false;
    size_t size = 0;
    if (!spec.values.empty()) {
      const Value& v = spec.values[i];
      size = v.length();
      if (v.buffer() != nullptr) {
        offset = v.buffer()->offset();
        found = true;
      } else if (v.ranges().size() <= 1) {
        const void* data = v.ranges().empty() ? v.bytes().data() : v.ranges()[0].data;
        found = InArena(data, size, &offset);
      }
    } else if (!spec.memory_targets.empty()) {
      const MemoryValue target = spec.memory_targets[i];
      if (target.size() == 1) {
        size = target[0].size;
        found = InArena(target[0].data, size, &offset);
      }
    } else {
      const ArenaBuffer* t = spec.targets[i];
      if (t->arena_ != arena_) {
        return Status(ErrorCode::kBufferOutOfRange,
                      "buffers[" + std::to_string(i) +
                          "] was allocated by another Client; allocate it from this one");
      }
      offset = t->offset();
      size = t->size();
      found = true;
    }
    if (found) {
      in_arena[i] = proto::BufferRef(offset, size);
      is_in_arena[i] = 1;
      ++arena_keys;
    }
  }
  if (arena_keys == n) {
    refs->swap(in_arena);  // both this thread's scratch: no copy
    return Status::Ok();
  }
  auto ranges_of = [&](size_t i) -> MemoryValue {
    if (!spec.memory_targets.empty()) return spec.memory_targets[i];
    return spec.values[i].ranges();
  };
  if (process_memory_) {
    // The agent reads (put) or writes (get) every key in our memory directly.
    counts->reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const MemoryValue ranges = ranges_of(i);
      if (!ranges.empty()) {
        for (const MemoryRange& r : ranges) {
          memory->emplace_back(reinterpret_cast<uintptr_t>(r.data), r.size);
        }
        counts->push_back(static_cast<uint32_t>(ranges.size()));
        continue;
      }
      const Value& v = spec.values[i];
      const void* data = v.buffer() != nullptr ? v.buffer()->data() : v.bytes().data();
      memory->emplace_back(reinterpret_cast<uintptr_t>(data), v.length());
      counts->push_back(1);
    }
    return Status::Ok();
  }
  // Without process memory: what is not in the arena goes through a temporary arena buffer,
  // copied in here (put) or out when the reply comes (get: Scatter).
  refs->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (is_in_arena[i]) {
      refs->push_back(in_arena[i]);
      continue;
    }
    const MemoryValue ranges = ranges_of(i);
    size_t size = 0;
    for (const MemoryRange& r : ranges) size += r.size;
    if (ranges.empty()) size = spec.values[i].length();
    auto temporary = Allocate(std::max<size_t>(size, 1));
    KVAGENT_RETURN_IF_ERROR(temporary.status());
    refs->emplace_back(temporary->offset(), size);
    if (!spec.memory_targets.empty()) {
      scatters->push_back(
          Slot::ScatterTarget{i, temporaries->size(), {ranges.begin(), ranges.end()}});
    } else if (ranges.empty()) {
      std::memcpy(temporary->data(), spec.values[i].bytes().data(), size);
    } else {
      uint8_t* at = temporary->data();
      for (const MemoryRange& r : ranges) {
        std::memcpy(at, r.data, r.size);
        at += r.size;
      }
    }
    temporaries->push_back(std::move(*temporary));
  }
  return Status::Ok();
}

void Connection::Scatter(Slot& slot, const Reply& reply) {
  for (const Slot::ScatterTarget& t : slot.scatters) {
    if (t.key >= reply.keys.size() || reply.keys[t.key].code != ErrorCode::kOk) continue;
    const ArenaBuffer& staged = slot.temporaries[t.temporary];
    CopyToRanges(staged.data(), std::min<size_t>(reply.keys[t.key].length, staged.size()),
                 t.ranges);
  }
}

Status Connection::Push(uint64_t id, std::span<const uint8_t> frame, Clock::time_point deadline) {
  std::lock_guard<std::mutex> lock(produce_mu_);
  while (true) {
    switch (producer_.TryPush(id, frame)) {
      case ipc::PushResult::kOk:
        return Status::Ok();
      case ipc::PushResult::kTooLarge:
        return InvalidParams("the request is " + std::to_string(frame.size()) +
                             " bytes and the request ring holds at most " +
                             std::to_string(ipc::MaxFramePayload(producer_.capacity())) +
                             "; split the batch or connect with a larger ring_bytes");
      case ipc::PushResult::kCorrupt:
        MarkDead(Unavailable("the request ring is corrupt; reconnect"));
        return DeadStatus();
      case ipc::PushResult::kFull:
        break;
    }
    // Full: wait for the agent to make room, never drop. The agent stops reading requests
    // while our completion ring is full, so reap completions meanwhile.
    if (!alive() || CheckShutdownWord()) return DeadStatus();
    const auto now = Clock::now();
    if (now >= deadline) {
      return Status(ErrorCode::kTimeout,
                    "the request ring stayed full until the timeout; the agent is overloaded");
    }
    ReapIfNoLeader();
    const auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(1));
    (void)producer_.WaitForSpace(frame.size(), spin_, slice, slice, [] { return false; });
  }
}

// ---- reaping ------------------------------------------------------------------------------

bool Connection::TryLead() {
  std::lock_guard<std::mutex> lock(reap_mu_);
  if (leader_active_) return false;
  leader_active_ = true;
  return true;
}

void Connection::Resign() {
  std::lock_guard<std::mutex> lock(reap_mu_);
  leader_active_ = false;
  if (followers_.load() > 0) reap_cv_.notify_all();
}

void Connection::ReapIfNoLeader() {
  if (!TryLead()) return;
  Reap();
  Resign();
}

void Connection::Reap() {
  ipc::Frame frame;
  while (true) {
    const ipc::PeekResult r = consumer_.Peek(&frame);
    if (r == ipc::PeekResult::kEmpty) break;
    if (r == ipc::PeekResult::kCorrupt) {
      MarkDead(Unavailable("the completion ring is corrupt; reconnect"));
      return;
    }
    Deliver(frame.request_id, frame.payload);
    consumer_.Consume();
  }
  consumer_.PublishHead();  // one fence for everything reaped
}

void Connection::Deliver(uint64_t request_id, std::span<const uint8_t> frame) {
  const uint32_t index = static_cast<uint32_t>(request_id);
  if (index >= slot_count_) return;
  Slot& s = slots_[index];
  if (s.id.load(std::memory_order_acquire) != request_id) return;  // stale: the slot moved on
  // Only a call still waiting for its answer takes one: a second completion for the same id (a
  // buggy agent) must not overwrite the reply its owner is reading.
  const uint32_t state = s.state.load(std::memory_order_acquire);
  if (state != kWaiting && state != kAbandoned) return;
  s.reply = DecodeCompletion(frame, s.key_count);
  if (!s.capacities.empty()) CheckGetLengths(s.capacities, &s.reply);
  // seq_cst, with the load of followers_ below: the hand-off to a follower (connection.h).
  const uint32_t previous = s.state.exchange(kDone, std::memory_order_seq_cst);
  if (previous == kAbandoned) {
    ReleaseSlot(index);
  } else if (followers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(reap_mu_); }
    reap_cv_.notify_all();
  }
}

void Connection::Lead(Slot& slot) {
  while (slot.state.load(std::memory_order_acquire) != kDone) {
    Reap();
    if (slot.state.load(std::memory_order_acquire) == kDone) return;
    if (!alive() || CheckShutdownWord()) return;
    const auto now = Clock::now();
    if (now >= slot.deadline) return;
    const auto left = std::min<Clock::duration>(slot.deadline - now, kSlice);
    (void)consumer_.WaitForData(spin_, left, [this] { return !alive() || CheckShutdownWord(); });
  }
}

void Connection::Follow(Slot& slot) {
  std::unique_lock<std::mutex> lock(reap_mu_);
  // seq_cst, with the predicate's load of the slot's state: the hand-off (connection.h).
  followers_.fetch_add(1, std::memory_order_seq_cst);
  const auto until = std::min(slot.deadline, Clock::now() + kSlice);
  reap_cv_.wait_until(lock, until, [&] {
    return slot.state.load(std::memory_order_seq_cst) == kDone || !leader_active_ || !alive();
  });
  followers_.fetch_sub(1, std::memory_order_relaxed);
}

bool Connection::Ready(uint32_t index, uint64_t id) {
  Slot& s = slots_[index];
  if (s.id.load(std::memory_order_acquire) != id) return true;
  if (s.state.load(std::memory_order_acquire) == kDone) return true;
  if (!alive() || Clock::now() >= s.deadline) return true;
  ReapIfNoLeader();
  return s.state.load(std::memory_order_acquire) == kDone;
}

Reply Connection::Wait(uint32_t index, uint64_t id) {
  Slot& s = slots_[index];
  if (s.id.load(std::memory_order_acquire) != id) {
    return FailedReply(Internal("PendingCall waited twice"), 0);
  }
  while (true) {
    if (s.state.load(std::memory_order_acquire) == kDone) {
      Reply reply = std::move(s.reply);
      Scatter(s, reply);
      ReleaseSlot(index);
      return reply;
    }
    if (!alive()) {
      const size_t n = s.key_count;
      Abandon(index, id);
      return FailedReply(DeadStatus(), n);
    }
    if (Clock::now() >= s.deadline) {
      // The agent may be moving this call's bytes: then its answer comes first, since the
      // caller may reuse its buffers as soon as this returns.
      AwaitMoved(s, index);
      if (s.state.load(std::memory_order_acquire) == kDone) continue;
      const size_t n = s.key_count;
      Abandon(index, id);
      return FailedReply(Status(ErrorCode::kTimeout,
                                "no reply from the agent before the call's timeout; the agent "
                                "may be overloaded, or raise the timeout"),
                         n);
    }
    if (TryLead()) {
      Lead(s);
      Resign();
    } else {
      Follow(s);
    }
  }
}

uint32_t* Connection::CallWord(uint32_t index) const { return call_words_ + index; }

bool Connection::CloseCall(uint32_t index) {
  std::atomic_ref<uint32_t> word(*CallWord(index));
  uint32_t expected = kCallOpen;
  if (word.compare_exchange_strong(expected, kCallClosed, std::memory_order_acq_rel,
                                   std::memory_order_acquire)) {
    slots_[index].word_closed = true;
    return true;
  }
  if (expected == kCallMoving) return false;
  slots_[index].word_closed = true;  // closed already: open it for the slot's next call
  return true;
}

void Connection::AwaitMoved(Slot& s, uint32_t index) {
  while (s.state.load(std::memory_order_acquire) != kDone && !CloseCall(index)) {
    if (!alive()) {
      // No answer will come (the agent exited, is shutting down, or dropped this client), but
      // until it gives the word back it may still be moving the call's bytes (a transfer in
      // flight finishes into the arena it keeps mapped): watch the word until then, or until
      // its process is gone.
      if (!AgentRunning()) return;
      std::this_thread::sleep_for(kMovingSlice);
      continue;
    }
    // Moving: the agent answers once its copy or transfer ends (a transfer that stalls fails
    // after the data plane's peer timeout). Wait for that answer a slice at a time.
    s.deadline = Clock::now() + kMovingSlice;
    if (TryLead()) {
      Lead(s);
      Resign();
    } else {
      Follow(s);
    }
  }
}

bool Connection::AgentRunning() const {
  if (!agent_process_.valid()) return false;  // unknown (another pid namespace): as if gone
  pollfd pfd{agent_process_.get(), POLLIN, 0};
  return ::poll(&pfd, 1, 0) == 0;  // a pidfd turns readable when its process exits
}

void Connection::Abandon(uint32_t index, uint64_t id) {
  Slot& s = slots_[index];
  if (s.id.load(std::memory_order_acquire) != id) return;
  // A call dropped unanswered: its caller may free its buffers once this returns.
  AwaitMoved(s, index);
  const uint32_t previous = s.state.exchange(kAbandoned, std::memory_order_acq_rel);
  if (previous == kDone) ReleaseSlot(index);
  // Otherwise the reaper frees it when (if) the completion arrives.
}

}  // namespace kvagent::sdk_detail

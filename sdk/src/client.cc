#include "kvagent/client.h"

#include "call_codec.h"
#include "connection.h"

namespace kvagent {

using sdk_detail::CallSpec;
using sdk_detail::Connection;

// ---- ArenaBuffer --------------------------------------------------------------------------

ArenaBuffer::ArenaBuffer(std::shared_ptr<sdk_detail::ArenaState> arena, uint64_t offset,
                         size_t size)
    : arena_(std::move(arena)),
      data_(arena_->segment->arena().data() + offset),
      size_(size),
      offset_(offset) {}

ArenaBuffer::ArenaBuffer(ArenaBuffer&& other) noexcept
    : arena_(std::move(other.arena_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      offset_(std::exchange(other.offset_, 0)) {}

ArenaBuffer& ArenaBuffer::operator=(ArenaBuffer&& other) noexcept {
  if (this != &other) {
    if (arena_ && data_ != nullptr) arena_->allocator.Free(offset_);
    arena_ = std::move(other.arena_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    offset_ = std::exchange(other.offset_, 0);
  }
  return *this;
}

ArenaBuffer::~ArenaBuffer() {
  if (arena_ && data_ != nullptr) arena_->allocator.Free(offset_);
}

// ---- Value --------------------------------------------------------------------------------

Value::Value(MemoryValue ranges) : ranges_(ranges) {
  for (const MemoryRange& r : ranges) length_ += r.size;
}

// ---- PendingCall --------------------------------------------------------------------------

PendingCall::PendingCall()
    : failed_(sdk_detail::FailedReply(Internal("this PendingCall holds no call"), 0)) {}

PendingCall::PendingCall(std::shared_ptr<Connection> connection, uint32_t slot, uint64_t id,
                         Reply failed)
    : connection_(std::move(connection)), slot_(slot), id_(id), failed_(std::move(failed)) {}

PendingCall::PendingCall(PendingCall&& other) noexcept
    : connection_(std::move(other.connection_)),
      slot_(other.slot_),
      id_(std::exchange(other.id_, 0)),
      failed_(std::move(other.failed_)) {}

PendingCall& PendingCall::operator=(PendingCall&& other) noexcept {
  if (this != &other) {
    if (connection_) connection_->Abandon(slot_, id_);
    connection_ = std::move(other.connection_);
    slot_ = other.slot_;
    id_ = std::exchange(other.id_, 0);
    failed_ = std::move(other.failed_);
  }
  return *this;
}

PendingCall::~PendingCall() {
  if (connection_) connection_->Abandon(slot_, id_);
}

bool PendingCall::Ready() { return connection_ ? connection_->Ready(slot_, id_) : true; }

Reply PendingCall::Wait() {
  if (!connection_) return std::move(failed_);
  Reply reply = connection_->Wait(slot_, id_);
  connection_.reset();
  return reply;
}

// ---- Client -------------------------------------------------------------------------------

Client::Client(std::shared_ptr<Connection> connection) : connection_(std::move(connection)) {}

Result<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  auto connection = Connection::Open(options);
  if (!connection.ok()) return connection.status();
  return std::unique_ptr<Client>(new Client(std::move(*connection)));
}

Client::~Client() { connection_->Close(); }

Result<ArenaBuffer> Client::Allocate(size_t bytes) { return connection_->Allocate(bytes); }

uint64_t Client::client_id() const { return connection_->client_id(); }
uint64_t Client::agent_incarnation() const { return connection_->agent_incarnation(); }
uint64_t Client::agent_epoch() const { return agent_incarnation(); }
uint64_t Client::arena_bytes() const { return connection_->arena_bytes(); }
bool Client::connected() const { return connection_->alive(); }
bool Client::process_memory() const { return connection_->process_memory(); }

PendingCall Client::Submit(const CallSpec& spec) { return connection_->Submit(spec); }

namespace {

CallSpec Spec(proto::Op op, std::span<const std::string> keys, const CallOptions& options) {
  CallSpec spec;
  spec.op = op;
  spec.keys = keys;
  spec.options = &options;
  return spec;
}

}  // namespace

PendingCall Client::SubmitPing(std::chrono::milliseconds timeout) {
  CallOptions options;
  options.timeout = timeout;
  return Submit(Spec(proto::Op::Ping, {}, options));
}

PendingCall Client::SubmitPut(std::span<const std::string> keys, std::span<const Value> values,
                              const CallOptions& options) {
  CallSpec spec = Spec(proto::Op::Put, keys, options);
  spec.values = values;
  return Submit(spec);
}

PendingCall Client::SubmitUpsert(std::span<const std::string> keys, std::span<const Value> values,
                                 const CallOptions& options) {
  CallSpec spec = Spec(proto::Op::Upsert, keys, options);
  spec.values = values;
  return Submit(spec);
}

PendingCall Client::SubmitGet(std::span<const std::string> keys,
                              std::span<const ArenaBuffer* const> buffers,
                              const CallOptions& options) {
  CallSpec spec = Spec(proto::Op::Get, keys, options);
  spec.targets = buffers;
  return Submit(spec);
}

PendingCall Client::SubmitGetInto(std::span<const std::string> keys,
                                  std::span<const MemoryValue> targets,
                                  const CallOptions& options) {
  CallSpec spec = Spec(proto::Op::Get, keys, options);
  spec.memory_targets = targets;
  return Submit(spec);
}

PendingCall Client::SubmitExist(std::span<const std::string> keys, const CallOptions& options) {
  return Submit(Spec(proto::Op::Exist, keys, options));
}

PendingCall Client::SubmitRemove(std::span<const std::string> keys, const CallOptions& options) {
  return Submit(Spec(proto::Op::Remove, keys, options));
}

PendingCall Client::SubmitRemoveAll(const CallOptions& options) {
  return Submit(Spec(proto::Op::RemoveAll, {}, options));
}

PendingCall Client::SubmitList(const ListOptions& list) {
  CallOptions options;
  options.timeout = list.timeout;
  CallSpec spec = Spec(proto::Op::List, {}, options);
  spec.list = &list;
  return Submit(spec);
}

PendingCall Client::SubmitStat(std::chrono::milliseconds timeout) {
  CallOptions options;
  options.timeout = timeout;
  return Submit(Spec(proto::Op::Stat, {}, options));
}

PendingCall Client::SubmitSessions(const SessionsOptions& sessions) {
  CallOptions options;
  options.timeout = sessions.timeout;
  CallSpec spec = Spec(proto::Op::Sessions, {}, options);
  spec.sessions = &sessions;
  return Submit(spec);
}

Reply Client::List(const ListOptions& options) { return SubmitList(options).Wait(); }

Reply Client::Sessions(const SessionsOptions& options) { return SubmitSessions(options).Wait(); }

Reply Client::Stat(std::chrono::milliseconds timeout) { return SubmitStat(timeout).Wait(); }

Reply Client::Ping(std::chrono::milliseconds timeout) { return SubmitPing(timeout).Wait(); }

Reply Client::Put(std::span<const std::string> keys, std::span<const Value> values,
                  const CallOptions& options) {
  return SubmitPut(keys, values, options).Wait();
}

Reply Client::Upsert(std::span<const std::string> keys, std::span<const Value> values,
                     const CallOptions& options) {
  return SubmitUpsert(keys, values, options).Wait();
}

Reply Client::Get(std::span<const std::string> keys, std::span<const ArenaBuffer* const> buffers,
                  const CallOptions& options) {
  return SubmitGet(keys, buffers, options).Wait();
}

Reply Client::GetInto(std::span<const std::string> keys, std::span<const MemoryValue> targets,
                      const CallOptions& options) {
  return SubmitGetInto(keys, targets, options).Wait();
}

Reply Client::Exist(std::span<const std::string> keys, const CallOptions& options) {
  return SubmitExist(keys, options).Wait();
}

Reply Client::Remove(std::span<const std::string> keys, const CallOptions& options) {
  return SubmitRemove(keys, options).Wait();
}

Reply Client::RemoveAll(const CallOptions& options) { return SubmitRemoveAll(options).Wait(); }

}  // namespace kvagent

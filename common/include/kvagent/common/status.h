// Errors as values: ErrorCode (the codes of docs/semantics.md, "Error codes"), Status and
// Result<T>.
//
// Every error that reaches a caller is a code plus a message that says what is wrong and what to
// do about it. No exception crosses a module boundary, the C ABI or shared memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kvagent {

// Wire values are part of the protocol (agent.fbs and master.fbs carry them as ushort): never
// renumber, only append.
enum class ErrorCode : uint16_t {
  kOk = 0,
  kInvalidParams = 1,
  kObjectNotFound = 2,
  kObjectAlreadyExists = 3,
  kReplicaNotReady = 4,
  kObjectBusy = 5,
  kObjectHasLease = 6,
  kNoSpace = 7,
  kBufferOutOfRange = 8,
  kTransferFailed = 9,
  kTimeout = 10,
  kAgentUnavailable = 11,
  kMasterUnavailable = 12,
  kInternal = 13,
  // Get: every replica of the value failed its checksum (the bytes in the pools are not what
  // was stored); the replicas were dropped. Put the value again.
  kDataCorrupted = 14,
};

inline constexpr uint16_t kMaxErrorCode = 14;

// "OK", "INVALID_PARAMS", ... exactly as docs/semantics.md and docs/protocol.md spell them.
std::string_view ErrorCodeName(ErrorCode code);

// Maps a wire value to an ErrorCode; values from a newer peer that we do not know map to
// kInternal so that a caller never sees an out-of-range enum.
ErrorCode ErrorCodeFromWire(uint16_t wire);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

  bool IsNotFound() const { return code_ == ErrorCode::kObjectNotFound; }
  bool IsAlreadyExists() const { return code_ == ErrorCode::kObjectAlreadyExists; }
  bool IsInvalidParams() const { return code_ == ErrorCode::kInvalidParams; }
  bool IsTimeout() const { return code_ == ErrorCode::kTimeout; }

  // "INVALID_PARAMS: session_ids[2] is 257 bytes; the limit is 256" or "OK".
  std::string ToString() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// Shorthands that read like English at the call site.
inline Status InvalidParams(std::string message) {
  return Status(ErrorCode::kInvalidParams, std::move(message));
}
inline Status Internal(std::string message) {
  return Status(ErrorCode::kInternal, std::move(message));
}

// A value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Internal("Result constructed from an OK status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace kvagent

// Propagates a non-OK Status out of the enclosing function.
#define KVAGENT_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::kvagent::Status kvagent_status_ = (expr);        \
    if (!kvagent_status_.ok()) return kvagent_status_; \
  } while (0)

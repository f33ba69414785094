#include "kvagent/common/status.h"

namespace kvagent {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "OK";
    case ErrorCode::kInvalidParams:
      return "INVALID_PARAMS";
    case ErrorCode::kObjectNotFound:
      return "OBJECT_NOT_FOUND";
    case ErrorCode::kObjectAlreadyExists:
      return "OBJECT_ALREADY_EXISTS";
    case ErrorCode::kReplicaNotReady:
      return "REPLICA_NOT_READY";
    case ErrorCode::kObjectBusy:
      return "OBJECT_BUSY";
    case ErrorCode::kObjectHasLease:
      return "OBJECT_HAS_LEASE";
    case ErrorCode::kNoSpace:
      return "NO_SPACE";
    case ErrorCode::kBufferOutOfRange:
      return "BUFFER_OUT_OF_RANGE";
    case ErrorCode::kTransferFailed:
      return "TRANSFER_FAILED";
    case ErrorCode::kTimeout:
      return "TIMEOUT";
    case ErrorCode::kAgentUnavailable:
      return "AGENT_UNAVAILABLE";
    case ErrorCode::kMasterUnavailable:
      return "MASTER_UNAVAILABLE";
    case ErrorCode::kInternal:
      return "INTERNAL";
    case ErrorCode::kDataCorrupted:
      return "DATA_CORRUPTED";
  }
  return "INTERNAL";
}

ErrorCode ErrorCodeFromWire(uint16_t wire) {
  if (wire > kMaxErrorCode) return ErrorCode::kInternal;
  return static_cast<ErrorCode>(wire);
}

std::string Status::ToString() const {
  std::string out(ErrorCodeName(code_));
  if (!message_.empty()) {
    out += ": ";
    out += message_;
  }
  return out;
}

}  // namespace kvagent

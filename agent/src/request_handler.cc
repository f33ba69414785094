#include "kvagent/agent/request_handler.h"

#include "kvagent/ipc/segment.h"

namespace kvagent::agent {

const proto::Request& ClientRequest::request() const {
  return *flatbuffers::GetRoot<proto::Request>(frame.data());
}

size_t ClientRequest::key_count() const {
  const auto* keys = request().keys();
  return keys == nullptr ? 0 : keys->size();
}

std::span<uint8_t> ClientRequest::arena() const {
  return segment ? segment->arena() : std::span<uint8_t>();
}

CompletionData CompletionData::FailAll(const Status& status, size_t key_count) {
  CompletionData data;
  data.status = status;
  data.codes.assign(key_count, status.code());
  data.messages.assign(key_count, status.message());
  return data;
}

}  // namespace kvagent::agent

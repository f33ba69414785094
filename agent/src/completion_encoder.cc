#include "completion_encoder.h"

#include <vector>

namespace kvagent::agent {
namespace {

std::span<const uint8_t> Finish(flatbuffers::FlatBufferBuilder& fbb,
                                flatbuffers::Offset<proto::Completion> root) {
  fbb.Finish(root);
  return {fbb.GetBufferPointer(), fbb.GetSize()};
}

}  // namespace

std::span<const uint8_t> EncodeCompletion(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                          const CompletionData& data) {
  fbb.Clear();
  const auto message = fbb.CreateString(data.status.message());
  std::vector<uint16_t> codes(data.codes.size());
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint16_t>(data.codes[i]);
  const auto codes_vec = fbb.CreateVector(codes);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> messages;
  if (!data.messages.empty()) messages = fbb.CreateVectorOfStrings(data.messages);
  flatbuffers::Offset<flatbuffers::Vector<uint64_t>> lengths;
  if (!data.lengths.empty()) lengths = fbb.CreateVector(data.lengths);
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> exists;
  if (!data.exists.empty()) {
    std::vector<uint8_t> flags(data.exists.begin(), data.exists.end());
    exists = fbb.CreateVector(flags);
  }
  proto::CompletionBuilder b(fbb);
  b.add_request_id(request_id);
  b.add_status(static_cast<uint16_t>(data.status.code()));
  b.add_message(message);
  b.add_codes(codes_vec);
  if (!messages.IsNull()) b.add_messages(messages);
  if (!lengths.IsNull()) b.add_lengths(lengths);
  if (!exists.IsNull()) b.add_exists(exists);
  b.add_removed_count(data.removed_count);
  return Finish(fbb, b.Finish());
}

std::span<const uint8_t> EncodeFailure(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                       const Status& status, size_t key_count) {
  fbb.Clear();
  const auto message = fbb.CreateString(status.message());
  std::vector<uint16_t> codes(key_count, static_cast<uint16_t>(status.code()));
  const auto codes_vec = fbb.CreateVector(codes);
  std::vector<flatbuffers::Offset<flatbuffers::String>> shared(key_count, message);
  const auto messages = fbb.CreateVector(shared);
  proto::CompletionBuilder b(fbb);
  b.add_request_id(request_id);
  b.add_status(static_cast<uint16_t>(status.code()));
  b.add_message(message);
  b.add_codes(codes_vec);
  b.add_messages(messages);
  return Finish(fbb, b.Finish());
}

std::span<const uint8_t> EncodePingReply(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id) {
  fbb.Clear();
  proto::CompletionBuilder b(fbb);
  b.add_request_id(request_id);
  return Finish(fbb, b.Finish());
}

}  // namespace kvagent::agent

#include "completion_encoder.h"

#include <string>
#include <vector>

namespace kvagent::agent {
namespace {

std::span<const uint8_t> Finish(flatbuffers::FlatBufferBuilder& fbb,
                                flatbuffers::Offset<proto::Completion> root) {
  fbb.Finish(root);
  return {fbb.GetBufferPointer(), fbb.GetSize()};
}

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<proto::ListedKey>>> EncodeListed(
    flatbuffers::FlatBufferBuilder& fbb, const std::vector<ListedKey>& listed) {
  if (listed.empty()) return 0;
  std::vector<flatbuffers::Offset<proto::ListedKey>> out;
  out.reserve(listed.size());
  for (const ListedKey& k : listed) {
    const auto key = fbb.CreateString(k.key);
    const auto session = k.session_id.empty() ? 0 : fbb.CreateString(k.session_id);
    out.push_back(proto::CreateListedKey(fbb, key, k.size, session));
  }
  return fbb.CreateVector(out);
}

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<proto::Counter>>> EncodeCounters(
    flatbuffers::FlatBufferBuilder& fbb, const std::vector<Counter>& counters) {
  if (counters.empty()) return 0;
  std::vector<flatbuffers::Offset<proto::Counter>> out;
  out.reserve(counters.size());
  for (const Counter& c : counters) {
    const auto name = fbb.CreateString(c.name);
    const auto text = c.text.empty() ? 0 : fbb.CreateString(c.text);
    out.push_back(proto::CreateCounter(fbb, name, c.value, text));
  }
  return fbb.CreateVector(out);
}

// "3 of 20000 keys failed; keys[17]: NO_SPACE: ..." for a completion without per-key messages.
std::string FailureSummary(const CompletionData& data) {
  size_t failed = 0;
  size_t first = data.codes.size();
  for (size_t i = 0; i < data.codes.size(); ++i) {
    if (data.codes[i] == ErrorCode::kOk) continue;
    if (failed++ == 0) first = i;
  }
  std::string out = data.status.message();
  if (failed == 0) return out;
  if (!out.empty()) out += "; ";
  out += std::to_string(failed) + " of " + std::to_string(data.codes.size()) +
         " keys failed (per-key messages omitted: too many for one completion); keys[" +
         std::to_string(first) + "]: " + std::string(ErrorCodeName(data.codes[first]));
  if (first < data.messages.size() && !data.messages[first].empty()) {
    out += ": " + data.messages[first];
  }
  return out;
}

}  // namespace

std::span<const uint8_t> EncodeCompletion(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                          const CompletionData& data, KeyMessages key_messages) {
  fbb.Clear();
  const bool each = key_messages == KeyMessages::kEach;
  const auto message = fbb.CreateString(each ? data.status.message() : FailureSummary(data));
  // Written in place: no vector of its own per completion.
  uint16_t* codes = nullptr;
  const auto codes_vec = fbb.CreateUninitializedVector(data.codes.size(), &codes);
  for (size_t i = 0; i < data.codes.size(); ++i) {
    flatbuffers::WriteScalar(codes + i, static_cast<uint16_t>(data.codes[i]));
  }
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> messages;
  if (each && !data.messages.empty()) {
    // A large batch usually fails for one reason: each distinct message is stored once.
    std::vector<flatbuffers::Offset<flatbuffers::String>> texts;
    texts.reserve(data.messages.size());
    for (const std::string& m : data.messages) texts.push_back(fbb.CreateSharedString(m));
    messages = fbb.CreateVector(texts);
  }
  flatbuffers::Offset<flatbuffers::Vector<uint64_t>> lengths;
  if (!data.lengths.empty()) lengths = fbb.CreateVector(data.lengths);
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> exists;
  if (!data.exists.empty()) {
    std::vector<uint8_t> flags(data.exists.begin(), data.exists.end());
    exists = fbb.CreateVector(flags);
  }
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> replicas;
  if (!data.replicas.empty()) replicas = fbb.CreateVector(data.replicas);
  const auto listed = EncodeListed(fbb, data.listed);
  const auto counters = EncodeCounters(fbb, data.counters);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<proto::SessionUsage>>> sessions;
  if (!data.sessions.empty()) {
    std::vector<flatbuffers::Offset<proto::SessionUsage>> out;
    out.reserve(data.sessions.size());
    for (const SessionUsage& u : data.sessions) {
      out.push_back(proto::CreateSessionUsageDirect(fbb, u.session_id.c_str(), u.blocks, u.bytes));
    }
    sessions = fbb.CreateVector(out);
  }
  proto::CompletionBuilder b(fbb);
  b.add_request_id(request_id);
  b.add_status(static_cast<uint16_t>(data.status.code()));
  b.add_message(message);
  b.add_codes(codes_vec);
  if (!messages.IsNull()) b.add_messages(messages);
  if (!lengths.IsNull()) b.add_lengths(lengths);
  if (!exists.IsNull()) b.add_exists(exists);
  if (!replicas.IsNull()) b.add_replicas(replicas);
  b.add_removed_count(data.removed_count);
  if (!listed.IsNull()) b.add_listed(listed);
  b.add_next_cursor(data.next_cursor);
  if (!counters.IsNull()) b.add_counters(counters);
  if (!sessions.IsNull()) b.add_sessions(sessions);
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

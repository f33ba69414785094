#include "replication_log.h"

#include <algorithm>
#include <cstring>

namespace kvagent::master {
namespace {

constexpr size_t kBlockBytes = 1 << 20;

uint32_t ReadU32(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

constexpr size_t kFrameHeader = 4;

}  // namespace

void AppendFramedRecord(std::string_view payload, std::string* out) {
  const auto n = static_cast<uint32_t>(payload.size());
  const char len[4] = {static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16),
                       static_cast<char>(n >> 24)};
  out->append(len, kFrameHeader);
  out->append(payload);
}

bool ForEachFramedRecord(std::string_view bytes, const std::function<void(std::string_view)>& fn) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (bytes.size() - pos < kFrameHeader) return false;
    const uint32_t len = ReadU32(bytes.data() + pos);
    pos += kFrameHeader;
    if (bytes.size() - pos < len) return false;
    fn(bytes.substr(pos, len));
    pos += len;
  }
  return true;
}

void ReplicationLog::Append(std::string_view payload) {
  if (budget_ == 0) return;
  if (blocks_.empty() ||
      blocks_.back().bytes.size() + payload.size() + kFrameHeader > kBlockBytes) {
    Block b;
    b.first_seq = next_seq_;
    b.bytes.reserve(std::max(kBlockBytes, payload.size() + kFrameHeader));
    blocks_.push_back(std::move(b));
  }
  Block& back = blocks_.back();
  AppendFramedRecord(payload, &back.bytes);
  ++back.count;
  ++next_seq_;
  bytes_ += payload.size() + kFrameHeader;
  // Keep the newest block whatever its size; drop the oldest while over budget.
  while (blocks_.size() > 1 && bytes_ > budget_) {
    bytes_ -= blocks_.front().bytes.size();
    blocks_.pop_front();
  }
}

bool ReplicationLog::Covers(uint64_t seq) const {
  if (seq == last_seq()) return true;
  if (seq > last_seq() || blocks_.empty()) return false;
  return seq + 1 >= blocks_.front().first_seq;
}

uint64_t ReplicationLog::ReadAfter(uint64_t seq, size_t max_bytes, std::string* out) const {
  uint64_t last = seq;
  const size_t start = out->size();
  bool full = false;
  for (const Block& b : blocks_) {
    if (full) break;
    if (b.first_seq + b.count <= seq + 1) continue;  // every record of b is at or before seq
    uint64_t s = b.first_seq;
    ForEachFramedRecord(b.bytes, [&](std::string_view payload) {
      if (full || s++ <= seq) return;
      if (out->size() > start && out->size() - start + payload.size() + kFrameHeader > max_bytes) {
        full = true;
        return;
      }
      AppendFramedRecord(payload, out);
      last = s - 1;
    });
  }
  return last;
}

}  // namespace kvagent::master

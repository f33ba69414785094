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

}  // namespace

void AppendFramedRecord(std::string_view payload, std::string* out) {
  const auto n = static_cast<uint32_t>(payload.size());
  const char len[4] = {static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16),
                       static_cast<char>(n >> 24)};
  out->append(len, 4);
  out->append(payload);
}

void ReplicationLog::Append(std::string_view payload) {
  if (budget_ == 0) return;
  if (blocks_.empty() || blocks_.back().bytes.size() + payload.size() + 4 > kBlockBytes) {
    Block b;
    b.first_seq = next_seq_;
    b.bytes.reserve(std::max(kBlockBytes, payload.size() + 4));
    blocks_.push_back(std::move(b));
  }
  Block& back = blocks_.back();
  AppendFramedRecord(payload, &back.bytes);
  ++back.count;
  ++next_seq_;
  bytes_ += payload.size() + 4;
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
  for (const Block& b : blocks_) {
    if (b.first_seq + b.count <= seq + 1) continue;  // every record of b is at or before seq
    size_t pos = 0;
    for (uint64_t s = b.first_seq; s < b.first_seq + b.count; ++s) {
      const uint32_t len = ReadU32(b.bytes.data() + pos);
      if (s > seq) {
        if (out->size() > start && out->size() - start + len + 4 > max_bytes) return last;
        out->append(b.bytes, pos, len + 4);
        last = s;
      }
      pos += 4 + len;
    }
  }
  return last;
}

}  // namespace kvagent::master

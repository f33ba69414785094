#include "write_reservations.h"

#include <glog/logging.h>

#include <algorithm>

namespace kvagent::agent {
namespace {

constexpr size_t kMaxClasses = 8;                // sizes kept in stock at once
constexpr uint64_t kClassShare = 4;              // a size holds at most this part of the budget
constexpr uint32_t kMinTarget = 16;              // reserved writes asked for a size at first
constexpr uint32_t kMaxPerCall = 1024;           // master.fbs ReserveWrites limit
constexpr std::chrono::seconds kMissMemory{10};  // a size missed twice within this gets a stock
constexpr std::chrono::milliseconds kMaintainEvery{100};
constexpr std::chrono::seconds kRetryAfter{1};  // after a failed ask

uint64_t RoundedBytes(uint64_t size, uint8_t replica_count) {
  return ((size + 63) & ~uint64_t{63}) * std::max<uint8_t>(1, replica_count);
}

// The placements a value of `size` bytes takes in a reserved write of its bucket: its parts in
// order, each up to its length; parts it does not reach are left out. The master trims the
// same way at commit.
std::vector<ReplicaPlace> Fit(const std::vector<ReplicaPlace>& reserved, uint64_t size) {
  std::vector<ReplicaPlace> out;
  uint64_t left = size;
  uint32_t part = UINT32_MAX;
  uint64_t length = 0;
  for (const ReplicaPlace& p : reserved) {
    if (p.part != part) {
      part = p.part;
      length = std::min(p.length, left);
      left -= length;
    }
    if (length == 0) continue;
    out.push_back(ReplicaPlace{p.part, p.pool_id, p.offset, length});
  }
  return out;
}

}  // namespace

uint64_t WriteReservations::SizeBucket(uint64_t size) {
  if (size <= 1024) return std::max<uint64_t>(256, (size + 255) / 256 * 256);
  const int k = 63 - __builtin_clzll(size - 1);  // 2^k < size <= 2^(k + 1)
  const uint64_t step = (uint64_t{1} << k) / 4;
  return (size + step - 1) / step * step;
}

WriteReservations::WriteReservations(PipelineContext& ctx, MasterMessages& messages,
                                     Options options)
    : ctx_(ctx), messages_(messages), options_(options) {}

WriteReservations::SizeClass* WriteReservations::Find(uint64_t size, uint8_t replica_count) {
  for (SizeClass& c : classes_) {
    if (c.size == size && c.replica_count == replica_count) return &c;
  }
  return nullptr;
}

uint64_t WriteReservations::ReservedBytes(const SizeClass& c) const {
  return RoundedBytes(c.size, c.replica_count) * std::max<size_t>(c.stock.size(), c.target);
}

uint64_t WriteReservations::held() const {
  uint64_t n = 0;
  for (const SizeClass& c : classes_) n += c.stock.size();
  return n;
}

void WriteReservations::CheckIdentity() {
  const uint32_t agent = ctx_.master->identity().agent_id;
  const bool epoch_moved = ctx_.fence != nullptr && epoch_ != 0 && ctx_.fence->epoch() != epoch_;
  if (agent == agent_id_ && !epoch_moved) return;
  if (held() > 0) {
    LOG(INFO) << "dropping " << held() << " reserved write(s): "
              << (epoch_moved ? "the master changed (restart or takeover)"
                              : "this agent registered again");
  }
  // That master does not know them (or no longer knows this agent): nothing to give back.
  for (SizeClass& c : classes_) {
    c.stock.clear();
    c.asking = false;
  }
  returns_.clear();
  ++generation_;
  agent_id_ = agent;
  epoch_ = ctx_.fence != nullptr ? ctx_.fence->epoch() : 0;
}

bool WriteReservations::Take(std::span<const uint64_t> sizes, uint8_t replica_count,
                             std::vector<Reserved>* out) {
  CheckIdentity();
  const auto now = Clock::now();
  // How many of each bucket (a batch mostly holds one).
  std::vector<std::pair<uint64_t, size_t>> wanted;
  for (uint64_t size : sizes) {
    const uint64_t s = SizeBucket(size);
    auto it =
        std::find_if(wanted.begin(), wanted.end(), [s](const auto& w) { return w.first == s; });
    if (it == wanted.end()) {
      wanted.emplace_back(s, 1);
    } else {
      ++it->second;
    }
  }
  bool enough = true;
  for (const auto& [size, count] : wanted) {
    SizeClass* c = Find(size, replica_count);
    if (c == nullptr) {
      enough = false;
      continue;
    }
    while (!c->stock.empty() && now >= c->stock.front().use_by) {
      returns_.push_back(c->stock.front().reserved.write_id);
      c->stock.pop_front();
    }
    enough &= c->stock.size() >= count;
  }
  if (!enough) {
    for (const auto& [size, count] : wanted) Missed(size, replica_count, count);
    Publish();
    return false;
  }
  for (uint64_t size : sizes) {
    SizeClass* c = Find(SizeBucket(size), replica_count);
    Reserved r = std::move(c->stock.front().reserved);
    c->stock.pop_front();
    c->last_used = now;
    r.replicas = Fit(r.replicas, size);
    out->push_back(std::move(r));
  }
  for (const auto& [size, count] : wanted) {
    SizeClass* c = Find(size, replica_count);
    if (!c->asking && c->stock.size() * 2 < c->target && now >= c->retry_at) Ask(*c);
  }
  Publish();
  return true;
}

void WriteReservations::Missed(uint64_t size, uint8_t replica_count, size_t keys) {
  const auto now = Clock::now();
  if (Find(size, replica_count) == nullptr) {
    // A size seen once may never come again: a stock is kept for sizes that repeat.
    std::erase_if(misses_, [&](const Miss& m) { return now - m.at > kMissMemory; });
    auto it = std::find_if(misses_.begin(), misses_.end(), [&](const Miss& m) {
      return m.size == size && m.replica_count == replica_count;
    });
    if (it == misses_.end()) {
      if (misses_.size() < 64) misses_.push_back(Miss{size, replica_count, now});
      return;
    }
    misses_.erase(it);
  }
  Wish(size, replica_count, keys);
}

void WriteReservations::Wish(uint64_t size, uint8_t replica_count, size_t keys) {
  const auto now = Clock::now();
  SizeClass* c = Find(size, replica_count);
  if (c == nullptr) {
    if (classes_.size() >= kMaxClasses) {
      auto lru = std::min_element(
          classes_.begin(), classes_.end(),
          [](const SizeClass& a, const SizeClass& b) { return a.last_used < b.last_used; });
      ReturnStock(*lru);
      classes_.erase(lru);
    }
    classes_.emplace_back();
    c = &classes_.back();
    c->size = size;
    c->replica_count = replica_count;
  }
  c->last_used = now;
  // Enough for a few batches like this one, within the budget left by the other sizes.
  uint64_t others = 0;
  for (const SizeClass& o : classes_) {
    if (&o != c) others += ReservedBytes(o);
  }
  const uint64_t each = RoundedBytes(size, replica_count);
  const uint64_t room =
      std::min(options_.budget_bytes > others ? (options_.budget_bytes - others) / each : 0,
               options_.budget_bytes / kClassShare / each);
  const uint64_t want = std::clamp<uint64_t>(4 * keys, kMinTarget, kMaxPerCall);
  c->target = static_cast<uint32_t>(
      std::min<uint64_t>({std::max<uint64_t>(c->target, want), room, kMaxPerCall}));
  if (c->target < 2) {
    c->target = 0;  // too large for the budget: such puts take two round trips
    return;
  }
  if (!c->asking && now >= c->retry_at) Ask(*c);
}

void WriteReservations::Ask(SizeClass& c) {
  const uint32_t count =
      c.target > c.stock.size() ? static_cast<uint32_t>(c.target - c.stock.size()) : 0;
  if (count == 0 || ctx_.master->identity().agent_id == 0) return;
  std::vector<uint64_t> returned;
  const size_t n = std::min<size_t>(returns_.size(), kMaxPerCall);
  returned.assign(returns_.end() - static_cast<std::ptrdiff_t>(n), returns_.end());
  returns_.resize(returns_.size() - n);
  c.asking = true;
  const auto asked_at = Clock::now();
  ctx_.master->Call(
      messages_.ReserveWrites(ctx_.NextMasterRequestId(), ctx_.master->identity().agent_id, c.size,
                              c.replica_count, count, returned),
      [this, size = c.size, rc = c.replica_count, asked_at,
       generation = generation_](Result<std::span<const uint8_t>> reply) {
        OnGranted(size, rc, asked_at, generation, reply);
      });
}

void WriteReservations::OnGranted(uint64_t size, uint8_t replica_count, Clock::time_point asked_at,
                                  uint64_t generation, Result<std::span<const uint8_t>> reply) {
  SizeClass* c = Find(size, replica_count);
  if (c != nullptr && generation == generation_) c->asking = false;
  if (!reply.ok()) {
    if (c != nullptr) c->retry_at = Clock::now() + kRetryAfter;
    return;
  }
  auto placed = ReadReservations(*reply, kMaxPerCall);
  if (!placed.ok()) {
    LOG_EVERY_N(WARNING, 100) << "reserving writes of " << size
                              << " bytes failed: " << placed.status().ToString();
    if (c != nullptr) c->retry_at = Clock::now() + kRetryAfter;
    return;
  }
  const mfb::PlacementReply& p = **placed;
  const uint32_t granted = p.codes()->size();
  if (generation != generation_ || (epoch_ != 0 && p.master_epoch() != epoch_)) {
    return;  // granted by a master (or to a registration) that is not ours any more
  }
  epoch_ = p.master_epoch();
  for (const mfb::PoolInfo* s : *p.pools()) {
    if (s->endpoints() == nullptr || s->endpoints()->size() == 0) continue;
    known_pools_[s->pool_id()] = {s->endpoints()->Get(0)->str(), s->incarnation()};
  }
  pools_.clear();
  for (const auto& [id, known] : known_pools_) {
    pools_.Add(id, known.endpoint, known.incarnation, epoch_, ctx_);
  }
  const auto use_by =
      asked_at + std::min<std::chrono::milliseconds>(
                     options_.max_age, std::chrono::milliseconds(p.lease_ttl_ms() / 2));
  std::vector<uint64_t> unwanted;
  for (uint32_t i = 0; i < granted; ++i) {
    Reserved r;
    r.write_id = p.write_ids()->Get(i);
    for (uint32_t j = p.first()->Get(i); j < p.first()->Get(i + 1); ++j) {
      const mfb::Placement* pl = p.placements()->Get(j);
      r.replicas.push_back(ReplicaPlace{pl->part(), pl->pool_id(), pl->offset(), pl->length()});
    }
    if (c == nullptr) {
      unwanted.push_back(r.write_id);  // the size went out of use meanwhile
    } else {
      c->stock.push_back(Stocked{std::move(r), use_by});
    }
  }
  if (!unwanted.empty()) GiveBack(unwanted);
  Publish();
  if (c != nullptr && granted == 0) c->retry_at = Clock::now() + kRetryAfter;  // no room now
}

void WriteReservations::ReturnStock(SizeClass& c) {
  for (const Stocked& s : c.stock) returns_.push_back(s.reserved.write_id);
  c.stock.clear();
}

void WriteReservations::GiveBack(std::span<const uint64_t> write_ids) {
  returns_.insert(returns_.end(), write_ids.begin(), write_ids.end());
  if (returns_.size() >= kMaxPerCall) SendReturns();
}

void WriteReservations::SendReturns() {
  while (!returns_.empty() && ctx_.master->identity().agent_id != 0) {
    const size_t n = std::min<size_t>(returns_.size(), kMaxPerCall);
    std::vector<uint64_t> batch(returns_.end() - static_cast<std::ptrdiff_t>(n), returns_.end());
    returns_.resize(returns_.size() - n);
    // Best effort: what does not arrive, the master abandons after its release timeout.
    ctx_.master->Call(messages_.ReserveWrites(ctx_.NextMasterRequestId(),
                                              ctx_.master->identity().agent_id, 0, 1, 0, batch),
                      [](Result<std::span<const uint8_t>>) {});
  }
}

void WriteReservations::Maintain() {
  const auto now = Clock::now();
  if (now < next_maintain_) return;
  next_maintain_ = now + kMaintainEvery;
  CheckIdentity();
  for (auto it = classes_.begin(); it != classes_.end();) {
    SizeClass& c = *it;
    if (now - c.last_used > options_.idle && !c.asking) {
      ReturnStock(c);
      it = classes_.erase(it);
      continue;
    }
    while (!c.stock.empty() && now >= c.stock.front().use_by) {
      returns_.push_back(c.stock.front().reserved.write_id);
      c.stock.pop_front();
    }
    if (!c.asking && c.stock.size() * 2 < c.target && now >= c.retry_at) Ask(c);
    ++it;
  }
  SendReturns();
  Publish();
}

}  // namespace kvagent::agent

// What the HA tests watch while they inject faults: which masters serve (a client asking every
// master in turn), what a router following an agent's event stream believes is stored, and a
// load of puts and gets whose every acknowledgement and every byte read back is checked.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ha_support.h"
#include "kvagent/events/event_subscriber.h"
#include "kvagent/schemas/master_generated.h"

namespace kvagent::testing {

using Clock = std::chrono::steady_clock;

// Asks every master it knows, one after the other, whether it serves (a Stats request: answered
// by a serving master, refused with not_serving by one that may not serve, unanswered by a
// stopped or following one). Answers are recorded in the order they arrived; "at most one
// master serves at any moment" means the serving answers never go back to an older epoch.
class ServingProbe {
 public:
  // Tracks every leader etcd shows for `cluster` as it appears (and whatever Track adds).
  ServingProbe(std::string etcd, std::string cluster)
      : etcd_(std::move(etcd)), cluster_(std::move(cluster)), thread_([this] { Run(); }) {}
  ~ServingProbe() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Adds a master's RPC endpoint (idempotent).
  void Track(const std::string& endpoint) {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::find(endpoints_.begin(), endpoints_.end(), endpoint) == endpoints_.end()) {
      endpoints_.push_back(endpoint);
    }
  }
  // Serving answers that came after a serving answer of a newer epoch (must stay 0).
  int violations() const {
    std::lock_guard<std::mutex> lock(mu_);
    int bad = 0;
    uint64_t newest = 0;
    for (const auto& [endpoint, epoch] : serving_) {
      if (epoch < newest) ++bad;
      newest = std::max(newest, epoch);
    }
    return bad;
  }
  size_t serving_answers() const {
    std::lock_guard<std::mutex> lock(mu_);
    return serving_.size();
  }
  size_t refusals() const { return refusals_.load(); }
  size_t unanswered() const { return unanswered_.load(); }
  // Distinct epochs that answered as serving, in order.
  std::vector<uint64_t> epochs() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<uint64_t> out;
    for (const auto& s : serving_) {
      if (out.empty() || out.back() != s.second) out.push_back(s.second);
    }
    return out;
  }

 private:
  void Run() {
    zmq::context_t context(1);
    std::map<std::string, std::unique_ptr<zmq::socket_t>> sockets;
    uint64_t id = 0;
    for (uint64_t round = 0; !stop_; ++round) {
      if (round % 10 == 0) {
        if (auto leader = LeaderOf(etcd_, cluster_)) Track(leader->record.rpc);
      }
      std::vector<std::string> endpoints;
      {
        std::lock_guard<std::mutex> lock(mu_);
        endpoints = endpoints_;
      }
      for (const std::string& e : endpoints) {
        auto& s = sockets[e];
        if (!s) {
          s = std::make_unique<zmq::socket_t>(context, zmq::socket_type::dealer);
          s->set(zmq::sockopt::linger, 0);
          s->set(zmq::sockopt::immediate, 1);  // a dead master: the send fails at once
          s->connect(e);
        }
        Ask(*s, e, ++id);
      }
      std::this_thread::sleep_for(5ms);
    }
  }

  void Ask(zmq::socket_t& s, const std::string& endpoint, uint64_t id) {
    flatbuffers::FlatBufferBuilder b;
    b.Finish(master_proto::CreateRequest(b, id, master_proto::Body::Stats,
                                         master_proto::CreateStats(b).Union()));
    if (!s.send(zmq::const_buffer(nullptr, 0),
                zmq::send_flags::sndmore | zmq::send_flags::dontwait) ||
        !s.send(zmq::const_buffer(b.GetBufferPointer(), b.GetSize()), zmq::send_flags::dontwait)) {
      ++unanswered_;  // no connection to it
      return;
    }
    const auto until = Clock::now() + 60ms;
    zmq::pollitem_t items[] = {{s.handle(), 0, ZMQ_POLLIN, 0}};
    while (Clock::now() < until) {
      zmq::poll(items, 1, 20ms);
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      zmq::message_t empty, body;
      if (!s.recv(empty, zmq::recv_flags::dontwait) || !empty.more()) continue;
      if (!s.recv(body, zmq::recv_flags::dontwait)) continue;
      const std::vector<uint8_t> bytes(static_cast<const uint8_t*>(body.data()),
                                       static_cast<const uint8_t*>(body.data()) + body.size());
      flatbuffers::Verifier v(bytes.data(), bytes.size());
      if (!v.VerifyBuffer<master_proto::Reply>(nullptr)) continue;
      const auto* r = flatbuffers::GetRoot<master_proto::Reply>(bytes.data());
      if (r->request_id() != id) continue;  // a late answer to an earlier question
      if (r->status() == 0 && !r->not_serving()) {
        std::lock_guard<std::mutex> lock(mu_);
        serving_.emplace_back(endpoint, r->master_epoch());
      } else {
        ++refusals_;
      }
      return;
    }
    ++unanswered_;
  }

  const std::string etcd_, cluster_;
  mutable std::mutex mu_;
  std::vector<std::string> endpoints_;
  std::vector<std::pair<std::string, uint64_t>> serving_;  // in arrival order
  std::atomic<size_t> refusals_{0};
  std::atomic<size_t> unanswered_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A KV-aware router's index fed only by an agent's event stream, following the documented rules:
// replay from the last seq + 1 on a gap, drop everything on AllBlocksCleared.
class Router {
 public:
  explicit Router(const std::string& run_dir) : run_dir_(run_dir), thread_([this] { Run(); }) {}
  ~Router() {
    stop_ = true;
    thread_.join();
  }
  std::set<std::string> keys() const {
    std::lock_guard<std::mutex> lock(mu_);
    return keys_;
  }
  uint64_t next_seq() const { return next_seq_.load(); }
  uint64_t removed_events() const { return removed_.load(); }
  uint64_t clears() const { return clears_.load(); }
  // Whether a BlockStored named `key`.
  bool saw_stored(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    return stored_keys_.count(key) != 0;
  }
  // Whether a BlockRemoved named `key`.
  bool saw_removed(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    return removed_keys_.count(key) != 0;
  }

 private:
  void Run() {
    events::EventSubscriberOptions o;
    o.endpoint = "ipc://" + run_dir_ + "/events.sock";
    o.replay_endpoint = "ipc://" + run_dir_ + "/events-replay.sock";
    o.from_seq = 0;
    o.decode = true;
    auto sub = events::EventSubscriber::Start(o);
    if (!sub.ok()) return;
    while (!stop_) {
      auto d = (*sub)->Next(50ms);
      if (!d.ok() || d->kind != events::EventDelivery::Kind::kBatch || !d->batch) continue;
      std::lock_guard<std::mutex> lock(mu_);
      for (const events::KvEvent& e : d->batch->events) {
        if (const auto* s = std::get_if<events::BlockStored>(&e)) {
          if (s->object_key) keys_.insert(*s->object_key);
          if (s->object_key) stored_keys_.insert(*s->object_key);
        } else if (const auto* r = std::get_if<events::BlockRemoved>(&e)) {
          if (r->object_key) keys_.erase(*r->object_key);
          if (r->object_key) removed_keys_.insert(*r->object_key);
          ++removed_;
        } else {
          keys_.clear();
          ++clears_;
        }
      }
      next_seq_ = d->seq + 1;
    }
  }

  std::string run_dir_;
  mutable std::mutex mu_;
  std::set<std::string> keys_;
  std::set<std::string> stored_keys_;
  std::set<std::string> removed_keys_;
  std::atomic<uint64_t> next_seq_{0};
  std::atomic<uint64_t> removed_{0};
  std::atomic<uint64_t> clears_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One client's load: puts of new keys (two replicas) and gets of keys it was told were stored,
// every byte compared; the oldest of its keys are removed once more than `max_live` are stored, so
// the pools never fill (eviction would remove acknowledged values and look like losses). Records
// each operation's outcome and time.
class Load {
 public:
  struct Op {
    Clock::time_point start, end;
    bool ok = false;
  };
  struct Acked {
    std::string value;
    Clock::time_point at;
  };

  Load(Client* client, std::string prefix, size_t max_live = 1500)
      : client_(client),
        prefix_(std::move(prefix)),
        max_live_(max_live),
        thread_([this] { Run(); }) {}
  ~Load() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  std::map<std::string, Acked> acked() const {
    std::lock_guard<std::mutex> lock(mu_);
    return acked_;
  }
  std::vector<Op> ops() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ops_;
  }
  int wrong_bytes() const { return wrong_.load(); }
  int gets_ok() const { return gets_ok_.load(); }
  // Puts acknowledged after `t` whose keys are still live (not removed as the oldest).
  int puts_acked_after(Clock::time_point t) const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(std::count_if(acked_.begin(), acked_.end(),
                                          [&](const auto& a) { return a.second.at > t; }));
  }
  // Successful operations that started after `t`.
  int successes_after(Clock::time_point t) const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(
        std::count_if(ops_.begin(), ops_.end(), [&](const Op& o) { return o.ok && o.start > t; }));
  }
  // How long after `t` this client's operations succeeded again for good: the end of the first
  // success that started after `t` and after the last failure.
  std::chrono::milliseconds RecoveredAfter(Clock::time_point t) const {
    std::lock_guard<std::mutex> lock(mu_);
    Clock::time_point last_failure = t;
    for (const Op& o : ops_) {
      if (o.start >= t && !o.ok) last_failure = std::max(last_failure, o.start);
    }
    for (const Op& o : ops_) {
      if (o.ok && o.start > last_failure) {
        return std::chrono::duration_cast<std::chrono::milliseconds>(o.end - t);
      }
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t);
  }

 private:
  void Run() {
    std::mt19937 random(static_cast<uint32_t>(std::hash<std::string>{}(prefix_)));
    std::vector<std::pair<std::string, std::string>> mine;  // acknowledged keys and values
    uint64_t n = 0;
    while (!stop_) {
      const std::string key = prefix_ + "-" + std::to_string(n);
      const std::string value = Pattern(key, 4096 + (n % 4) * 4096);
      ++n;
      Op put{Clock::now(), {}, false};
      const KeyResult r = PutValue(*client_, key, value, 2);
      put.end = Clock::now();
      put.ok = r.code == ErrorCode::kOk;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ops_.push_back(put);
        if (put.ok) acked_[key] = Acked{value, put.end};
      }
      if (put.ok) mine.emplace_back(key, value);
      if (mine.size() > max_live_) RemoveOldest(&mine);
      if (mine.empty()) continue;
      const auto& [k, expect] = mine[random() % mine.size()];
      Op get{Clock::now(), {}, false};
      const Read g = GetValue(*client_, k, 16384);
      get.end = Clock::now();
      get.ok = g.code == ErrorCode::kOk;
      if (get.ok) {
        ++gets_ok_;
        if (g.bytes != expect) ++wrong_;
      }
      // A get that finds nothing is not a failure of the service (the key may be lost in the
      // replication window); only errors count as failed operations.
      if (g.code != ErrorCode::kObjectNotFound) {
        std::lock_guard<std::mutex> lock(mu_);
        ops_.push_back(get);
      }
    }
  }

  // Removes the oldest of `mine`: forgotten as acknowledged once the remove is answered OK;
  // when the first remove of it finds it gone (an acknowledged put the cluster lost), it stays
  // acknowledged for the verdict to count as lost (a fast load otherwise removed the lost puts
  // of a failover's window before they were counted); on any other answer it stays, to be
  // removed again. A later remove that finds it gone may follow an earlier one that took effect
  // unanswered (the leader killed before it replied): forgotten, as one answered OK.
  void RemoveOldest(std::vector<std::pair<std::string, std::string>>* mine) {
    const std::string key = mine->front().first;
    std::vector<std::string> keys = {key};
    CallOptions force;
    force.force = true;  // our own gets leave read leases behind
    const Reply r = client_->Remove(keys, force);
    const ErrorCode code = r.keys.empty() ? r.status.code() : r.keys[0].code;
    const bool tried_before = oldest_remove_unanswered_;
    if (code != ErrorCode::kOk && code != ErrorCode::kObjectNotFound) {
      oldest_remove_unanswered_ = true;
      return;
    }
    oldest_remove_unanswered_ = false;
    mine->erase(mine->begin());
    if (code == ErrorCode::kObjectNotFound && !tried_before) return;
    std::lock_guard<std::mutex> lock(mu_);
    acked_.erase(key);
  }

  Client* client_;
  std::string prefix_;
  size_t max_live_;
  mutable std::mutex mu_;
  std::map<std::string, Acked> acked_;
  std::vector<Op> ops_;
  std::atomic<int> wrong_{0};
  bool oldest_remove_unanswered_ = false;  // a remove of mine's front failed (load thread only)
  std::atomic<int> gets_ok_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvagent::testing

// A small cluster around one MasterService for the master's tests: a manual clock, agents with
// mounted pools, and helpers that turn vectors of strings into the service's span API.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/master/master_service.h"
#include "temp_dir.h"

namespace kvagent::master::testing {

using kvagent::testing::TempDir;  // a state dir

inline std::vector<std::string_view> Views(const std::vector<std::string>& v) {
  return {v.begin(), v.end()};
}

class Cluster {
 public:
  explicit Cluster(MasterOptions options = {}, int agents = 2, uint64_t pool_bytes = 1 << 20)
      : options_(std::move(options)), pool_bytes_(pool_bytes) {
    // Small pools make eviction and multi-part values cheap to test: allow the size asked.
    options_.min_pool_bytes = std::min(options_.min_pool_bytes, pool_bytes);
    Open();
    for (int i = 0; i < agents; ++i) AddAgent("node-" + std::to_string(i), pool_bytes);
  }

  void Open() {
    auto s = MasterService::Open(options_, &clock);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    svc = std::move(s.value());
  }
  // Simulates a master restart: the service goes away and a new one opens the same state dir.
  void Restart() {
    svc.reset();
    Open();
  }

  // After Restart: agent `i` (node-i) registers and mounts its pool again with the same
  // incarnation, as an agent whose pool survived the master's restart does.
  void Rejoin(size_t i) {
    ASSERT_TRUE(svc->RegisterAgent("node-" + std::to_string(i), 1).ok());
    std::vector<std::string_view> eps = {"tcp://127.0.0.1:1"};
    ASSERT_TRUE(svc->MountPool(agents[i], 0, pool_bytes_, eps).ok());
  }

  AgentId AddAgent(const std::string& name, uint64_t pool_bytes, uint64_t incarnation = 1,
                   uint64_t agent_key = 0) {
    auto id = svc->RegisterAgent(name, incarnation, agent_key);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    std::vector<std::string_view> eps = {"tcp://127.0.0.1:1"};
    auto m = svc->MountPool(id.value(), 0, pool_bytes, eps);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    agents.push_back(id.value());
    return id.value();
  }

  PlacementBatch Start(AgentId agent, const std::vector<std::string>& keys,
                       const std::vector<uint64_t>& sizes,
                       const std::vector<std::string>& sessions = {}, WriteOptions options = {},
                       bool upsert = false, const std::vector<BlockMetaView>& blocks = {}) {
    auto k = Views(keys);
    auto s = Views(sessions);
    WriteStartRequest r;
    r.agent = agent;
    r.keys = k;
    r.sizes = sizes;
    r.session_ids = s;
    r.blocks = blocks;
    r.options = options;
    PlacementBatch out;
    last_status = upsert ? svc->BatchUpsertStart(r, &out) : svc->BatchPutStart(r, &out);
    return out;
  }
  KeyResults End(AgentId agent, const std::vector<std::string>& keys) {
    auto k = Views(keys);
    KeyResults out;
    last_status = svc->BatchPutEnd(agent, k, &out);
    return out;
  }
  KeyResults Revoke(AgentId agent, const std::vector<std::string>& keys) {
    auto k = Views(keys);
    KeyResults out;
    last_status = svc->BatchPutRevoke(agent, k, &out);
    return out;
  }
  // End with the write ids, checksums per part and failed replicas an agent sends.
  KeyResults EndWith(AgentId agent, const std::vector<std::string>& keys,
                     const std::vector<uint64_t>& write_ids,
                     const std::vector<uint32_t>& part_counts = {},
                     const std::vector<uint32_t>& checksums = {},
                     const std::vector<FailedReplica>& failed = {}) {
    auto k = Views(keys);
    WriteEndRequest r;
    r.agent = agent;
    r.keys = k;
    r.write_ids = write_ids;
    r.part_counts = part_counts;
    r.checksums = checksums;
    r.failed = failed;
    KeyResults out;
    last_status = svc->BatchPutEnd(r, &out);
    return out;
  }
  // A heartbeat of `agent` that acknowledges fences up to `ack`.
  HeartbeatResult Beat(AgentId agent, uint64_t ack = 0) { return svc->Heartbeat(agent, ack); }
  // Acknowledges every fence the agent has (what a live agent does within two heartbeats).
  void Fence(AgentId agent) { Beat(agent, Beat(agent).fence_seq); }
  // Lets `ms` of time pass with the master running (a Tick every 100 ms), as a live kvmaster.
  void Pass(int64_t ms) {
    for (int64_t done = 0; done < ms; done += 100) {
      clock.Advance(std::min<int64_t>(100, ms - done));
      svc->Tick();
    }
  }
  // Start + End, asserting success.
  void Put(AgentId agent, const std::vector<std::string>& keys, uint64_t size,
           const std::vector<std::string>& sessions = {}, WriteOptions options = {}) {
    auto p = Start(agent, keys, std::vector<uint64_t>(keys.size(), size), sessions, options);
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_TRUE(p.results[i].ok()) << keys[i] << ": " << p.results[i].ToString();
    }
    auto e = End(agent, keys);
    for (size_t i = 0; i < keys.size(); ++i) ASSERT_TRUE(e.results[i].ok());
  }
  PlacementBatch Get(const std::vector<std::string>& keys) {
    auto k = Views(keys);
    PlacementBatch out;
    last_status = svc->BatchGet(k, &out);
    return out;
  }
  KeyResults Remove(const std::vector<std::string>& keys, bool force = false) {
    auto k = Views(keys);
    KeyResults out;
    last_status = svc->BatchRemove(k, force, &out);
    return out;
  }
  bool Exists(const std::string& key) {
    std::vector<std::string_view> k = {key};
    KeyResults out;
    EXPECT_TRUE(svc->BatchExist(k, &out).ok());
    return out.exists.at(0) != 0;
  }
  std::vector<events::KvEvent> Events() { return svc->TakeEvents(); }

  ManualClock clock;
  std::unique_ptr<MasterService> svc;
  std::vector<AgentId> agents;
  Status last_status;

 private:
  MasterOptions options_;
  uint64_t pool_bytes_;  // each agent's pool (Rejoin mounts it again)
};

inline const events::BlockStored& AsStored(const events::KvEvent& e) {
  return std::get<events::BlockStored>(e);
}
inline const events::BlockRemoved& AsRemoved(const events::KvEvent& e) {
  return std::get<events::BlockRemoved>(e);
}
inline bool IsCleared(const events::KvEvent& e) {
  return std::holds_alternative<events::AllBlocksCleared>(e);
}

// An index fed only by the event stream, as a KV-aware router keeps it (by object_key).
class StreamIndex {
 public:
  void Apply(const std::vector<events::KvEvent>& evs) {
    for (const auto& e : evs) {
      if (IsCleared(e)) {
        keys_.clear();
      } else if (auto* s = std::get_if<events::BlockStored>(&e)) {
        keys_[s->object_key.value_or("")] = s->session_id.value_or("");
      } else {
        keys_.erase(AsRemoved(e).object_key.value_or(""));
      }
    }
  }
  const std::map<std::string, std::string>& keys() const { return keys_; }

 private:
  std::map<std::string, std::string> keys_;
};

// The master's readable key set with tags, through ListKeys.
inline std::map<std::string, std::string> ListAll(const MasterService& svc) {
  std::map<std::string, std::string> out;
  uint64_t cursor = 0;
  do {
    ListPage page;
    EXPECT_TRUE(svc.ListKeys(cursor, 7, &page).ok());
    if (page.restarted) out.clear();
    for (auto& k : page.keys) out[k.key] = k.session_id;
    cursor = page.next_cursor;
  } while (cursor != 0);
  return out;
}

}  // namespace kvagent::master::testing

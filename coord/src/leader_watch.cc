// LeaderWatcher: one thread reads and watches the leader key (leader_watch.h).
#include "kvagent/coord/leader_watch.h"

#include <glog/logging.h>

#include <atomic>
#include <thread>

#include "kvagent/coord/etcd_client.h"
#include "kvagent/coord/etcd_watch.h"

namespace kvagent::coord {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool SameLeader(const std::optional<Leader>& a, const std::optional<Leader>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || (a->epoch == b->epoch && a->record.Encode() == b->record.Encode());
}

}  // namespace

class LeaderWatcher::Thread {
 public:
  Thread(LeaderWatcher* owner, OnChange on_change, LeaderWatcherOptions options,
         std::unique_ptr<EtcdClient> client)
      : owner_(owner),
        on_change_(std::move(on_change)),
        options_(options),
        client_(std::move(client)),
        key_(ClusterKeys(owner->address_.cluster).leader()) {
    etcd_ = owner->address_.Etcd(options.timeout);
    thread_ = std::thread([this] { Run(); });
  }
  ~Thread() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
  }

 private:
  bool stopping() const { return stop_.load(std::memory_order_relaxed); }

  void Run() {
    auto backoff = 100ms;
    while (!stopping()) {
      int64_t revision = 0;
      if (!Read(&revision)) {
        Sleep(backoff);
        backoff = std::min<std::chrono::milliseconds>(1000ms, backoff * 2);
        continue;
      }
      auto watch = EtcdWatch::Open(etcd_, key_, revision + 1);
      if (!watch.ok()) {
        Unreachable(watch.status().message());
        Sleep(backoff);
        backoff = std::min<std::chrono::milliseconds>(1000ms, backoff * 2);
        continue;
      }
      backoff = 100ms;
      Follow(**watch);
    }
  }

  // Reads the key once; false (and unreachable) when etcd did not answer.
  bool Read(int64_t* revision) {
    auto kv = client_->Get(key_, revision);
    if (!kv.ok()) {
      Unreachable(kv.status().message());
      return false;
    }
    Reachable();
    Update(*kv);
    return true;
  }

  // Applies the watch's changes until it breaks (or a periodic read fails).
  void Follow(EtcdWatch& watch) {
    Clock::time_point reread = Clock::now() + options_.reread_interval;
    while (!stopping()) {
      auto events = watch.Next(100ms);
      if (!events.ok()) {
        LOG_EVERY_N(INFO, 10) << "leader watch: " << events.status().ToString()
                              << "; reading the leader key again";
        return;
      }
      for (const EtcdEvent& e : *events) {
        if (e.kv.key != key_) continue;
        if (e.type == EtcdEvent::Type::kDelete) {
          Update(std::nullopt);
        } else {
          Update(e.kv);
        }
      }
      if (Clock::now() >= reread) {
        int64_t revision = 0;
        if (!Read(&revision)) return;
        reread = Clock::now() + options_.reread_interval;
      }
    }
  }

  void Update(const std::optional<EtcdKeyValue>& kv) {
    std::optional<Leader> leader;
    uint64_t epoch = 0;
    if (kv) {
      epoch = static_cast<uint64_t>(kv->create_revision);
      auto record = LeaderRecord::Decode(kv->value);
      if (!record.ok()) {
        LOG_EVERY_N(WARNING, 20) << "leader watch: " << record.status().ToString()
                                 << "; treating the cluster as leaderless";
      } else if (record->serving()) {
        leader = Leader{epoch, std::move(*record)};
      }
    }
    bool changed = false;
    {
      std::lock_guard<std::mutex> lock(owner_->mu_);
      owner_->highest_epoch_ = std::max(owner_->highest_epoch_, epoch);
      owner_->key_epoch_ = epoch;
      changed = !SameLeader(owner_->leader_, leader);
      owner_->leader_ = leader;
    }
    owner_->changed_.notify_all();
    if (changed && on_change_) on_change_(leader);
  }

  void Reachable() {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    if (!owner_->reachable_) LOG(INFO) << "leader watch: etcd is reachable";
    owner_->reachable_ = true;
    owner_->why_.clear();
  }

  void Unreachable(const std::string& why) {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    if (owner_->reachable_) LOG(WARNING) << "leader watch: " << why;
    owner_->reachable_ = false;
    owner_->why_ = why;
  }

  void Sleep(std::chrono::milliseconds d) {
    const Clock::time_point until = Clock::now() + d;
    while (!stopping() && Clock::now() < until) std::this_thread::sleep_for(20ms);
  }

  LeaderWatcher* owner_;
  OnChange on_change_;
  LeaderWatcherOptions options_;
  std::unique_ptr<EtcdClient> client_;
  EtcdClientOptions etcd_;
  const std::string key_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Result<std::unique_ptr<LeaderWatcher>> LeaderWatcher::Start(ClusterAddress address,
                                                            OnChange on_change,
                                                            LeaderWatcherOptions options) {
  KVAGENT_RETURN_IF_ERROR(CheckName(address.cluster, "the cluster name"));
  auto client = EtcdClient::Create(address.Etcd(options.timeout));
  if (!client.ok()) return client.status();
  std::unique_ptr<LeaderWatcher> watcher(new LeaderWatcher(std::move(address)));
  watcher->thread_ =
      std::make_unique<Thread>(watcher.get(), std::move(on_change), options, std::move(*client));
  return watcher;
}

LeaderWatcher::LeaderWatcher(ClusterAddress address) : address_(std::move(address)) {}

LeaderWatcher::~LeaderWatcher() { thread_.reset(); }

std::optional<Leader> LeaderWatcher::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leader_;
}

uint64_t LeaderWatcher::highest_epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return highest_epoch_;
}

uint64_t LeaderWatcher::key_epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return key_epoch_;
}

bool LeaderWatcher::etcd_reachable(std::string* why) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (why != nullptr) *why = why_;
  return reachable_;
}

std::optional<Leader> LeaderWatcher::WaitForLeader(std::chrono::milliseconds limit) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, limit, [&] { return leader_.has_value(); });
  return leader_;
}

}  // namespace kvagent::coord

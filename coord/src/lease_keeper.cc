// LeaseKeeper: one thread renews the lease (lease_keeper.h says why valid_until is safe).
#include "kvagent/coord/lease_keeper.h"

#include <glog/logging.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace kvagent::coord {
namespace {

using namespace std::chrono_literals;
// Not `Clock`: leader_watch.cc (the same unity build) has a `Clock` of its own.
using LeaseClock = LeaseKeeper::Clock;

int64_t Ns(LeaseClock::time_point t) { return t.time_since_epoch().count(); }

}  // namespace

class LeaseKeeper::Renewer {
 public:
  Renewer(LeaseKeeper* owner, std::unique_ptr<EtcdClient> client)
      : owner_(owner), client_(std::move(client)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Renewer() { Stop(); }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // After Stop(): the client is free for the caller's thread.
  EtcdClient& client() { return *client_; }

 private:
  void Run() {
    const auto period = std::max<std::chrono::milliseconds>(100ms, owner_->ttl_ / 4);
    LeaseClock::time_point next = LeaseClock::now() + period;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (wake_.wait_until(lock, next, [&] { return stop_; })) return;
      }
      const LeaseClock::time_point sent = LeaseClock::now();
      Result<std::chrono::seconds> ttl = client_->KeepAlive(owner_->id_);
      if (ttl.ok() && ttl->count() > 0) {
        const auto alive = std::min<std::chrono::milliseconds>(*ttl, owner_->ttl_);
        owner_->valid_until_ns_.store(Ns(sent + alive - owner_->margin_),
                                      std::memory_order_release);
        owner_->renewals_.fetch_add(1, std::memory_order_relaxed);
        if (failing_) {
          LOG(INFO) << "etcd lease " << owner_->id_ << " renewed again (via " << client_->endpoint()
                    << ")";
        }
        failing_ = false;
        next = sent + period;
        continue;
      }
      if (ttl.ok()) {  // etcd no longer has it
        owner_->valid_until_ns_.store(Ns(LeaseClock::time_point::min()), std::memory_order_release);
        owner_->lost_.store(true, std::memory_order_release);
        LOG(WARNING) << "etcd lease " << owner_->id_
                     << " is gone (it expired: no renewal reached etcd in time)";
        return;
      }
      owner_->failures_.fetch_add(1, std::memory_order_relaxed);
      if (!failing_) {
        LOG(WARNING) << "cannot renew etcd lease " << owner_->id_ << ": " << ttl.status().ToString()
                     << "; retrying every 100 ms";
      }
      failing_ = true;
      next = LeaseClock::now() + 100ms;
    }
  }

  LeaseKeeper* owner_;
  std::unique_ptr<EtcdClient> client_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool failing_ = false;
  std::thread thread_;
};

Result<std::unique_ptr<LeaseKeeper>> LeaseKeeper::Start(EtcdClientOptions options,
                                                        std::chrono::seconds ttl) {
  if (ttl.count() <= 0) return InvalidParams("the etcd lease TTL must be at least 1 s");
  // A renewal must be able to finish well within the lease (half of it; in milliseconds: half
  // of a 1 s lease in whole seconds would be 0).
  options.timeout =
      std::min<std::chrono::milliseconds>(options.timeout, std::chrono::milliseconds(ttl) / 2);
  auto client = EtcdClient::Create(std::move(options));
  if (!client.ok()) return client.status();
  const LeaseClock::time_point sent = LeaseClock::now();
  auto lease = (*client)->GrantLease(ttl);
  if (!lease.ok()) return lease.status();
  std::unique_ptr<LeaseKeeper> keeper(new LeaseKeeper());
  keeper->id_ = lease->id;
  keeper->ttl_ = lease->ttl;
  keeper->margin_ = std::max<std::chrono::milliseconds>(200ms, keeper->ttl_ / 4);
  keeper->valid_until_ns_.store(Ns(sent + keeper->ttl_ - keeper->margin_));
  keeper->renewer_ = std::make_unique<Renewer>(keeper.get(), std::move(*client));
  return keeper;
}

LeaseKeeper::~LeaseKeeper() {
  if (renewer_) renewer_->Stop();
}

LeaseKeeper::Clock::time_point LeaseKeeper::valid_until() const {
  return LeaseClock::time_point(
      LeaseClock::duration(valid_until_ns_.load(std::memory_order_acquire)));
}

void LeaseKeeper::Revoke() {
  renewer_->Stop();
  valid_until_ns_.store(Ns(LeaseClock::time_point::min()), std::memory_order_release);
  lost_.store(true, std::memory_order_release);
  if (Status st = renewer_->client().RevokeLease(id_); !st.ok()) {
    LOG(WARNING) << "could not revoke etcd lease " << id_
                 << " (it expires by itself): " << st.ToString();
  }
}

}  // namespace kvagent::coord

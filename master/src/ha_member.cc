// The member's role loop (ha_member.h): follow, elect, lead, on the main thread.
#include "ha_member.h"

#include <glog/logging.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string_view>

#include "kvagent/common/watchdog.h"
#include "kvagent/coord/etcd_client.h"
#include "kvagent/coord/leader_watch.h"
#include "kvagent/coord/lease_keeper.h"
#include "kvagent/coord/records.h"
#include "kvagent/master/standby.h"

namespace kvagent::master {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Where a member's copy of the state stands: the term whose log it holds and how far.
struct Position {
  uint64_t epoch = 0;
  uint64_t seq = 0;
};

constexpr const char* kPositionFile = "ha-position";

Position LoadPosition(const std::string& state_dir) {
  Position p;
  std::ifstream in(state_dir + "/" + kPositionFile);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("epoch=", 0) == 0) p.epoch = std::strtoull(line.c_str() + 6, nullptr, 10);
    if (line.rfind("seq=", 0) == 0) p.seq = std::strtoull(line.c_str() + 4, nullptr, 10);
  }
  return p;
}

// Written after the log holds what it claims (it can only lag the log: a member that crashed
// claims less than it holds, never more).
void SavePosition(const std::string& state_dir, Position p) {
  const std::string path = state_dir + "/" + kPositionFile;
  {
    std::ofstream out(path + ".tmp", std::ios::trunc);
    out << "epoch=" << p.epoch << "\nseq=" << p.seq << "\n";
    if (!out) return;
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

// tcp://0.0.0.0:P -> tcp://HOST:P (also * and [::]); anything else unchanged.
std::string Advertised(const std::string& endpoint, const std::string& host) {
  for (std::string_view wildcard : {"tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:"}) {
    if (endpoint.rfind(wildcard, 0) == 0) {
      return "tcp://" + host + ":" + endpoint.substr(wildcard.size());
    }
  }
  return endpoint;
}

class Member {
 public:
  Member(HaMemberOptions o, const StopSignals& signals)
      : o_(std::move(o)),
        signals_(signals),
        keys_(o_.cluster.cluster),
        etcd_{o_.cluster.Etcd(1000ms)},
        watchdog_(Watchdog::IntervalFromEnvironment(), [this] { return status_; }) {}

  int Run() {
    auto client = coord::EtcdClient::Create(etcd_);
    if (!client.ok()) return Fatal(client.status());
    client_ = std::move(*client);
    auto watcher = coord::LeaderWatcher::Start(o_.cluster, nullptr);
    if (!watcher.ok()) return Fatal(watcher.status());
    watcher_ = std::move(*watcher);
    position_ = LoadPosition(o_.server.master.state_dir);
    LOG(INFO) << "kvmaster " << o_.name << ": member of cluster " << o_.cluster.ToString()
              << (o_.cluster.auth.user.empty() ? "" : " as etcd user " + o_.cluster.auth.user)
              << " (lease " << o_.lease_ttl.count() << " s), state in "
              << o_.server.master.state_dir << " (term " << position_.epoch << ", record "
              << position_.seq << ")";
    status_ = "kvmaster " + o_.name + ": member of cluster " + o_.cluster.ToString();
    NotifyServiceManager("READY=1\nSTATUS=" + status_);
    while (!stop_) {
      if (!EnsureSession()) continue;
      std::string why;
      if (!watcher_->etcd_reachable(&why)) {
        Wait(100ms);  // never campaign without a current view of the leader key
        continue;
      }
      const uint64_t key = watcher_->key_epoch();
      const std::optional<coord::Leader> leader = watcher_->current();
      if (key == 0) {
        Elect();
      } else if (leader && leader->epoch == key && leader->record.name == o_.name) {
        // A term of this member's that it does not lead (an earlier process of it, whose lease
        // has not expired yet): end it rather than follow itself.
        LOG(WARNING) << "kvmaster " << o_.name << ": the leader key holds an earlier term of "
                     << "this member (epoch " << leader->epoch << ") that nobody serves; "
                     << "ending it";
        (void)client_->DeleteIfCreatedAt(keys_.leader(), static_cast<int64_t>(leader->epoch));
        Wait(100ms);
      } else if (leader && leader->epoch == key) {
        Follow(*leader);
      } else {
        Wait(50ms);  // a leader that is still starting
      }
    }
    NotifyServiceManager("STOPPING=1");
    LOG(INFO) << "kvmaster " << o_.name << ": " << stop_reason_ << ", stopped";
    if (lease_) lease_->Revoke();  // our member record goes at once
    return 0;
  }

 private:
  int Fatal(const Status& st) {
    LOG(ERROR) << "kvmaster cannot join the cluster: " << st.ToString();
    return 1;
  }

  // Waits up to `d` for a signal; a stop signal sets stop_.
  void Wait(std::chrono::milliseconds d) {
    // systemd's watchdog: pinged from this loop, except while leading (then the server's loop
    // pings, so that a hung server is noticed).
    if (!leading_) watchdog_.Poll(std::chrono::steady_clock::now());
    const char* sig = signals_.WaitFor(d);
    if (sig == nullptr) return;
    if (std::string_view(sig) == "SIGUSR1") {
      LOG(INFO) << "kvmaster " << o_.name << ": SIGUSR1 ignored: with --etcd the leader is elected";
      return;
    }
    stop_ = true;
    stop_reason_ = sig;
  }

  // A live lease and our member record on it. False (after a pause) while etcd is unreachable.
  bool EnsureSession() {
    if (lease_ && !lease_->lost()) return true;
    lease_.reset();
    auto lease = coord::LeaseKeeper::Start(etcd_, o_.lease_ttl);
    if (!lease.ok()) {
      LOG_EVERY_N(WARNING, 20) << "kvmaster " << o_.name
                               << ": cannot get an etcd lease: " << lease.status().ToString()
                               << "; retrying";
      Wait(500ms);
      return false;
    }
    lease_ = std::move(*lease);
    if (lease_->ttl() != std::chrono::duration_cast<std::chrono::milliseconds>(o_.lease_ttl)) {
      LOG(INFO) << "etcd granted a lease of " << lease_->ttl().count() << " ms (asked "
                << o_.lease_ttl.count() << " s: etcd's minimum is 1.5 election timeouts)";
    }
    Publish("follower", 0, "");
    return true;
  }

  void Publish(const std::string& role, int64_t election, const std::string& rpc) {
    if (!lease_) return;
    coord::MemberRecord r{o_.name, role, position_.epoch, position_.seq, election, rpc};
    if (Status st = client_->Put(keys_.member(o_.name), r.Encode(), lease_->id()); !st.ok()) {
      LOG_EVERY_N(WARNING, 20) << "cannot publish member record: " << st.ToString();
    }
  }

  // ---- follower -------------------------------------------------------------------------------

  void Follow(const coord::Leader& leader) {
    StandbyOptions so;
    so.primary = leader.record.rpc;
    so.state_dir = o_.server.master.state_dir;
    so.status_file = o_.status_file;
    so.name = o_.name;
    so.electable = true;
    // With a cluster secret the leader's ROUTER is a CURVE server: follow it as a CURVE client.
    if (o_.server.secret) so.curve = o_.server.secret->CurveKeys(KeyPlane::kMasterRpc);
    auto standby = Standby::Start(so);
    if (!standby.ok()) {
      LOG(ERROR) << "kvmaster " << o_.name << ": cannot follow " << leader.record.name << ": "
                 << standby.status().ToString();
      Wait(1000ms);
      return;
    }
    LOG(INFO) << "kvmaster " << o_.name << ": following leader " << leader.record.name << " (epoch "
              << leader.epoch << ") at " << leader.record.rpc;
    election_ = {};  // a leader serves: the next election starts afresh
    status_ = "kvmaster " + o_.name + " follows " + leader.record.name + " (epoch " +
              std::to_string(leader.epoch) + ") of cluster " + o_.cluster.cluster;
    if (o_.on_role) o_.on_role(nullptr, true);
    Clock::time_point publish = Clock::now();
    while (!stop_) {
      Wait(50ms);
      if ((*standby)->synced() && (*standby)->epoch() != 0) {
        position_ = {(*standby)->epoch(), (*standby)->applied_seq()};
      }
      if (!lease_ || lease_->lost()) EnsureSession();  // a new lease; keep following
      if (watcher_->key_epoch() != leader.epoch) break;
      const auto now_leader = watcher_->current();
      if (now_leader && now_leader->epoch == leader.epoch &&
          now_leader->record.rpc != leader.record.rpc) {
        break;  // the same term moved its endpoint: follow it there
      }
      if (Clock::now() >= publish && lease_ && !lease_->lost()) {
        Publish("follower", 0, "");
        SavePosition(o_.server.master.state_dir, position_);  // a crash loses at most 1 s of it
        publish = Clock::now() + 1s;
      }
    }
    (*standby)->Stop();  // the log holds what was applied: the position is exact now
    if ((*standby)->synced() && (*standby)->epoch() != 0) {
      position_ = {(*standby)->epoch(), (*standby)->applied_seq()};
    }
    standby->reset();
    SavePosition(o_.server.master.state_dir, position_);
    LOG(INFO) << "kvmaster " << o_.name << ": stopped following " << leader.record.name
              << " (epoch " << leader.epoch << ") at record " << position_.seq;
  }

  // ---- election -------------------------------------------------------------------------------

  void Elect() {
    Publish("candidate", static_cast<int64_t>(watcher_->highest_epoch()), "");
    // Settle: give every member a moment to notice and publish its position; then the member
    // with the best one campaigns. The others wait for it — while it is there, and for two TTLs
    // at most (it may be unable to serve), then campaign themselves.
    // A member whose record is live but not a candidate has not noticed yet, or is stalled (a
    // SIGSTOP, a long pause) and may hold records the leader acknowledged — with
    // --sync-followers perhaps the only copy: it is waited for until it comes back as a
    // candidate or its record goes with its lease, for two TTLs at most. (Waiting only for the
    // settle time elected a member with less of the log while the best one was stalled 2 s,
    // and the acknowledged records were lost.)
    // The waits count from the first Elect since a leader last served, not from this call: a
    // best member that cannot serve holds the key while it tries, which sends everyone back to
    // Run() and here again, and a clock that restarted with each call never ran out.
    const Clock::time_point now = Clock::now();
    if (election_.started == Clock::time_point{}) election_.started = now;
    const Clock::time_point settle =
        now + std::min<std::chrono::milliseconds>(1000ms, lease_->ttl() / 2);
    const Clock::time_point patience = election_.started + 2 * lease_->ttl();
    std::string& last_best = election_.best;
    Clock::time_point& best_since = election_.best_since;
    while (!stop_ && watcher_->key_epoch() == 0) {
      auto members = client_->GetPrefix(keys_.members());
      if (!members.ok()) {
        Wait(100ms);
        continue;
      }
      bool everyone = true;
      coord::MemberRecord best{o_.name, "candidate", position_.epoch, position_.seq, 0, ""};
      for (const coord::EtcdKeyValue& kv : *members) {
        auto m = coord::MemberRecord::Decode(kv.value);
        if (!m.ok() || m->name == o_.name) continue;
        if (m->role != "candidate") {
          everyone = false;  // it has not noticed yet (or a leader is stepping down)
          continue;
        }
        if (coord::BetterPosition(*m, best)) best = *m;
      }
      if (!everyone && (Clock::now() < settle || Clock::now() < patience)) {
        Wait(20ms);
        continue;
      }
      if (best.name == o_.name) break;
      if (best.name != last_best) {
        LOG(INFO) << "kvmaster " << o_.name << ": member " << best.name
                  << " holds more of the log (term " << best.epoch << ", record "
                  << best.applied_seq << "; this member: term " << position_.epoch << ", record "
                  << position_.seq << "); letting it take over";
        last_best = best.name;
        best_since = Clock::now();
      }
      if (Clock::now() - best_since >= 2 * lease_->ttl()) {
        LOG(WARNING) << "kvmaster " << o_.name << ": " << best.name
                     << " did not take over within two lease TTLs; campaigning";
        break;
      }
      Wait(20ms);
    }
    if (stop_ || watcher_->key_epoch() != 0 || !lease_ || lease_->lost()) return;
    if (position_.epoch == 0) {
      auto term = client_->Get(keys_.prefix() + "term");
      if (!term.ok()) return Wait(100ms);
      if (term->has_value()) {
        LOG_EVERY_N(WARNING, 50)
            << "kvmaster " << o_.name << ": this member holds no state of cluster "
            << o_.cluster.cluster << ", which has had a leader (" << (*term)->value
            << "); waiting for a member that does (start one with its state dir)";
        return Wait(1000ms);
      }
    }
    auto created = client_->CreateIfAbsent(
        keys_.leader(), coord::LeaderRecord{o_.name, "", "", "", ""}.Encode(), lease_->id());
    if (!created.ok()) {
      LOG(WARNING) << "kvmaster " << o_.name
                   << ": campaign failed: " << created.status().ToString();
      return Wait(100ms);
    }
    if (!created->created) return;  // another member won: follow it
    Lead(static_cast<uint64_t>(created->create_revision));
  }

  // Removes the leader key of this member's term `epoch`; when etcd does not confirm it, drops
  // the lease the key is on (etcd then deletes the key, and our member record, itself; the next
  // pass of Run() takes a new lease).
  void EndTerm(uint64_t epoch) {
    auto deleted = client_->DeleteIfCreatedAt(keys_.leader(), static_cast<int64_t>(epoch));
    if (deleted.ok()) return;
    LOG(WARNING) << "kvmaster " << o_.name << ": cannot remove the leader key of epoch " << epoch
                 << " (" << deleted.status().ToString() << "); revoking its lease";
    if (lease_) lease_->Revoke();
    lease_.reset();
  }

  // ---- leader ---------------------------------------------------------------------------------

  void Lead(uint64_t epoch) {
    const Clock::time_point won = Clock::now();
    MasterServerOptions so = o_.server;
    so.master.epoch = epoch;
    auto down = std::make_shared<std::atomic<bool>>(false);
    coord::LeaseKeeper* lease = lease_.get();
    so.may_serve = [lease, down] {
      return !down->load(std::memory_order_relaxed) && lease->valid();
    };
    SteadyClock clock;
    auto server = MasterServer::Start(so, &clock);
    if (!server.ok()) {
      LOG(ERROR) << "kvmaster " << o_.name << " won the election (epoch " << epoch
                 << ") but cannot serve: " << server.status().ToString() << "; resigning";
      EndTerm(epoch);
      return Wait(1000ms);
    }
    MasterServer& s = **server;
    coord::LeaderRecord record{o_.name, Advertised(s.endpoint(), o_.advertise_host),
                               Advertised(s.events_endpoint(), o_.advertise_host),
                               Advertised(s.replay_endpoint(), o_.advertise_host), ""};
    if (!s.framed_endpoint().empty()) {
      record.framed = Advertised(s.framed_endpoint(), o_.advertise_host);
    }
    auto published = client_->PutIfCreatedAt(keys_.leader(), record.Encode(), lease_->id(),
                                             static_cast<int64_t>(epoch));
    if (!published.ok() || !*published) {
      LOG(WARNING) << "kvmaster " << o_.name << ": lost the leader key before publishing it ("
                   << (published.ok() ? "it is gone" : published.status().ToString())
                   << "); stepping down";
      down->store(true);
      server->reset();
      // After an error the key may still be ours, on a lease this process renews, and name no
      // endpoints: every member and agent would wait for it for ever.
      if (!published.ok()) EndTerm(epoch);
      return;
    }
    (void)client_->Put(keys_.prefix() + "term",
                       "{\"epoch\":" + std::to_string(epoch) + ",\"name\":\"" + o_.name + "\"}");
    election_ = {};  // this member serves: the next election starts afresh
    position_ = {epoch, s.last_seq()};
    SavePosition(o_.server.master.state_dir, position_);  // this state dir holds the cluster's
    Publish("leader", 0, record.rpc);
    WriteReadyFile(s, record, epoch);
    leading_ = true;
    status_ = "kvmaster " + o_.name + " leads cluster " + o_.cluster.cluster + " (epoch " +
              std::to_string(epoch) + ")";
    NotifyServiceManager("STATUS=" + status_);
    if (o_.on_role) o_.on_role(&s, false);
    LOG(INFO) << "kvmaster " << o_.name << " leads cluster " << o_.cluster.cluster << " (epoch "
              << epoch << ") after "
              << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - won).count()
              << " ms: requests on " << record.rpc << ", events on " << record.events
              << ", replay on " << record.replay << "; lease " << lease_->ttl().count()
              << " ms, step-down margin " << lease_->margin().count() << " ms";

    bool confirmed = true;
    // The watcher may show the key as it was before this term (none) for a while after we
    // created it: only a key it showed as ours and then as another, or a newer one, deposes us.
    bool seen_ours = false;
    Clock::time_point publish = Clock::now() + 1s;
    std::string why;
    while (why.empty()) {
      Wait(20ms);
      position_ = {epoch, s.last_seq()};
      std::string unreachable;
      const bool reachable = watcher_->etcd_reachable(&unreachable);
      const uint64_t key = watcher_->key_epoch();
      if (reachable && key == epoch) seen_ours = true;
      if (stop_) {
        why = stop_reason_ + ": handing over";
      } else if (lease_->lost()) {
        why = "its etcd lease expired (no renewal reached etcd in time)";
      } else if (reachable && key != epoch && (seen_ours || key > epoch)) {
        why = "the leader key is no longer this term's";
      } else if (confirmed != lease_->valid()) {
        confirmed = !confirmed;
        if (confirmed) {
          LOG(INFO) << "kvmaster " << o_.name << ": leadership confirmed again (epoch " << epoch
                    << "); serving";
        } else {
          LOG(WARNING) << "kvmaster " << o_.name << ": cannot confirm its leadership in etcd "
                       << "(lease renewals fail); not serving until one succeeds within the "
                          "lease (step-down margin "
                       << lease_->margin().count() << " ms)";
        }
      } else if (Clock::now() >= publish && confirmed) {
        Publish("leader", 0, record.rpc);
        SavePosition(o_.server.master.state_dir, position_);
        publish = Clock::now() + 1s;
      }
    }
    down->store(true);
    LOG(WARNING) << "kvmaster " << o_.name << " steps down (epoch " << epoch << "): " << why;
    if (o_.on_role) o_.on_role(nullptr, false);
    leading_ = false;
    server->reset();
    // Whatever the reason, the key must not outlive this term's server (agents would go on
    // connecting to an endpoint nobody serves); a no-op when it is another term's already.
    if (!stop_ && lease_ && !lease_->lost()) {
      (void)client_->DeleteIfCreatedAt(keys_.leader(), static_cast<int64_t>(epoch));
    }
    SavePosition(o_.server.master.state_dir, position_);
    if (stop_ && lease_) {
      lease_->Revoke();  // the others take over now, not after the TTL
      lease_.reset();
    }
  }

  void WriteReadyFile(const MasterServer& s, const coord::LeaderRecord& r, uint64_t epoch) {
    if (o_.ready_file.empty()) return;
    const std::string tmp = o_.ready_file + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << "rpc=" << s.endpoint() << "\nevents=" << s.events_endpoint()
          << "\nreplay=" << s.replay_endpoint() << "\nadvertised=" << r.rpc << "\nepoch=" << epoch
          << "\n";
      if (!r.framed.empty()) out << "framed=" << s.framed_endpoint() << "\n";
      if (!out) return;
    }
    std::rename(tmp.c_str(), o_.ready_file.c_str());
  }

  HaMemberOptions o_;
  const StopSignals& signals_;
  const coord::ClusterKeys keys_;
  const coord::EtcdClientOptions etcd_;
  std::unique_ptr<coord::EtcdClient> client_;
  std::unique_ptr<coord::LeaderWatcher> watcher_;
  std::unique_ptr<coord::LeaseKeeper> lease_;
  Position position_;
  // The election in progress (Elect), kept across calls until a leader serves (Follow).
  struct Election {
    Clock::time_point started;     // the first Elect since a leader last served
    std::string best;              // the member waited for
    Clock::time_point best_since;  // since when
  } election_;
  bool stop_ = false;
  std::string stop_reason_;
  bool leading_ = false;
  std::string status_;  // systemd's STATUS= line
  Watchdog watchdog_;
};

}  // namespace

void HaFlags::Declare(FlagSet* f) {
  f->String("etcd", &etcd,
            "high availability: etcd's client endpoints HOST:PORT[,HOST:PORT] (https://HOST:PORT,"
            "... over TLS); the kvmasters of --cluster elect a leader there, the others follow "
            "its log (needs --state-dir)");
  etcd_access.Declare(f);
  f->String("cluster", &cluster, "high availability: the cluster's name in etcd");
  f->String("name", &name, "high availability: this member's name (default: the host name)");
  f->Int("leader-lease-ms", &leader_lease_ms,
         "high availability: the leader's etcd lease, in whole seconds (etcd may raise it to its "
         "minimum); a dead leader is replaced about this long after its last renewal");
  f->String("advertise-host", &advertise_host,
            "high availability: the host agents reach this master at, for endpoints that listen "
            "on a wildcard address (default: the host name)");
  f->Int("sync-followers", &sync_followers,
         "acknowledge a change only once this many followers hold it (synchronous replication: "
         "a failover loses no acknowledged change; writes wait while fewer followers are there); "
         "0: asynchronous");
}

Status HaFlags::Apply(HaMemberOptions* out) const {
  if (etcd.empty() || cluster.empty()) {
    return InvalidParams("--etcd and --cluster go together (high availability through etcd)");
  }
  bool https = false;
  std::vector<std::string> endpoints;
  KVAGENT_RETURN_IF_ERROR(coord::ParseEtcdEndpoints(etcd, &endpoints, &https));
  KVAGENT_RETURN_IF_ERROR(coord::CheckName(cluster, "--cluster"));
  out->cluster.etcd_endpoints = std::move(endpoints);
  out->cluster.cluster = cluster;
  out->cluster.tls.enabled = https;
  KVAGENT_RETURN_IF_ERROR(etcd_access.Apply(&out->cluster));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  out->name = name.empty() ? std::string(host) : name;
  KVAGENT_RETURN_IF_ERROR(coord::CheckName(out->name, "--name"));
  if (leader_lease_ms < 1000 || leader_lease_ms > 600'000) {
    return InvalidParams("--leader-lease-ms must be 1000..600000");
  }
  out->lease_ttl = std::chrono::seconds((leader_lease_ms + 999) / 1000);
  out->advertise_host = advertise_host.empty() ? std::string(host) : advertise_host;
  if (sync_followers < 0 || sync_followers > 16) {
    return InvalidParams("--sync-followers must be 0..16");
  }
  out->server.sync_followers = static_cast<int>(sync_followers);
  // Only members can be elected: a change only a manual --follow standby holds is lost when
  // another member takes over, so such a standby does not count toward --sync-followers.
  out->server.sync_electable_only = true;
  if (out->server.master.state_dir.empty()) {
    return InvalidParams("--etcd needs --state-dir: a member keeps the leader's log there");
  }
  if (out->server.master.replication_log_bytes == 0) {
    return InvalidParams("--etcd needs --replication-log-bytes > 0: followers fetch the log");
  }
  return Status::Ok();
}

int RunHaMember(HaMemberOptions options, const StopSignals& signals) {
  return Member(std::move(options), signals).Run();
}

}  // namespace kvagent::master

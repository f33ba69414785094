// `kvctl cluster --master etcd://HOST:PORT[,HOST:PORT]/CLUSTER`: a cluster of kvmasters as etcd
// shows it — the leader (its epoch and endpoints) and every member's role and position. Needs no
// agent. Exit 0 when a leader serves, 1 when none does (an election under way, or no kvmaster
// running), 2 for bad usage.
#include <chrono>
#include <string>
#include <thread>

#include "kvagent/common/flags.h"
#include "kvagent/coord/cluster_address.h"
#include "kvagent/coord/etcd_client.h"
#include "kvagent/coord/records.h"
#include "kvctl_commands.h"

namespace kvagent::kvctl {
namespace {

using namespace std::chrono_literals;

constexpr std::string_view kClusterUsage =
    "Usage: kvctl cluster --master etcd://HOST:PORT[,HOST:PORT]/CLUSTER [--wait-ms MS]\n"
    "                     [--etcd-ca-file F] [--etcd-cert-file F --etcd-key-file F]\n"
    "                     [--etcd-user NAME --etcd-password-file F]\n"
    "The kvmasters of a cluster coordinated through etcd: the leader (epoch, endpoints) and each\n"
    "member's role and how much of the leader's log it holds. --wait-ms: wait up to MS for a\n"
    "leader that serves. Exit 0 when one serves, 1 when none does. etcd over TLS: name the\n"
    "cluster etcds://... and give the CA (default: the system's) and, where etcd asks for one,\n"
    "a client certificate and key; with etcd's user authentication, the user and its password.\n";

struct View {
  std::optional<coord::Leader> leader;
  std::vector<coord::MemberRecord> members;
};

Result<View> Read(coord::EtcdClient& etcd, const coord::ClusterKeys& keys) {
  View v;
  auto leader = etcd.Get(keys.leader());
  if (!leader.ok()) return leader.status();
  if (leader->has_value()) {
    auto record = coord::LeaderRecord::Decode((*leader)->value);
    if (record.ok()) {
      v.leader = coord::Leader{static_cast<uint64_t>((*leader)->create_revision), *record};
    }
  }
  auto members = etcd.GetPrefix(keys.members());
  if (!members.ok()) return members.status();
  for (const coord::EtcdKeyValue& kv : *members) {
    if (auto m = coord::MemberRecord::Decode(kv.value); m.ok()) v.members.push_back(*m);
  }
  return v;
}

}  // namespace

int ClusterCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
                   std::ostream& err) {
  std::string master;
  int64_t wait_ms = 0;
  FlagSet flags("kvctl cluster", "a cluster of kvmasters as etcd shows it");
  flags.String("master", &master,
               "the cluster: etcd://HOST:PORT[,HOST:PORT]/CLUSTER (etcds://... over TLS)");
  coord::EtcdAccessFlags access;
  access.Declare(&flags);
  flags.Int("wait-ms", &wait_ms, "wait up to this long for a leader that serves");
  Status parsed = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    out << kClusterUsage;
    return kExitOk;
  }
  auto address = coord::ParseClusterAddress(master);
  if (parsed.ok() && master.empty()) parsed = InvalidParams("--master etcd://... is required");
  if (parsed.ok() && !address.ok()) parsed = address.status();
  if (parsed.ok()) parsed = access.Apply(&*address);
  if (parsed.ok() && wait_ms < 0) parsed = InvalidParams("--wait-ms must be >= 0");
  if (!parsed.ok()) {
    err << "kvctl cluster: " << parsed.message()
        << "; usage: kvctl cluster --master etcd://HOST:PORT/CLUSTER [--wait-ms MS] "
           "[--etcd-ca-file F] [--etcd-cert-file F --etcd-key-file F] [--etcd-user NAME "
           "--etcd-password-file F]\n";
    return kExitUsage;
  }
  auto etcd = coord::EtcdClient::Create(
      address->Etcd(std::min<std::chrono::milliseconds>(global.timeout, 5000ms)));
  if (!etcd.ok()) {
    err << "kvctl: cluster: " << etcd.status().ToString() << "\n";
    return kExitFailed;
  }
  const coord::ClusterKeys keys(address->cluster);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  Result<View> view = Read(**etcd, keys);
  while (view.ok() && (!view->leader || !view->leader->record.serving()) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(50ms);
    view = Read(**etcd, keys);
  }
  if (!view.ok()) {
    err << "kvctl: cluster: " << view.status().ToString() << "\n";
    return kExitFailed;
  }
  out << "cluster " << address->cluster << " (" << address->ToString() << ")\n";
  const bool serving = view->leader && view->leader->record.serving();
  if (view->leader) {
    const coord::LeaderRecord& r = view->leader->record;
    out << "leader  " << r.name << "  epoch " << view->leader->epoch;
    if (serving) {
      out << "  rpc " << r.rpc << "  events " << r.events << "  replay " << r.replay << "\n";
    } else {
      out << "  (starting: not serving yet)\n";
    }
  } else {
    out << "leader  none\n";
  }
  for (const coord::MemberRecord& m : view->members) {
    out << "member  " << m.name << "  " << m.role << "  holds term " << m.epoch << " to record "
        << m.applied_seq << (m.rpc.empty() ? "" : "  rpc " + m.rpc) << "\n";
  }
  if (!serving) {
    err << "kvctl: cluster: MASTER_UNAVAILABLE: no kvmaster leads " << address->ToString()
        << " now: an election may be under way (it takes about one leader lease) or no kvmaster "
           "runs; check the members above and their logs\n";
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace kvagent::kvctl

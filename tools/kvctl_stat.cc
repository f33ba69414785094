// kvctl stat and kvctl ping: how the agent (and its master) are doing, for a person at 3 a.m.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "kvagent/common/format.h"
#include "kvctl_agent.h"
#include "kvctl_commands.h"

namespace kvagent::kvctl {
namespace {

constexpr CommandSpec kStat{
    "stat", "stat [--raw]",
    "Prints the agent's counters and its master's, grouped and aligned: the request table per\n"
    "op (requests, batches, keys), then the rest. With --raw: one NAME<TAB>VALUE[<TAB>TEXT]\n"
    "line per counter, for scripts.",
    0, 0};
constexpr CommandSpec kPing{
    "ping", "ping [--wait-ms MS]",
    "Asks the agent for an empty round trip; prints the time it took, and a second line when\n"
    "the agent is degraded (its master link is down: requests other than ping fail with\n"
    "MASTER_UNAVAILABLE). Exit 0 when it answers.",
    0, 0};

// The per-op counters "<group>.requests.<op>", "<group>.batches.<op>", "<group>.keys.<op>".
constexpr const char* kOpColumns[] = {"requests", "batches", "keys"};

struct OpRow {
  std::string op;
  uint64_t values[3] = {0, 0, 0};
};

// One group ("agent", "master") of counters, in the order the agent sent them.
struct Group {
  std::string name;
  std::vector<OpRow> ops;
  // label, shown value: `described` (counters with words: the master link, the pool, the data
  // endpoint — what one checks first) are printed before the op table, `lines` after it.
  std::vector<std::pair<std::string, std::string>> described;
  std::vector<std::pair<std::string, std::string>> lines;
};

// How a counter's value reads: sizes in units with the exact count beside them, the master
// link as up/DOWN with its description, words as themselves.
std::string Shown(const std::string& label, const Counter& c) {
  if (label == "master_link") return (c.value != 0 ? "up: " : "DOWN: ") + c.text;
  std::string shown = std::to_string(c.value);
  if (label.find("bytes") != std::string::npos && c.value >= 1024) {
    shown = FormatBytes(c.value) + " (" + shown + ")";
  }
  if (c.text.empty()) return shown;
  if (c.value == 0) return c.text;
  return shown + ", " + c.text;
}

std::vector<Group> Grouped(const std::vector<Counter>& counters) {
  std::vector<Group> groups;
  for (const Counter& c : counters) {
    const size_t dot = c.name.find('.');
    const std::string group = dot == std::string::npos ? "other" : c.name.substr(0, dot);
    const std::string label = dot == std::string::npos ? c.name : c.name.substr(dot + 1);
    auto g =
        std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.name == group; });
    if (g == groups.end()) g = groups.insert(groups.end(), Group{group, {}, {}, {}});
    bool in_table = false;
    for (size_t col = 0; col < 3 && !in_table; ++col) {
      const std::string column = std::string(kOpColumns[col]) + ".";
      if (label.rfind(column, 0) != 0) continue;
      const std::string op = label.substr(column.size());
      auto row =
          std::find_if(g->ops.begin(), g->ops.end(), [&](const OpRow& r) { return r.op == op; });
      if (row == g->ops.end()) row = g->ops.insert(g->ops.end(), OpRow{op, {0, 0, 0}});
      row->values[col] = c.value;
      in_table = true;
    }
    if (in_table) continue;
    (c.text.empty() ? g->lines : g->described).emplace_back(label, Shown(label, c));
  }
  return groups;
}

void PrintGroup(const Group& g, std::ostream& out) {
  out << g.name << "\n";
  size_t width = 10;
  for (const auto& [label, shown] : g.described) width = std::max(width, label.size());
  for (const auto& [label, shown] : g.lines) width = std::max(width, label.size());
  for (const OpRow& r : g.ops) width = std::max(width, r.op.size());
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w - s.size(), ' '); };
  for (const auto& [label, shown] : g.described) {
    out << "  " << pad(label, width) << "  " << shown << "\n";
  }
  if (!g.ops.empty()) {
    char line[128];
    std::snprintf(line, sizeof(line), "%12s %12s %12s", kOpColumns[0], kOpColumns[1],
                  kOpColumns[2]);
    out << "  " << pad("op", width) << line << "\n";
    for (const OpRow& r : g.ops) {
      std::snprintf(line, sizeof(line), "%12llu %12llu %12llu",
                    static_cast<unsigned long long>(r.values[0]),
                    static_cast<unsigned long long>(r.values[1]),
                    static_cast<unsigned long long>(r.values[2]));
      out << "  " << pad(r.op, width) << line << "\n";
    }
  }
  for (const auto& [label, shown] : g.lines) {
    out << "  " << pad(label, width) << "  " << shown << "\n";
  }
}

}  // namespace

int StatCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
                std::ostream& err) {
  bool raw = false;
  FlagSet flags("kvctl stat", std::string(kStat.summary));
  flags.Bool("raw", &raw, "one NAME<TAB>VALUE[<TAB>TEXT] line per counter");
  std::vector<std::string> positionals;
  if (auto exit = ParseCommandLine(kStat, &flags, argc, argv, &positionals, out, err)) {
    return *exit;
  }
  auto client = ConnectAgent(global, 1 << 20);
  if (!client.ok()) return ReportFailure(err, "stat", client.status());
  Reply reply = (*client)->Stat(global.timeout);
  if (!reply.ok()) return ReportFailure(err, "stat", reply.status);
  if (raw) {
    for (const Counter& c : reply.counters) {
      out << c.name << '\t' << c.value << (c.text.empty() ? "" : "\t" + c.text) << '\n';
    }
    return kExitOk;
  }
  const std::vector<Group> groups = Grouped(reply.counters);
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i > 0) out << "\n";
    PrintGroup(groups[i], out);
  }
  return kExitOk;
}

int PingCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
                std::ostream& err) {
  FlagSet flags("kvctl ping", std::string(kPing.summary));
  int64_t wait_ms = 0;
  flags.Int("wait-ms", &wait_ms,
            "keep trying this long while no agent answers yet (for scripts that just started "
            "kvagent: it listens once its pool is pre-faulted)");
  std::vector<std::string> positionals;
  if (auto exit = ParseCommandLine(kPing, &flags, argc, argv, &positionals, out, err)) {
    return *exit;
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  auto client = ConnectAgent(global, 1 << 20);
  while (!client.ok() && client.status().code() == ErrorCode::kAgentUnavailable &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    client = ConnectAgent(global, 1 << 20);
  }
  if (!client.ok()) return ReportFailure(err, "ping", client.status());
  const auto start = std::chrono::steady_clock::now();
  Reply reply = (*client)->Ping(global.timeout);
  const auto took = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - start);
  if (!reply.ok()) return ReportFailure(err, "ping", reply.status);
  out << "agent at " << global.run_dir << "/agent.sock answered in " << took.count()
      << " us (client " << (*client)->client_id() << ", agent incarnation "
      << (*client)->agent_incarnation() << ")\n";
  // Ping is answered by the agent alone; whether it can serve anything else is its master link.
  Reply stat = (*client)->Stat(global.timeout);
  if (!stat.ok()) {
    out << "could not ask the agent whether it is degraded: " << stat.status.ToString() << "\n";
    return kExitOk;
  }
  for (const Counter& c : stat.counters) {
    if (c.name == "agent.master_link" && c.value == 0) {
      out << "DEGRADED: the master link is down (" << c.text
          << "); requests other than ping fail with MASTER_UNAVAILABLE until it is up again\n";
    }
  }
  return kExitOk;
}

}  // namespace kvagent::kvctl

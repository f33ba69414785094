// kvctl sessions: what the cluster stores per session ID now (blocks and bytes), from the
// counters the master keeps next to its session tags: no scan of the keys.
#include <algorithm>
#include <cstdint>
#include <queue>
#include <string>
#include <vector>

#include "kvctl_agent.h"
#include "kvctl_commands.h"
#include "kvctl_events.h"

namespace kvagent::kvctl {
namespace {

constexpr CommandSpec kSessions{
    "sessions", "sessions [--session ID] [--top N] [--json]",
    "Prints what the cluster stores per session ID now: SESSION<TAB>BLOCKS<TAB>BYTES (blocks:\n"
    "readable objects the session wrote; bytes: their values), from counters the master keeps\n"
    "(the cost grows with the number of sessions, not of keys). Every session that stores\n"
    "something, in the master's order; --top N: the N storing the most bytes, largest first;\n"
    "--session ID: that one (0 blocks when it stores nothing). --json: one object per line.",
    0, 0};

void Print(const SessionUsage& u, bool json, std::ostream& out) {
  if (json) {
    out << "{\"session_id\":" << JsonString(u.session_id) << ",\"blocks\":" << u.blocks
        << ",\"bytes\":" << u.bytes << "}\n";
  } else {
    out << PrintableKey(u.session_id) << '\t' << u.blocks << '\t' << u.bytes << '\n';
  }
}

// Orders a min-heap by bytes (then blocks, then ID, for a stable order).
bool Larger(const SessionUsage& a, const SessionUsage& b) {
  if (a.bytes != b.bytes) return a.bytes > b.bytes;
  if (a.blocks != b.blocks) return a.blocks > b.blocks;
  return a.session_id < b.session_id;
}

}  // namespace

int SessionsCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
                    std::ostream& err) {
  std::string session;
  int64_t top = 0;
  bool json = false;
  FlagSet flags("kvctl sessions", std::string(kSessions.summary));
  flags.String("session", &session, "only this session ID");
  flags.Int("top", &top, "only the N sessions storing the most bytes, largest first (0: all)");
  flags.Bool("json", &json, "one JSON object per line: session_id, blocks, bytes");
  std::vector<std::string> positionals;
  if (auto exit = ParseCommandLine(kSessions, &flags, argc, argv, &positionals, out, err)) {
    return *exit;
  }
  if (top < 0) return ReportUsage(err, kSessions, "--top must be >= 0");
  auto client = ConnectAgent(global, 1 << 20);
  if (!client.ok()) return ReportFailure(err, "sessions", client.status());

  SessionsOptions options;
  options.session_id = session;
  options.timeout = global.timeout;
  // --top N keeps the N largest in a heap while paging: memory stays O(N) however many
  // sessions there are.
  auto smaller_on_top = [](const SessionUsage& a, const SessionUsage& b) { return Larger(a, b); };
  std::priority_queue<SessionUsage, std::vector<SessionUsage>, decltype(smaller_on_top)> best(
      smaller_on_top);
  do {
    Reply page = (*client)->Sessions(options);
    if (!page.ok()) return ReportFailure(err, "sessions", page.status);
    for (SessionUsage& u : page.sessions) {
      if (top == 0) {
        Print(u, json, out);
        continue;
      }
      best.push(std::move(u));
      if (best.size() > static_cast<size_t>(top)) best.pop();
    }
    options.cursor = page.next_cursor;
  } while (options.cursor != 0);
  std::vector<SessionUsage> ranked;
  while (!best.empty()) {
    ranked.push_back(best.top());
    best.pop();
  }
  std::sort(ranked.begin(), ranked.end(), Larger);
  for (const SessionUsage& u : ranked) Print(u, json, out);
  return kExitOk;
}

}  // namespace kvagent::kvctl

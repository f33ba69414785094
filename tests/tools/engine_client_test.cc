// examples/engine_client against a real standalone kvagent: it passes its own checks, leaves
// exactly the blocks it should, and the agent's event stream attributes every block to the
// session that wrote it, with the chained hashes and token ids the example documents.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "agent_process.h"
#include "command_run.h"

#ifndef KVCTL_BINARY
#error "KVCTL_BINARY must name the kvctl executable"
#endif
#ifndef ENGINE_CLIENT_BINARY
#error "ENGINE_CLIENT_BINARY must name the engine_client executable"
#endif

namespace kvagent::testing {
namespace {

const std::vector<std::string> kSessions = {"sess-0", "sessão-1", "会话-2", "sess-3"};

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

CommandOutput EngineClient(const AgentProcess& agent) {
  return RunCommand({ENGINE_CLIENT_BINARY, "--run-dir", agent.run_dir(), "--sessions", "4",
                     "--blocks", "8", "--block-bytes", "16KiB"});
}

// One event of `kvctl events tail --json`, the fields this test reads.
struct JsonEvent {
  std::string type, session, object_key, parent;
  std::string hash;  // the one block hash ("" when not exactly one)
  size_t token_count = 0;
  size_t block_size = 0;
};

std::string Field(const std::string& line, const std::string& pattern) {
  std::smatch m;
  return std::regex_search(line, m, std::regex(pattern)) ? m[1].str() : "";
}

JsonEvent ParseEvent(const std::string& line) {
  JsonEvent e;
  e.type = Field(line, "\"type\":\"([A-Za-z]+)\"");
  e.session = Field(line, "\"session_id\":\"([^\"]*)\"");
  e.object_key = Field(line, "\"object_key\":\"([^\"]*)\"");
  e.parent = Field(line, "\"parent_block_hash\":(null|[0-9]+)");
  e.hash = Field(line, "\"block_hashes\":\\[([0-9]+)\\]");
  const std::string tokens = Field(line, "\"token_count\":([0-9]+)");
  const std::string block_size = Field(line, "\"block_size\":([0-9]+)");
  e.token_count = tokens.empty() ? 0 : std::stoul(tokens);
  e.block_size = block_size.empty() ? 0 : std::stoul(block_size);
  return e;
}

TEST(EngineClient, StoresReadsAndRemovesEverySessionsChainAndLeavesTheHeadOfEach) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  CommandOutput run = EngineClient(agent);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("engine_client: OK: 4 sessions, 32 blocks stored (0 already there), 16 "
                         "read back and verified, 8 removed"),
            std::string::npos)
      << run.out;
  for (const std::string& s : kSessions) {
    EXPECT_NE(run.out.find("[" + s + "] put 8 blocks (128 tokens): 8 stored, 0 already there"),
              std::string::npos)
        << run.out;
  }
  // 6 of each session's 8 blocks remain, 16 KiB each, tagged with their session.
  CommandOutput ls = RunCommand({KVCTL_BINARY, "--run-dir", agent.run_dir(), "ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  std::map<std::string, int> per_session;
  for (const std::string& line : Lines(ls.out)) {
    const size_t a = line.find('\t'), b = line.find('\t', a + 1);
    ASSERT_NE(b, std::string::npos) << line;
    EXPECT_EQ(line.rfind("engine/", 0), 0u) << line;
    EXPECT_EQ(line.substr(a + 1, b - a - 1), "16384") << line;
    ++per_session[line.substr(b + 1)];
  }
  EXPECT_EQ(per_session, (std::map<std::string, int>{
                             {"sess-0", 6}, {"sessão-1", 6}, {"会话-2", 6}, {"sess-3", 6}}));
}

TEST(EngineClient, RunningItAgainAgainstTheSameAgentFindsTheKeptBlocksAndPasses) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  ASSERT_EQ(EngineClient(agent).exit_code, 0);
  CommandOutput again = EngineClient(agent);
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_NE(again.out.find("[会话-2] put 8 blocks (128 tokens): 2 stored, 6 already there"),
            std::string::npos)
      << again.out;
}

TEST(EngineClient, EveryStoredBlockIsAnnouncedWithItsSessionAndItsParentsHash) {
  AgentProcess agent;
  ASSERT_TRUE(agent.started());
  ASSERT_EQ(EngineClient(agent).exit_code, 0);
  // 32 BlockStored + 8 BlockRemoved, possibly after an AllBlocksCleared from the master's start:
  // ask for one more than that and accept the timeout that ends a stream of exactly 40.
  CommandOutput tail =
      RunCommand({KVCTL_BINARY, "--run-dir", agent.run_dir(), "events", "tail", "--json",
                  "--from-seq", "0", "--count", "42", "--timeout-ms", "3000"});
  ASSERT_TRUE(tail.exit_code == 0 || tail.exit_code == 1) << tail.err;
  std::map<std::string, std::vector<JsonEvent>> stored;  // per session, in stream order
  std::set<std::string> removed_keys;
  for (const std::string& line : Lines(tail.out)) {
    const JsonEvent e = ParseEvent(line);
    if (e.type == "BlockStored") stored[e.session].push_back(e);
    if (e.type == "BlockRemoved") removed_keys.insert(e.object_key);
  }
  ASSERT_EQ(stored.size(), kSessions.size()) << tail.out;
  for (const std::string& s : kSessions) {
    const std::vector<JsonEvent>& chain = stored[s];
    ASSERT_EQ(chain.size(), 8u) << s;
    for (size_t b = 0; b < chain.size(); ++b) {
      EXPECT_FALSE(chain[b].hash.empty()) << s << " block " << b;
      EXPECT_EQ(chain[b].token_count, 16u);
      EXPECT_EQ(chain[b].block_size, 16u);
      // Chained: the first block has no parent, every other one names its predecessor.
      EXPECT_EQ(chain[b].parent, b == 0 ? "null" : chain[b - 1].hash) << s << " block " << b;
      char key[32];
      std::snprintf(key, sizeof(key), "engine/%016llx",
                    static_cast<unsigned long long>(std::stoull(chain[b].hash)));
      EXPECT_EQ(chain[b].object_key, key);
      // The last two blocks of each chain were removed, and only those.
      EXPECT_EQ(removed_keys.count(key), b >= 6 ? 1u : 0u) << s << " block " << b;
    }
  }
  EXPECT_EQ(removed_keys.size(), 8u);
}

TEST(EngineClient, WithoutAnAgentItFailsWithOneLine) {
  TempDir empty;
  CommandOutput run = RunCommand({ENGINE_CLIENT_BINARY, "--run-dir", empty.path()});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.err.rfind("engine_client: FAILED: AGENT_UNAVAILABLE: ", 0), 0u) << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
}

}  // namespace
}  // namespace kvagent::testing

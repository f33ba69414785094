// The agent key in the run dir (agent_key_file.h): drawn once and kept, so a restarted agent
// registers with the key its name is bound to at kvmaster; a file that is not a key, or that
// others may read, stops the agent with an error naming it, and is left as it was.
#include "agent_key_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "temp_dir.h"

namespace kvagent::agent {
namespace {

using kvagent::testing::TempDir;

std::string Content(const std::string& path) {
  std::stringstream s;
  s << std::ifstream(path).rdbuf();
  return s.str();
}

void Write(const std::string& path, const std::string& text, mode_t mode = 0600) {
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
}

TEST(AgentKeyFile, IsDrawnOnceAndKept) {
  TempDir run;
  const std::string path = run.path() + "/agent.key";
  auto first = LoadOrCreateAgentKey(run.path());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_NE(first->value, 0u);
  EXPECT_EQ(first->unsaved, "");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string text = Content(path);
  ASSERT_EQ(text.size(), 17u);
  EXPECT_EQ(std::stoull(text, nullptr, 16), first->value);
  EXPECT_FALSE(std::filesystem::exists(path + ".new"));
  auto again = LoadOrCreateAgentKey(run.path());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->value, first->value);
  // Another run dir, another agent: another key.
  TempDir other;
  auto second = LoadOrCreateAgentKey(other.path());
  ASSERT_TRUE(second.ok());
  EXPECT_NE(second->value, first->value);
}

TEST(AgentKeyFile, AFileThatIsNotAKeyIsAnErrorAndStaysAsItWas) {
  TempDir run;
  const std::string path = run.path() + "/agent.key";
  for (const std::string& bad :
       {std::string(""), std::string("0123456789abcdef"), std::string("0123456789ABCDEF\n"),
        std::string("0000000000000000\n"), std::string("0123456789abcdeg\n"),
        std::string("0123456789abcdef\n\n"), std::string(4096, 'a')}) {
    Write(path, bad);
    auto key = LoadOrCreateAgentKey(run.path());
    ASSERT_FALSE(key.ok()) << bad;
    EXPECT_EQ(key.status().code(), ErrorCode::kInvalidParams);
    EXPECT_NE(key.status().message().find(path), std::string::npos) << key.status().message();
    EXPECT_EQ(Content(path), bad);
  }
  Write(path, "00000000000000ff\n", 0644);
  auto open = LoadOrCreateAgentKey(run.path());
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos)
      << open.status().message();
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(LoadOrCreateAgentKey(run.path())->value, 0xffu);
  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  auto dir = LoadOrCreateAgentKey(run.path());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("not a regular file"), std::string::npos);
}

// A run dir where the key cannot be written (full, read-only; here the aside file's name is
// taken by a directory): the agent still gets a key, for this process only, and says why.
TEST(AgentKeyFile, AKeyThatCannotBeWrittenIsKeptInTheProcessAndSaysWhy) {
  TempDir run;
  std::filesystem::create_directory(run.path() + "/agent.key.new");
  auto first = LoadOrCreateAgentKey(run.path());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_NE(first->value, 0u);
  EXPECT_NE(first->unsaved.find("agent.key.new"), std::string::npos) << first->unsaved;
  EXPECT_FALSE(std::filesystem::exists(run.path() + "/agent.key"));
  auto second = LoadOrCreateAgentKey(run.path());
  ASSERT_TRUE(second.ok());
  EXPECT_NE(second->value, first->value);
}

}  // namespace
}  // namespace kvagent::agent

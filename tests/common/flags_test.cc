#include "kvagent/common/flags.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace kvagent {
namespace {

struct AgentLikeOptions {
  std::string run_dir = "/run/kvagent";
  uint64_t pool_size = 1ULL << 30;
  int64_t spin_us = 50;
  bool standalone = true;
  double high_watermark = 0.9;
  std::vector<std::string> allow_uid;
};

class FlagSetTest : public ::testing::Test {
 protected:
  FlagSetTest() : flags_("kvagent", "per-node agent") {
    flags_.String("run-dir", &opts_.run_dir, "runtime directory");
    flags_.Size("pool-size", &opts_.pool_size, "node pool bytes");
    flags_.Int("spin-us", &opts_.spin_us, "spin budget");
    flags_.Bool("standalone", &opts_.standalone, "embed the master");
    flags_.Double("high-watermark", &opts_.high_watermark, "eviction watermark");
    flags_.StringList("allow-uid", &opts_.allow_uid, "allowed uids");
  }

  Status Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "kvagent");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return flags_.Parse(static_cast<int>(argv.size()), argv.data());
  }

  AgentLikeOptions opts_;
  FlagSet flags_;
};

TEST_F(FlagSetTest, DefaultsStayWhenNothingIsGiven) {
  ASSERT_TRUE(Parse({}).ok());
  EXPECT_EQ(opts_.run_dir, "/run/kvagent");
  EXPECT_EQ(opts_.pool_size, 1ULL << 30);
}

TEST_F(FlagSetTest, SpaceAndEqualsFormsAndUnderscores) {
  ASSERT_TRUE(Parse({"--run-dir", "/tmp/x", "--pool_size=64MiB", "--spin-us=7"}).ok());
  EXPECT_EQ(opts_.run_dir, "/tmp/x");
  EXPECT_EQ(opts_.pool_size, 64ULL << 20);
  EXPECT_EQ(opts_.spin_us, 7);
}

TEST_F(FlagSetTest, BoolFlagAloneIsTrueAndTakesExplicitFalse) {
  opts_.standalone = false;
  ASSERT_TRUE(Parse({"--standalone"}).ok());
  EXPECT_TRUE(opts_.standalone);
  ASSERT_TRUE(Parse({"--standalone=false"}).ok());
  EXPECT_FALSE(opts_.standalone);
}

TEST_F(FlagSetTest, RepeatedListFlagAppends) {
  ASSERT_TRUE(Parse({"--allow-uid", "0", "--allow-uid", "1000"}).ok());
  EXPECT_EQ(opts_.allow_uid, (std::vector<std::string>{"0", "1000"}));
}

TEST_F(FlagSetTest, UnknownFlagIsOneClearLine) {
  Status s = Parse({"--pool-sise", "1GiB"});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(s.message(), "unknown option '--pool-sise' (see kvagent --help)");
}

TEST_F(FlagSetTest, BadValuesNameTheFlag) {
  EXPECT_EQ(Parse({"--spin-us", "lots"}).message(), "--spin-us: expected an integer, got 'lots'");
  EXPECT_EQ(Parse({"--pool-size", "1XB"}).message(),
            "--pool-size: unknown size suffix 'XB' (use B, KiB, MiB, GiB or TiB)");
  EXPECT_EQ(Parse({"--spin-us"}).message(), "--spin-us needs a value");
  EXPECT_FALSE(Parse({"--high-watermark", "0.9x"}).ok());
}

TEST_F(FlagSetTest, ConfigTextSetsValuesAndIgnoresSections) {
  Status s = flags_.ApplyConfigText(
      "# kvagent config\n[agent]\nrun_dir = \"/srv/kv\"  # comment\npool_size = \"2GiB\"\n"
      "standalone = false\nhigh_watermark = 0.75\nallow_uid = [\"0\", \"42\"]\n",
      "agent.toml");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(opts_.run_dir, "/srv/kv");
  EXPECT_EQ(opts_.pool_size, 2ULL << 30);
  EXPECT_FALSE(opts_.standalone);
  EXPECT_DOUBLE_EQ(opts_.high_watermark, 0.75);
  EXPECT_EQ(opts_.allow_uid, (std::vector<std::string>{"0", "42"}));
}

TEST_F(FlagSetTest, ConfigErrorsNameFileAndLine) {
  Status s = flags_.ApplyConfigText("run_dir = \"/x\"\nbogus = 1\n", "agent.toml");
  EXPECT_EQ(s.message(), "agent.toml:2: unknown option 'bogus'");
  s = flags_.ApplyConfigText("run_dir = \"unterminated\n", "agent.toml");
  EXPECT_EQ(s.message().rfind("agent.toml:1: Error while parsing string", 0), 0u) << s.message();
  s = flags_.ApplyConfigText("run_dir = \"/x\"\n\npool_size = \"1XB\"\n", "agent.toml");
  EXPECT_EQ(s.message(),
            "agent.toml:3: --pool-size: unknown size suffix 'XB' (use B, KiB, MiB, GiB or TiB)");
  s = flags_.ApplyConfigText("spin_us = \"lots\"\n", "agent.toml");
  EXPECT_EQ(s.message(), "agent.toml:1: --spin-us: expected an integer, got 'lots'");
  s = flags_.ApplyConfigText("run_dir = [\"a\"]\n", "agent.toml");
  EXPECT_EQ(s.message(), "agent.toml:1: 'run_dir' is not a list");
  s = flags_.ApplyConfigText("run_dir = 1979-05-27\n", "agent.toml");
  EXPECT_EQ(s.message(), "agent.toml:1: 'run_dir': expected a string, a number or a boolean");
  s = flags_.ApplyConfigText("[agent]\nbogus = 1\n", "agent.toml");
  EXPECT_EQ(s.message(), "agent.toml:2: unknown option 'agent.bogus'");
}

// Writes `text` to a file in $TMPDIR; returns its path.
std::string ConfigFile(const std::string& text) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp ? tmp : "/tmp") + "/kvagent-flags-test-" +
                     std::to_string(::getpid()) + ".toml";
  std::ofstream(path) << text;
  return path;
}

TEST_F(FlagSetTest, AListFlagOnTheCommandLineReplacesTheConfigFilesList) {
  const std::string path = ConfigFile("allow_uid = [\"1\", \"2\"]\nspin_us = 9\n");
  ASSERT_TRUE(Parse({"--config", path, "--allow-uid", "7"}).ok());
  EXPECT_EQ(opts_.allow_uid, (std::vector<std::string>{"7"}));  // not 1, 2, 7
  EXPECT_EQ(opts_.spin_us, 9);
  ASSERT_TRUE(Parse({"--config=" + path}).ok());
  EXPECT_EQ(opts_.allow_uid, (std::vector<std::string>{"1", "2"}));
  std::remove(path.c_str());
}

TEST_F(FlagSetTest, ConfigWithoutAPathIsAnError) {
  const Status s = Parse({"--run-dir", "/x", "--config"});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(s.message(), "--config needs a value: the config file's path");
  EXPECT_EQ(Parse({"--config="}).message(), "--config needs a value: the config file's path");
  EXPECT_EQ(Parse({"--config", "/nonexistent.toml"}).message(),
            "--config: cannot read '/nonexistent.toml': No such file or directory");
}

// A directory would read as an empty config (every default, silently); a device such as
// /dev/zero would be read until memory ran out. Both are refused before anything is applied.
TEST_F(FlagSetTest, AConfigThatIsADirectoryOrADeviceIsRefused) {
  EXPECT_EQ(Parse({"--config", "/tmp", "--spin-us", "3"}).message(),
            "--config: cannot read '/tmp': not a regular file");
  EXPECT_EQ(Parse({"--config", "/dev/zero"}).message(),
            "--config: cannot read '/dev/zero': not a regular file");
  EXPECT_EQ(opts_.spin_us, 50);
}

TEST_F(FlagSetTest, AConfigLargerThanOneMebibyteIsRefused) {
  std::string text = "spin_us = 9\n";
  text += std::string((1 << 20), '#') + "\n";  // one long comment: valid TOML
  const std::string path = ConfigFile(text);
  const Status s = Parse({"--config", path});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(s.message(), "--config: '" + path + "' is larger than 1 MiB; is it the right file?");
  EXPECT_EQ(opts_.spin_us, 50);
  std::remove(path.c_str());
}

// toml++ builds a table header or dotted key of N parts by recursing N deep: 100 000 parts
// crashed kvagent (stack overflow) before a word was said. Dots outside strings are counted first;
// the same dots inside strings (however quoted) are text and change nothing.
TEST_F(FlagSetTest, AConfigWithTensOfThousandsOfKeyPartsIsRefusedNotACrash) {
  std::string header = "[a";
  for (int i = 0; i < 100000; ++i) header += ".a";
  header += "]\n";
  const std::string deep = ConfigFile("spin_us = 9\n" + header);
  Status s = Parse({"--config", deep});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidParams);
  EXPECT_EQ(s.message(),
            deep +
                ":2: more than 4096 dots outside strings (dotted keys, table headers, "
                "numbers): options are at most two levels deep; is it the right file?");
  EXPECT_EQ(opts_.spin_us, 50);
  std::remove(deep.c_str());
  // A multi-line string ending in extra quotes, then dotted keys on its line: still counted.
  std::string keys = R"(t = { s = """x"""")";
  for (int i = 0; i < 5000; ++i) keys += ", k" + std::to_string(i) + ".a = 1";
  const std::string inline_keys = ConfigFile(keys + " }\n");
  s = Parse({"--config", inline_keys});
  EXPECT_NE(s.message().find(":1: more than 4096 dots"), std::string::npos) << s.message();
  std::remove(inline_keys.c_str());
  // The dots of strings, comments and a float are not counted.
  const std::string dots(20000, '.');
  const std::string fine =
      ConfigFile("# " + dots + "\nrun_dir = \"/tmp/" + dots + "\"\nspin_us = 12 # 1.5\n[x]\n" +
                 "y = '''" + dots + "'''\nz = \"\"\"\n" + dots + "\n\"\"\"\n");
  s = Parse({"--config", fine});
  EXPECT_NE(s.message().find("unknown option 'x.y'"), std::string::npos) << s.message();
  EXPECT_EQ(opts_.spin_us, 12);
  std::remove(fine.c_str());
}

// `kvagent --config <(generate-config)`: the shell passes a pipe.
TEST_F(FlagSetTest, AConfigFromAPipeIsRead) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string text = "spin_us = 11\n";
  ASSERT_EQ(::write(fds[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fds[1]);
  const Status s = Parse({"--config", "/dev/fd/" + std::to_string(fds[0])});
  ::close(fds[0]);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(opts_.spin_us, 11);
}

TEST_F(FlagSetTest, CommandLineFlagsOverrideTheConfigFile) {
  const std::string path = ConfigFile("run_dir = \"/from/file\"\nstandalone = false\n");
  ASSERT_TRUE(Parse({"--run-dir", "/from/flag", "--config", path}).ok());
  EXPECT_EQ(opts_.run_dir, "/from/flag");
  EXPECT_FALSE(opts_.standalone);
  std::remove(path.c_str());
}

TEST(FlagSetTables, AKeyInATableSetsTheTablePrefixedOptionWhenThereIsOne) {
  std::string listen = "0.0.0.0:0";
  std::string transport = "auto";
  int64_t ttl = 0;
  FlagSet flags("kvagent", "test");
  flags.String("data-listen", &listen, "");
  flags.String("data-transport", &transport, "");
  flags.Int("lease-ttl-ms", &ttl, "");
  ASSERT_TRUE(flags
                  .ApplyConfigText("[data]\nlisten = \"0.0.0.0:7000\"\ntransport = \"tcp\"\n"
                                   "[master]\nlease_ttl_ms = 500\n",
                                   "agent.toml")
                  .ok());
  EXPECT_EQ(listen, "0.0.0.0:7000");
  EXPECT_EQ(transport, "tcp");
  EXPECT_EQ(ttl, 500);  // no "master-lease-ttl-ms": the key itself
}

TEST_F(FlagSetTest, AnArgumentThatIsNotAFlagIsRefusedWithoutPositionals) {
  EXPECT_EQ(Parse({"stray"}).message(), "unexpected argument 'stray' (see kvagent --help)");
  EXPECT_EQ(Parse({"--standalone", "false"}).message(),
            "unexpected argument 'false' (see kvagent --help)");
}

TEST_F(FlagSetTest, VersionIsNoticed) {
  ASSERT_TRUE(Parse({"--version"}).ok());
  EXPECT_TRUE(flags_.version_requested());
  EXPECT_FALSE(flags_.help_requested());
}

TEST_F(FlagSetTest, HelpListsEveryOptionWithDefault) {
  ASSERT_TRUE(Parse({"--help"}).ok());
  EXPECT_TRUE(flags_.help_requested());
  std::string usage = flags_.Usage();
  EXPECT_NE(usage.find("--run-dir VALUE"), std::string::npos);
  EXPECT_NE(usage.find("(default: /run/kvagent)"), std::string::npos);
}

TEST(ParseSizeTest, Suffixes) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("4KiB"), 4096u);
  EXPECT_EQ(*ParseSize("1G"), 1ULL << 30);
  EXPECT_FALSE(ParseSize("GiB").ok());
  EXPECT_FALSE(ParseSize("99999999999999TiB").ok());
}

}  // namespace
}  // namespace kvagent

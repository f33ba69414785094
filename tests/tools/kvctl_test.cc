// kvctl, the binary, against a real standalone kvagent in a fresh run directory: what it
// prints, the bytes it moves, and its exit status and one-line reasons on failure.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "agent_process.h"
#include "command_run.h"
#include "kvagent/client.h"
#include "temp_dir.h"

#ifndef KVCTL_BINARY
#error "KVCTL_BINARY must name the kvctl executable"
#endif

namespace kvagent::testing {
namespace {

// kvctl --run-dir <agent's> args...
CommandOutput Kvctl(const std::string& run_dir, std::vector<std::string> args,
                    const std::string& input = "") {
  args.insert(args.begin(), {KVCTL_BINARY, "--run-dir", run_dir});
  return RunCommand(args, input);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// True when `err` is exactly one line.
bool OneLine(const std::string& err) {
  return !err.empty() && err.back() == '\n' && std::count(err.begin(), err.end(), '\n') == 1;
}

// `size` bytes covering every byte value, in an order that depends on `seed`.
std::string BinaryBytes(size_t size, uint32_t seed) {
  std::string out(size, '\0');
  uint32_t x = seed | 1;
  for (size_t i = 0; i < size; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<char>(i < 256 ? i : x >> 24);
  }
  return out;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

class KvctlTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(agent_.started()); }
  CommandOutput Run(std::vector<std::string> args, const std::string& input = "") {
    return Kvctl(agent_.run_dir(), std::move(args), input);
  }
  AgentProcess agent_;
  TempDir files_;
};

TEST_F(KvctlTest, PutThenGetWritesExactlyTheValueToStdout) {
  const std::string value = "hello\tworld\n\xce\xb1";
  CommandOutput put = Run({"put", "greeting", "--value", value, "--session", "s1"});
  EXPECT_EQ(put.exit_code, 0) << put.err;
  EXPECT_EQ(put.out, "stored greeting (14 bytes, session s1)\n");
  EXPECT_EQ(put.err, "");
  CommandOutput get = Run({"get", "greeting"});
  EXPECT_EQ(get.exit_code, 0) << get.err;
  EXPECT_EQ(get.out, value);
  EXPECT_EQ(get.err, "");
}

TEST_F(KvctlTest, BinaryFileRoundTripsThroughFileAndOutLargerThanTheFirstReadBuffer) {
  // 3 MiB + 7: larger than get's first 1 MiB buffer, so the read is redone at the exact length
  // the agent reports with BUFFER_OUT_OF_RANGE.
  const std::string bytes = BinaryBytes((3 << 20) + 7, 42);
  const std::string in_path = files_.path() + "/in.bin", out_path = files_.path() + "/out.bin";
  WriteFile(in_path, bytes);
  CommandOutput put = Run({"put", "blob", "--file", in_path});
  ASSERT_EQ(put.exit_code, 0) << put.err;
  CommandOutput get = Run({"get", "blob", "--out", out_path});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_EQ(get.out, "wrote " + std::to_string(bytes.size()) + " bytes to " + out_path + "\n");
  EXPECT_TRUE(ReadFile(out_path) == bytes);
  CommandOutput to_stdout = Run({"get", "blob"});
  ASSERT_EQ(to_stdout.exit_code, 0) << to_stdout.err;
  EXPECT_TRUE(to_stdout.out == bytes) << to_stdout.out.size() << " bytes";
}

TEST_F(KvctlTest, PutReadsTheValueFromStandardInputWithFileDash) {
  const std::string bytes = BinaryBytes(100000, 7);
  CommandOutput put = Run({"put", "piped", "--file", "-"}, bytes);
  ASSERT_EQ(put.exit_code, 0) << put.err;
  CommandOutput get = Run({"get", "piped"});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_TRUE(get.out == bytes);
}

TEST_F(KvctlTest, AStreamLongerThanMaxStreamBytesIsRefusedAndStoresNothing) {
  const std::string bytes = BinaryBytes(5000, 3);
  CommandOutput over = Run({"put", "big", "--file", "-", "--max-stream-bytes", "4999"}, bytes);
  EXPECT_EQ(over.exit_code, 1);
  EXPECT_EQ(over.err,
            "kvctl: put big: INVALID_PARAMS: standard input holds more than 4999 bytes; raise "
            "--max-stream-bytes (and the agent's --max-arena-bytes) for a larger value\n");
  EXPECT_EQ(Run({"get", "big"}).exit_code, 1);
  CommandOutput exact = Run({"put", "big", "--file", "-", "--max-stream-bytes", "5000"}, bytes);
  ASSERT_EQ(exact.exit_code, 0) << exact.err;
  EXPECT_TRUE(Run({"get", "big"}).out == bytes);
}

TEST_F(KvctlTest, ADeviceThatNeverEndsIsReadOnlyUpToTheBound) {
  CommandOutput zero = Run({"put", "z", "--file", "/dev/zero", "--max-stream-bytes", "3M"});
  EXPECT_EQ(zero.exit_code, 1);
  EXPECT_NE(zero.err.find("/dev/zero holds more than 3145728 bytes"), std::string::npos)
      << zero.err;
  EXPECT_EQ(Run({"put", "z", "--file", "/dev/zero", "--max-stream-bytes", "0"}).exit_code, 2);
}

TEST_F(KvctlTest, PutOfAnExistingKeySaysItExistsExitsZeroAndKeepsTheFirstValue) {
  ASSERT_EQ(Run({"put", "k", "--value", "first"}).exit_code, 0);
  CommandOutput again = Run({"put", "k", "--value", "second"});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, "k exists (kept as it was; a put never replaces a value)\n");
  EXPECT_EQ(Run({"get", "k"}).out, "first");
}

TEST_F(KvctlTest, RmRemovesTheKeyAndThenGetAndRmFailWithObjectNotFound) {
  ASSERT_EQ(Run({"put", "gone", "--value", "x"}).exit_code, 0);
  CommandOutput rm = Run({"rm", "gone"});
  EXPECT_EQ(rm.exit_code, 0) << rm.err;
  EXPECT_EQ(rm.out, "removed gone\n");
  CommandOutput get = Run({"get", "gone"});
  EXPECT_EQ(get.exit_code, 1);
  EXPECT_EQ(get.out, "");
  EXPECT_TRUE(OneLine(get.err)) << get.err;
  EXPECT_EQ(get.err.rfind("kvctl: get gone: OBJECT_NOT_FOUND: ", 0), 0u) << get.err;
  CommandOutput again = Run({"rm", "gone"});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_EQ(again.err.rfind("kvctl: rm gone: OBJECT_NOT_FOUND: ", 0), 0u) << again.err;
}

TEST_F(KvctlTest, RmOfAKeyWithAReadLeaseNeedsForce) {
  ASSERT_EQ(Run({"put", "leased", "--value", "x"}).exit_code, 0);
  ASSERT_EQ(Run({"get", "leased"}).exit_code, 0);  // grants a read lease (10 s by default)
  CommandOutput refused = Run({"rm", "leased"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(OneLine(refused.err)) << refused.err;
  EXPECT_EQ(refused.err.rfind("kvctl: rm leased: OBJECT_HAS_LEASE: ", 0), 0u) << refused.err;
  EXPECT_NE(refused.err.find("kvctl rm --force"), std::string::npos) << refused.err;
  CommandOutput forced = Run({"rm", "leased", "--force"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(Run({"get", "leased"}).exit_code, 1);
}

TEST_F(KvctlTest, LsListsKeySizeAndSessionOfOnlyThePrefixedKeys) {
  ASSERT_EQ(Run({"put", "a/1", "--value", "abc", "--session", "s1"}).exit_code, 0);
  ASSERT_EQ(Run({"put", "a/2", "--value", "hello"}).exit_code, 0);
  ASSERT_EQ(Run({"put", "a/3", "--value", "xy", "--session", "会话-3"}).exit_code, 0);
  ASSERT_EQ(Run({"put", "b/1", "--value", "zzzz", "--session", "s2"}).exit_code, 0);
  CommandOutput ls = Run({"ls", "--prefix", "a/"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  std::vector<std::string> lines = Lines(ls.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"a/1\t3\ts1", "a/2\t5\t-", "a/3\t2\t会话-3"}));
  EXPECT_EQ(Lines(Run({"ls"}).out).size(), 4u);
  EXPECT_EQ(Lines(Run({"ls", "--limit", "2"}).out).size(), 2u);
  EXPECT_EQ(Run({"ls", "--prefix", "c/"}).out, "");
}

TEST_F(KvctlTest, LsPagesThroughMoreKeysThanOnePageAndListsEachOnce) {
  ClientOptions options;
  options.run_dir = agent_.run_dir();
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::set<std::string> want;
  for (int batch = 0; batch < 5; ++batch) {
    std::vector<std::string> keys;
    std::vector<Value> values;
    for (int i = 0; i < 500; ++i) keys.push_back("many/" + std::to_string(batch * 500 + i));
    for (const auto& k : keys) values.emplace_back(std::string_view(k));
    Reply r = (*client)->Put(keys, values);
    ASSERT_TRUE(r.ok()) << r.status.ToString();
    want.insert(keys.begin(), keys.end());
  }
  CommandOutput ls = Run({"ls", "--prefix", "many/"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  std::multiset<std::string> got;
  for (const std::string& line : Lines(ls.out)) got.insert(line.substr(0, line.find('\t')));
  EXPECT_EQ(got.size(), 2500u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
}

TEST_F(KvctlTest, LsEscapesControlBytesSoEveryKeyIsOneLine) {
  ASSERT_EQ(Run({"put", "two\nlines\\", "--value", "v"}).exit_code, 0);
  EXPECT_EQ(Run({"ls"}).out, "two\\x0alines\\x5c\t1\t-\n");
}

TEST_F(KvctlTest, StatGroupsTheAgentsAndTheMastersCountersAndRawCountsThePuts) {
  ASSERT_EQ(Run({"put", "s/1", "--value", "abc"}).exit_code, 0);
  ASSERT_EQ(Run({"put", "s/2", "--value", "defg"}).exit_code, 0);
  CommandOutput raw = Run({"stat", "--raw"});
  ASSERT_EQ(raw.exit_code, 0) << raw.err;
  std::map<std::string, std::string> counters;
  for (const std::string& line : Lines(raw.out)) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    counters[line.substr(0, tab)] = line.substr(tab + 1, line.find('\t', tab + 1) - tab - 1);
  }
  EXPECT_EQ(counters["agent.requests.put"], "2");
  EXPECT_EQ(counters["agent.keys.put"], "2");
  EXPECT_EQ(counters["agent.bytes_to_pool"], "7");
  EXPECT_EQ(counters["agent.master_link"], "1");
  EXPECT_EQ(counters["master.keys"], "2");

  CommandOutput stat = Run({"stat"});
  ASSERT_EQ(stat.exit_code, 0) << stat.err;
  const std::vector<std::string> lines = Lines(stat.out);
  const auto agent = std::find(lines.begin(), lines.end(), "agent");
  const auto master = std::find(lines.begin(), lines.end(), "master");
  ASSERT_NE(agent, lines.end()) << stat.out;
  ASSERT_NE(master, lines.end()) << stat.out;
  EXPECT_LT(agent, master);
  // The op table: a header, then "put" with 2 requests, its batches and 2 keys, aligned.
  const auto header = std::find_if(agent, master, [](const std::string& l) {
    return l.find("requests") != std::string::npos && l.find("batches") != std::string::npos;
  });
  ASSERT_NE(header, master) << stat.out;
  const auto put =
      std::find_if(agent, master, [](const std::string& l) { return l.rfind("  put ", 0) == 0; });
  ASSERT_NE(put, master) << stat.out;
  EXPECT_EQ(put->size(), header->size()) << stat.out;
  EXPECT_EQ(put->substr(put->size() - 2), " 2") << *put;
  EXPECT_NE(stat.out.find("  master_link "), std::string::npos) << stat.out;
  EXPECT_NE(stat.out.find("up: standalone"), std::string::npos) << stat.out;
}

TEST_F(KvctlTest, ASessionIdOf257BytesIsRefusedWithOneLineAndExit1) {
  const std::string session(257, 'x');
  CommandOutput put = Run({"put", "k", "--value", "v", "--session", session});
  EXPECT_EQ(put.exit_code, 1);
  EXPECT_EQ(put.out, "");
  EXPECT_EQ(put.err,
            "kvctl: put k: INVALID_PARAMS: session_ids[0]: session ID is 257 bytes; the limit is "
            "256\n");
  EXPECT_EQ(Run({"get", "k"}).exit_code, 1);  // nothing was stored
  EXPECT_EQ(Run({"put", "k", "--value", "v", "--session", std::string(256, 'x')}).exit_code, 0);
}

TEST_F(KvctlTest, AnEmptyValueIsRefusedWithExit1) {
  CommandOutput put = Run({"put", "k", "--value", ""});
  EXPECT_EQ(put.exit_code, 1);
  EXPECT_EQ(put.err,
            "kvctl: put k: INVALID_PARAMS: the value is empty; a value needs at least 1 "
            "byte\n");
}

TEST_F(KvctlTest, BenchPutsAndGetsThenRemovesEveryKeyItWrote) {
  CommandOutput bench = Run({"bench", "--seconds", "0.2", "--value-bytes", "4KiB",
                             "--keys-per-request", "16", "--session", "bench-s"});
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  EXPECT_EQ(bench.out.rfind("put: 16 x 4.00 KiB per request: ", 0), 0u) << bench.out;
  EXPECT_NE(bench.out.find("\nget: 16 x 4.00 KiB per request: "), std::string::npos) << bench.out;
  // "removed N of N keys under kvctl-bench/<pid>/": every key it wrote went again.
  const size_t removed = bench.out.find("removed ");
  ASSERT_NE(removed, std::string::npos) << bench.out;
  std::istringstream tail(bench.out.substr(removed + 8));
  uint64_t gone = 0, written = 0;
  std::string of;
  tail >> gone >> of >> written;
  EXPECT_GT(written, 0u);
  EXPECT_EQ(gone, written);
  EXPECT_EQ(Run({"ls", "--prefix", "kvctl-bench/"}).out, "");
}

TEST_F(KvctlTest, BenchRefusesAnUnknownOp) {
  CommandOutput bench = Run({"bench", "--op", "scan"});
  EXPECT_EQ(bench.exit_code, 2);
  EXPECT_TRUE(OneLine(bench.err)) << bench.err;
}

TEST_F(KvctlTest, PingSaysTheAgentAnswered) {
  CommandOutput ping = Run({"ping"});
  EXPECT_EQ(ping.exit_code, 0) << ping.err;
  EXPECT_EQ(ping.out.rfind("agent at " + agent_.socket_path() + " answered in ", 0), 0u)
      << ping.out;
  EXPECT_NE(ping.out.find(", agent incarnation "), std::string::npos) << ping.out;
}

TEST(Kvctl, WithoutAnAgentEveryCommandFailsWithAgentUnavailableAndAHint) {
  TempDir empty;
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"ping"}, {"put", "k", "--value", "v"}, {"get", "k"}, {"rm", "k"}, {"ls"}, {"stat"}}) {
    CommandOutput r = Kvctl(empty.path(), args);
    EXPECT_EQ(r.exit_code, 1) << args[0];
    EXPECT_EQ(r.out, "") << args[0];
    EXPECT_TRUE(OneLine(r.err)) << r.err;
    EXPECT_NE(
        r.err.find(": AGENT_UNAVAILABLE: no agent answers on " + empty.path() + "/agent.sock"),
        std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("is kvagent running? start it with `kvagent --run-dir " + empty.path()),
              std::string::npos)
        << r.err;
  }
}

TEST(Kvctl, BadUsagePrintsOneUsageLineAndExits2) {
  TempDir dir;
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"put", "k", "--value", "v", "--bogus"},
           {"put", "k"},
           {"put", "k", "--value", "v", "--file", "f"},
           {"put", "k", "--value", "v", "--replicas", "0"},
           {"put", "k", "--value", "v", "--replicas", "many"},
           {"get"},
           {"get", "k", "extra"},
           {"ls", "--limit", "-1"},
           {"frobnicate"},
           {},
           {"events"},
           {"events", "tail", "--bogus"},
           // 19 digits past int64: once an abort (stoll)
           {"events", "tail", "--from-seq", "9999999999999999999"},
           {"events", "tail", "--from-seq", "-5"}}) {
    CommandOutput r = Kvctl(dir.path(), args);
    const std::string what = args.empty() ? "(no command)" : args[0];
    EXPECT_EQ(r.exit_code, 2) << what << ": " << r.err;
    EXPECT_TRUE(OneLine(r.err)) << r.err;
    EXPECT_EQ(r.out, "") << what;
  }
  CommandOutput put = Kvctl(dir.path(), {"put", "k"});
  EXPECT_EQ(put.err,
            "kvctl put: give exactly one of --value, --file; usage: kvctl [--run-dir DIR] put KEY "
            "(--value STR | --file PATH) [--session ID] [--replicas N] [--hard-pin] "
            "[--soft-pin-ttl-ms N] [--max-stream-bytes N]\n");
}

TEST(Kvctl, SecretGenerateWritesAnOwnerOnlySecretItsFingerprintReadsBack) {
  TempDir dir;
  const std::string path = dir.path() + "/cluster-secret";
  CommandOutput gen = RunCommand({KVCTL_BINARY, "secret", "generate", path});
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  ASSERT_EQ(gen.out.rfind("wrote " + path + ": fingerprint ", 0), 0u) << gen.out;
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  CommandOutput fp = RunCommand({KVCTL_BINARY, "secret", "fingerprint", path});
  EXPECT_EQ(fp.exit_code, 0) << fp.err;
  EXPECT_EQ("wrote " + fp.out, gen.out);
  CommandOutput again = RunCommand({KVCTL_BINARY, "secret", "generate", path});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_TRUE(OneLine(again.err)) << again.err;
  EXPECT_NE(again.err.find("never overwritten"), std::string::npos) << again.err;
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  CommandOutput loose = RunCommand({KVCTL_BINARY, "secret", "fingerprint", path});
  EXPECT_EQ(loose.exit_code, 1);
  EXPECT_NE(loose.err.find("chmod 600 " + path), std::string::npos) << loose.err;
  EXPECT_EQ(RunCommand({KVCTL_BINARY, "secret", "rotate", path}).exit_code, 2);
  EXPECT_EQ(RunCommand({KVCTL_BINARY, "secret", "generate"}).exit_code, 2);
}

TEST(Kvctl, HelpIsPerCommandAndExits0) {
  CommandOutput top = RunCommand({KVCTL_BINARY, "--help"});
  EXPECT_EQ(top.exit_code, 0);
  for (const char* command :
       {"put KEY", "get KEY", "rm KEY", "ls ", "stat", "ping", "events tail"}) {
    EXPECT_NE(top.out.find(command), std::string::npos) << command;
  }
  CommandOutput put = RunCommand({KVCTL_BINARY, "put", "--help"});
  EXPECT_EQ(put.exit_code, 0);
  EXPECT_EQ(put.out.rfind("Usage: kvctl [--run-dir DIR] put KEY (--value STR | --file PATH)", 0),
            0u)
      << put.out;
  EXPECT_NE(put.out.find("exists"), std::string::npos) << put.out;  // the duplicate-put rule
  EXPECT_NE(put.out.find("--session"), std::string::npos);
  CommandOutput tail = RunCommand({KVCTL_BINARY, "events", "tail", "--help"});
  EXPECT_EQ(tail.exit_code, 0);
  EXPECT_NE(tail.out.find("--from-seq"), std::string::npos) << tail.out;
}

}  // namespace
}  // namespace kvagent::testing

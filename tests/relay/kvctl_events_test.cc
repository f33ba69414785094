// `kvctl events tail` (tools/kvctl_events) against a real EventPublisher: readable and JSON
// lines, --session, --count, --from-seq, notices for gaps, exit statuses and their one-line
// reasons.
#include "kvctl_events.h"

#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "event_test_support.h"

namespace kvagent::kvctl {
namespace {

using namespace std::chrono_literals;
using events::testing::TempDir;

struct Tail {
  int status = -1;
  std::string out;
  std::string err;
  std::vector<std::string> lines() const {
    std::vector<std::string> v;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) v.push_back(line);
    return v;
  }
};

Tail RunTail(const EventsTailOptions& options) {
  std::ostringstream out;
  std::ostringstream err;
  Tail t;
  t.status = RunEventsTail(options, out, err);
  t.out = out.str();
  t.err = err.str();
  return t;
}

// Options replaying `publisher`'s history from `from_seq`.
EventsTailOptions HistoryOf(const events::EventPublisher& publisher, int64_t from_seq,
                            uint64_t count) {
  EventsTailOptions o;
  o.endpoint = publisher.endpoint();
  o.replay_endpoint = publisher.replay_endpoint();
  o.from_seq = from_seq;
  o.count = count;
  return o;
}

events::BlockStored FullStored() {
  events::BlockStored e;
  e.block_hashes = {events::BlockHash::Unsigned(~uint64_t{0}), events::BlockHash::Signed(-5)};
  e.parent_block_hash = events::BlockHash::Signed(-42);
  e.token_ids = {1, 2, 3, 4};
  e.block_size = 2;
  e.lora_name = "adapter-ü";
  e.session_id = "sessão-β";
  e.object_key = "model/\"quoted\"\\layer\n0";
  return e;
}

TEST(KvctlEventsTail, FromSeqPrintsOneReadableLinePerEventAndExitsAfterCount) {
  auto publisher = events::testing::StartPublisher(events::testing::TcpPublisherOptions());
  ASSERT_TRUE(publisher);
  events::BlockRemoved removed;
  removed.block_hashes = {events::BlockHash::Unsigned(7)};
  publisher->Publish({events::testing::StoredEvent(1), removed});  // one batch, two events
  publisher->Flush();
  publisher->Publish(events::AllBlocksCleared{});
  publisher->Flush();
  publisher->Publish(events::testing::StoredEvent(2));
  publisher->Flush();
  const Tail t = RunTail(HistoryOf(*publisher, 0, 3));
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_EQ(t.err, "");
  EXPECT_EQ(t.lines(), (std::vector<std::string>{
                           EventLine(0, events::testing::StoredEvent(1)),
                           EventLine(0, removed),
                           EventLine(1, events::AllBlocksCleared{}),
                       }))
      << "exactly 3 events, then exit";
  EXPECT_EQ(t.lines()[0].rfind("seq=0 BlockStored EXTERNAL session=sessão-1 hashes=[1]", 0), 0u)
      << t.lines()[0];
}

TEST(KvctlEventsTail, JsonLinesCarryEveryFieldWithExactHashes) {
  const events::BlockStored stored = FullStored();
  EXPECT_EQ(EventJson(5, 1.5, stored),
            "{\"seq\":5,\"ts\":1.500000,\"type\":\"BlockStored\",\"medium\":\"EXTERNAL\","
            "\"session_id\":\"sessão-β\",\"block_hashes\":[18446744073709551615,-5],"
            "\"parent_block_hash\":-42,\"token_count\":4,\"token_ids\":[1,2,3,4],"
            "\"block_size\":2,\"lora_name\":\"adapter-ü\","
            "\"object_key\":\"model/\\\"quoted\\\"\\\\layer\\u000a0\"}");
  events::BlockStored bare;
  EXPECT_EQ(EventJson(0, 0, bare),
            "{\"seq\":0,\"ts\":0.000000,\"type\":\"BlockStored\",\"medium\":\"EXTERNAL\","
            "\"block_hashes\":[],\"parent_block_hash\":null,\"token_count\":0,\"token_ids\":[],"
            "\"block_size\":0,\"lora_name\":null}");
  events::BlockRemoved removed;
  removed.medium = "DISK";
  removed.object_key = "k";
  EXPECT_EQ(EventJson(1, 2, removed),
            "{\"seq\":1,\"ts\":2.000000,\"type\":\"BlockRemoved\",\"medium\":\"DISK\","
            "\"block_hashes\":[],\"object_key\":\"k\"}");
  EXPECT_EQ(EventJson(2, 3, events::AllBlocksCleared{}),
            "{\"seq\":2,\"ts\":3.000000,\"type\":\"AllBlocksCleared\"}");
}

TEST(KvctlEventsTail, JsonModeAgainstAPublisherPrintsTheDecodedEvents) {
  auto publisher = events::testing::StartPublisher(events::testing::TcpPublisherOptions());
  ASSERT_TRUE(publisher);
  publisher->Publish(FullStored());
  publisher->Flush();
  EventsTailOptions o = HistoryOf(*publisher, 0, 1);
  o.json = true;
  const Tail t = RunTail(o);
  ASSERT_EQ(t.status, 0) << t.err;
  ASSERT_EQ(t.lines().size(), 1u);
  const std::string line = t.lines()[0];
  EXPECT_EQ(line.rfind("{\"seq\":0,\"ts\":", 0), 0u) << line;
  // Everything after the publisher's timestamp is the event as EventJson writes it.
  const std::string expected = EventJson(0, 0, FullStored());
  const std::string tail_of = expected.substr(expected.find(",\"type\""));
  EXPECT_EQ(line.substr(line.find(",\"type\"")), tail_of);
}

TEST(KvctlEventsTail, SessionFilterKeepsOnlyStoredEventsOfThatSession) {
  auto publisher = events::testing::StartPublisher(events::testing::TcpPublisherOptions());
  ASSERT_TRUE(publisher);
  std::vector<events::KvEvent> batch;
  for (uint64_t n = 0; n < 21; ++n)
    batch.push_back(events::testing::StoredEvent(n));  // sessão-0..6
  events::BlockRemoved removed;
  removed.block_hashes = {events::BlockHash::Unsigned(3)};
  batch.push_back(removed);
  publisher->Publish(std::move(batch));
  publisher->Flush();
  EventsTailOptions o = HistoryOf(*publisher, 0, 3);
  o.session = "sessão-3";
  const Tail t = RunTail(o);
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_EQ(t.lines(), (std::vector<std::string>{
                           EventLine(0, events::testing::StoredEvent(3)),
                           EventLine(0, events::testing::StoredEvent(10)),
                           EventLine(0, events::testing::StoredEvent(17)),
                       }));
}

TEST(KvctlEventsTail, HistoryNoLongerRetainedIsPrintedAsAGapNotice) {
  events::EventPublisherOptions po = events::testing::TcpPublisherOptions();
  po.replay_batches = 2;
  auto publisher = events::testing::StartPublisher(po);
  ASSERT_TRUE(publisher);
  events::testing::PublishSingles(*publisher, 0, 5);  // seqs 0..4; only 3 and 4 are kept
  const Tail text = RunTail(HistoryOf(*publisher, 0, 2));
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_EQ(text.lines(), (std::vector<std::string>{
                              "# gap 0..2 not repairable",
                              EventLine(3, events::testing::StoredEvent(3)),
                              EventLine(4, events::testing::StoredEvent(4)),
                          }));
  EventsTailOptions o = HistoryOf(*publisher, 0, 1);
  o.json = true;
  const Tail json = RunTail(o);
  ASSERT_EQ(json.status, 0) << json.err;
  ASSERT_EQ(json.lines().size(), 2u);
  EXPECT_EQ(json.lines()[0], "{\"notice\":\"gap\",\"from\":0,\"to\":2}");
}

TEST(KvctlEventsTail, LiveTailPrintsEventsPublishedAfterItStarted) {
  auto publisher = events::testing::StartPublisher(events::testing::TcpPublisherOptions());
  ASSERT_TRUE(publisher);
  EventsTailOptions o;
  o.endpoint = publisher->endpoint();
  o.replay_endpoint = publisher->replay_endpoint();
  o.count = 5;
  o.timeout_ms = 30000;
  Tail t;
  std::atomic<bool> done{false};
  std::thread tail([&] {
    t = RunTail(o);
    done.store(true);
  });
  // Until the subscription has reached the publisher, batches go nowhere: keep publishing.
  for (uint64_t n = 0; n < 2000 && !done.load(); ++n) {
    events::testing::PublishSingles(*publisher, n, 1);
    std::this_thread::sleep_for(5ms);
  }
  tail.join();
  ASSERT_EQ(t.status, 0) << t.err;
  const std::vector<std::string> lines = t.lines();
  ASSERT_EQ(lines.size(), 5u);
  // Contiguous: the replay socket repairs what the SUB missed after the first batch it saw.
  const uint64_t first = std::stoull(lines[0].substr(4));
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(lines[i], EventLine(first + i, events::testing::StoredEvent(first + i)));
  }
}

TEST(KvctlEventsTail, AnUnboundedTailReturnsZeroWhenStopped) {
  TempDir dir;
  std::atomic<bool> stop{false};
  EventsTailOptions o;
  o.endpoint = dir.Ipc("quiet.sock");
  o.stop = &stop;
  Tail t;
  std::thread tail([&] { t = RunTail(o); });
  stop.store(true);
  tail.join();
  EXPECT_EQ(t.status, 0) << t.err;
  EXPECT_EQ(t.out, "");
}

TEST(KvctlEventsTail, ARefusedSessionIdExitsTwoWithOneLine) {
  EventsTailOptions o;
  o.endpoint = "tcp://127.0.0.1:1";
  o.session = "bad-\xff";
  const Tail t = RunTail(o);
  EXPECT_EQ(t.status, 2);
  EXPECT_EQ(t.out, "");
  EXPECT_NE(t.err.find("refused session ID"), std::string::npos) << t.err;
  EXPECT_EQ(t.err.find('\n'), t.err.size() - 1) << "one line";
  o.session = std::string(257, 's');
  EXPECT_EQ(RunTail(o).status, 2);
}

TEST(KvctlEventsTail, CountWithASilentEndpointExitsOneAfterTheTimeout) {
  TempDir dir;
  EventsTailOptions o;
  o.endpoint = dir.Ipc("nobody.sock");  // SUB connects to nothing: not an error by itself
  o.count = 1;
  o.timeout_ms = 150;
  const Tail t = RunTail(o);
  EXPECT_EQ(t.status, 1);
  EXPECT_EQ(t.err, "kvctl events tail: nothing listens on " + dir.path() +
                       "/nobody.sock yet (no such socket); waiting for it\n"
                       "kvctl events tail: no events from " +
                       o.endpoint + " within 150 ms (0 of 1 printed)\n");
}

// A mistyped --run-dir: the tail says that no agent's socket is there, and still waits for one
// (an agent started after the tail is followed).
TEST(KvctlEventsTail, ARunDirWithoutAnAgentIsNamedWhileTheTailWaits) {
  TempDir dir;
  EventsTailOptions o;
  o.run_dir = dir.path() + "/no-agent-here";
  o.count = 1;
  o.timeout_ms = 150;
  const Tail t = RunTail(o);
  EXPECT_EQ(t.status, 1);
  EXPECT_EQ(t.err.rfind("kvctl events tail: nothing listens on " + o.run_dir +
                            "/events.sock yet (no such socket); waiting for it (is kvagent "
                            "running with --run-dir " +
                            o.run_dir + "?)\n",
                        0),
            0u)
      << t.err;
}

TEST(KvctlEventsTail, BadOptionCombinationsExitTwoAndSayWhatToSet) {
  EventsTailOptions o;
  o.endpoint = "tcp://127.0.0.1:1";
  o.from_seq = 0;  // no replay endpoint given with an explicit --endpoint
  Tail t = RunTail(o);
  EXPECT_EQ(t.status, 2);
  EXPECT_NE(t.err.find("--replay-endpoint"), std::string::npos) << t.err;
  o.from_seq = -1;
  o.endpoint = "tcp://no-port";
  t = RunTail(o);
  EXPECT_EQ(t.status, 2);
  EXPECT_NE(t.err.find("tcp://no-port"), std::string::npos) << t.err;
}

TEST(KvctlEventsTail, MainParsesFlagsUsesTheRunDirAndAnswersHelp) {
  TempDir dir;
  events::EventPublisherOptions po;
  po.endpoint = "ipc://" + dir.path() + "/events.sock";
  po.replay_endpoint = "ipc://" + dir.path() + "/events-replay.sock";
  auto publisher = events::testing::StartPublisher(po);
  ASSERT_TRUE(publisher);
  publisher->Publish(events::testing::StoredEvent(9));
  publisher->Flush();
  auto main = [&](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    std::ostringstream out;
    std::ostringstream err;
    Tail t;
    t.status = EventsTailMain(static_cast<int>(argv.size()), argv.data(), dir.path(), out, err);
    t.out = out.str();
    t.err = err.str();
    return t;
  };
  Tail t = main({"tail", "--from-seq", "0", "--count=1", "--json"});
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_EQ(t.out.rfind("{\"seq\":0,", 0), 0u) << t.out;
  t = main({"tail", "--help"});
  EXPECT_EQ(t.status, 0);
  EXPECT_NE(t.out.find("--session"), std::string::npos);
  EXPECT_NE(t.out.find("BlockStored events written by this session"), std::string::npos);
  t = main({"tail", "--bogus"});
  EXPECT_EQ(t.status, 2);
  EXPECT_NE(t.err.find("--bogus"), std::string::npos) << t.err;
  t = main({"tail", "--count", "-3"});
  EXPECT_EQ(t.status, 2);
  // A seq is 0 or more; leaving --from-seq out means live only.
  for (const char* bad : {"-1", "-7", "x", "1e3"}) {
    t = main({"tail", "--from-seq", bad, "--count=1"});
    EXPECT_EQ(t.status, 2) << bad;
    EXPECT_NE(t.err.find("--from-seq " + std::string(bad) + " is not a seq"), std::string::npos)
        << t.err;
  }
}

TEST(KvctlEventsTail, JsonStringEscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonString("plain"), "\"plain\"");
  EXPECT_EQ(JsonString("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonString(std::string("\x01\t\n\x1f", 4)), "\"\\u0001\\u0009\\u000a\\u001f\"");
  EXPECT_EQ(JsonString("会话-🚀"), "\"会话-🚀\"");
}

}  // namespace
}  // namespace kvagent::kvctl

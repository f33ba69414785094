// The metrics types and the Prometheus text exposition (common/metrics.h).
#include "kvagent/common/metrics.h"

#include <gtest/gtest.h>

#include <thread>

namespace kvagent::metrics {
namespace {

using std::chrono::microseconds;
using std::chrono::nanoseconds;

TEST(LatencyHistogram, PowerOfTwoMicrosecondBuckets) {
  LatencyHistogram h;
  h.Record(nanoseconds(0));            // bucket 0 (<= 1 us)
  h.Record(nanoseconds(1000));         // bucket 0
  h.Record(nanoseconds(1001));         // bucket 1 (<= 2 us)
  h.Record(microseconds(2));           // bucket 1
  h.Record(microseconds(3));           // bucket 2 (<= 4 us)
  h.Record(microseconds(1 << 24));     // bucket 24, the last finite one (~16.8 s)
  h.Record(std::chrono::seconds(60));  // +Inf
  h.Record(nanoseconds(-5));           // clock skew counts as 0
  const LatencyHistogram::Snapshot s = h.Read();
  EXPECT_EQ(s.counts[0], 3u);
  EXPECT_EQ(s.counts[1], 2u);
  EXPECT_EQ(s.counts[2], 1u);
  EXPECT_EQ(s.counts[24], 1u);
  EXPECT_EQ(s.counts[LatencyHistogram::kBuckets], 1u);
  EXPECT_EQ(s.count, 8u);
  EXPECT_EQ(s.sum_ns,
            1000u + 1001u + 2000u + 3000u + (uint64_t{1} << 24) * 1000u + 60'000'000'000u);
  EXPECT_DOUBLE_EQ(LatencyHistogram::UpperBoundSeconds(0), 1e-6);
  EXPECT_DOUBLE_EQ(LatencyHistogram::UpperBoundSeconds(10), 1024e-6);
}

TEST(SingleWriterCounter, ReadFromAnotherThreadWhileWritten) {
  SingleWriterCounter c;
  std::thread writer([&] {
    for (int i = 0; i < 100000; ++i) ++c;
    c += 5;
  });
  uint64_t last = 0;
  while (last < 100005) {
    const uint64_t now = c.load();
    ASSERT_GE(now, last);  // a single writer's counter never goes back
    last = now;
  }
  writer.join();
  EXPECT_EQ(c.load(), 100005u);
}

TEST(Exposition, GroupsFamiliesWithHelpAndType) {
  Exposition e;
  e.Counter("kv_requests_total", "requests", 3, {{"op", "put"}});
  e.Gauge("kv_up", "up", 1);
  e.Counter("kv_requests_total", "requests", 4, {{"op", "get"}});
  EXPECT_EQ(e.Text(),
            "# HELP kv_requests_total requests\n"
            "# TYPE kv_requests_total counter\n"
            "kv_requests_total{op=\"put\"} 3\n"
            "kv_requests_total{op=\"get\"} 4\n"
            "# HELP kv_up up\n"
            "# TYPE kv_up gauge\n"
            "kv_up 1\n");
}

TEST(Exposition, EscapesLabelValuesAndHelp) {
  Exposition e;
  e.Gauge("kv_info", "a \\ b\nc", 1, {{"text", "say \"hi\"\\\n"}});
  EXPECT_EQ(e.Text(),
            "# HELP kv_info a \\\\ b\\nc\n"
            "# TYPE kv_info gauge\n"
            "kv_info{text=\"say \\\"hi\\\"\\\\\\n\"} 1\n");
}

TEST(Exposition, HistogramIsCumulativeInSeconds) {
  LatencyHistogram h;
  h.Record(microseconds(1));
  h.Record(microseconds(3));
  h.Record(std::chrono::seconds(100));
  Exposition e;
  e.Histogram("kv_phase_seconds", "phase", h.Read(), {{"phase", "data"}});
  const std::string text = e.Text();
  EXPECT_NE(text.find("# TYPE kv_phase_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("kv_phase_seconds_bucket{phase=\"data\",le=\"1e-06\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("kv_phase_seconds_bucket{phase=\"data\",le=\"2e-06\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("kv_phase_seconds_bucket{phase=\"data\",le=\"4e-06\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("kv_phase_seconds_bucket{phase=\"data\",le=\"16.777216\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("kv_phase_seconds_bucket{phase=\"data\",le=\"+Inf\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("kv_phase_seconds_sum{phase=\"data\"} 100.000004\n"), std::string::npos);
  EXPECT_NE(text.find("kv_phase_seconds_count{phase=\"data\"} 3\n"), std::string::npos);
}

TEST(FallbackName, MakesAValidMetricName) {
  EXPECT_EQ(FallbackName("kvagent_", "relay.new-thing"), "kvagent_relay_new_thing");
}

}  // namespace
}  // namespace kvagent::metrics

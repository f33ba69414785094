// Metrics: counters and latency histograms that one thread writes and any thread reads, and the
// Prometheus text exposition format (version 0.0.4) they are served in.
//
// The writer is the thread that does the work (the agent's ring service, the master's loop): it
// updates with relaxed atomic loads and stores, no read-modify-write, so an update costs what a
// plain increment costs. The reader (the metrics HTTP thread) loads the same atomics; it may see
// a histogram's count and its buckets from slightly different moments, never a torn value.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvagent::metrics {

// A counter with exactly one writing thread; readable from any thread.
class SingleWriterCounter {
 public:
  SingleWriterCounter() = default;
  SingleWriterCounter(const SingleWriterCounter&) = delete;
  SingleWriterCounter& operator=(const SingleWriterCounter&) = delete;

  SingleWriterCounter& operator+=(uint64_t n) {
    value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    return *this;
  }
  SingleWriterCounter& operator++() { return *this += 1; }
  uint64_t load() const { return value_.load(std::memory_order_relaxed); }
  operator uint64_t() const { return load(); }  // NOLINT: reads like the plain integer it was

 private:
  std::atomic<uint64_t> value_{0};
};

// A latency histogram with power-of-two buckets from 1 us to about 16.8 s (upper bounds 2^i us,
// i = 0..24) plus +Inf. One writing thread; readable from any thread.
class LatencyHistogram {
 public:
  static constexpr size_t kBuckets = 25;  // finite upper bounds; one more for +Inf

  LatencyHistogram() = default;
  LatencyHistogram(const LatencyHistogram&) = delete;
  LatencyHistogram& operator=(const LatencyHistogram&) = delete;

  // Records one observation (negative durations count as 0).
  void Record(std::chrono::nanoseconds d);

  struct Snapshot {
    std::array<uint64_t, kBuckets + 1> counts{};  // per bucket, not cumulative; last: +Inf
    uint64_t count = 0;
    uint64_t sum_ns = 0;
  };
  Snapshot Read() const;

  // Upper bound of finite bucket `i` in seconds.
  static double UpperBoundSeconds(size_t i);

 private:
  std::array<std::atomic<uint64_t>, kBuckets + 1> counts_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

using Labels = std::vector<std::pair<std::string, std::string>>;

// Builds one exposition: samples are grouped per metric family (HELP and TYPE once, samples in
// the order added). Family names must be valid Prometheus names ([a-zA-Z_:][a-zA-Z0-9_:]*);
// label values are escaped here.
class Exposition {
 public:
  void Counter(std::string_view name, std::string_view help, uint64_t value,
               const Labels& labels = {});
  void Gauge(std::string_view name, std::string_view help, double value, const Labels& labels = {});
  // `name` without the _bucket/_sum/_count suffixes, in seconds.
  void Histogram(std::string_view name, std::string_view help,
                 const LatencyHistogram::Snapshot& snapshot, const Labels& labels = {});

  // The text (Content-Type: text/plain; version=0.0.4).
  std::string Text() const;

 private:
  struct Family {
    std::string name;
    std::string help;
    std::string type;
    std::string samples;  // lines, each ending in '\n'
  };
  Family& Get(std::string_view name, std::string_view help, std::string_view type);
  std::vector<Family> families_;
};

// `prefix` + `text` with every character outside [a-zA-Z0-9] as '_': a valid metric name for a
// counter that has no stable name yet ("kvagent_" + "relay.new_thing").
std::string FallbackName(std::string_view prefix, std::string_view text);

}  // namespace kvagent::metrics

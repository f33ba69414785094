#include "kvagent/common/metrics.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace kvagent::metrics {
namespace {

std::string EscapeLabel(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// `{a="x",b="y"}` (empty when there are no labels), with `extra` appended last.
std::string LabelText(const Labels& labels, std::string_view extra_name = {},
                      std::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    out += (first ? "" : ",") + k + "=\"" + EscapeLabel(v) + "\"";
    first = false;
  }
  if (!extra_name.empty()) {
    out += (first ? "" : ",") + std::string(extra_name) + "=\"" + std::string(extra_value) + "\"";
  }
  return out + "}";
}

// Shortest exact text of a double as Prometheus reads it ("+Inf", "NaN", "1e-06", "3").
std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  // Prefer the short form when it reads back the same.
  for (int precision = 1; precision < 17; ++precision) {
    char shorter[40];
    std::snprintf(shorter, sizeof(shorter), "%.*g", precision, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

}  // namespace

void LatencyHistogram::Record(std::chrono::nanoseconds d) {
  const uint64_t ns = d.count() > 0 ? static_cast<uint64_t>(d.count()) : 0;
  // Bucket i holds (2^(i-1) us, 2^i us]; bucket 0 everything up to 1 us.
  const uint64_t us_ceil = (ns + 999) / 1000;
  size_t i = us_ceil <= 1 ? 0 : static_cast<size_t>(std::bit_width(us_ceil - 1));
  if (i > kBuckets) i = kBuckets;
  auto bump = [](std::atomic<uint64_t>& a, uint64_t n) {
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  };
  bump(counts_[i], 1);
  bump(sum_ns_, ns);
  bump(count_, 1);
}

LatencyHistogram::Snapshot LatencyHistogram::Read() const {
  Snapshot s;
  for (size_t i = 0; i < counts_.size(); ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
  }
  s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
  // The count is the buckets' total, so the exposition stays consistent (+Inf == _count).
  for (uint64_t c : s.counts) s.count += c;
  return s;
}

double LatencyHistogram::UpperBoundSeconds(size_t i) {
  return static_cast<double>(uint64_t{1} << i) * 1e-6;
}

std::string FallbackName(std::string_view prefix, std::string_view text) {
  std::string out(prefix);
  for (char c : text) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    out += ok ? c : '_';
  }
  return out;
}

Exposition::Family& Exposition::Get(std::string_view name, std::string_view help,
                                    std::string_view type) {
  for (Family& f : families_) {
    if (f.name == name) return f;
  }
  families_.push_back(Family{std::string(name), std::string(help), std::string(type), ""});
  return families_.back();
}

void Exposition::Counter(std::string_view name, std::string_view help, uint64_t value,
                         const Labels& labels) {
  Family& f = Get(name, help, "counter");
  f.samples += std::string(name) + LabelText(labels) + " " + std::to_string(value) + "\n";
}

void Exposition::Gauge(std::string_view name, std::string_view help, double value,
                       const Labels& labels) {
  Family& f = Get(name, help, "gauge");
  f.samples += std::string(name) + LabelText(labels) + " " + Number(value) + "\n";
}

void Exposition::Histogram(std::string_view name, std::string_view help,
                           const LatencyHistogram::Snapshot& s, const Labels& labels) {
  Family& f = Get(name, help, "histogram");
  const std::string base(name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < LatencyHistogram::kBuckets; ++i) {
    cumulative += s.counts[i];
    f.samples += base + "_bucket" +
                 LabelText(labels, "le", Number(LatencyHistogram::UpperBoundSeconds(i))) + " " +
                 std::to_string(cumulative) + "\n";
  }
  cumulative += s.counts[LatencyHistogram::kBuckets];
  f.samples +=
      base + "_bucket" + LabelText(labels, "le", "+Inf") + " " + std::to_string(cumulative) + "\n";
  f.samples +=
      base + "_sum" + LabelText(labels) + " " + Number(static_cast<double>(s.sum_ns) * 1e-9) + "\n";
  f.samples += base + "_count" + LabelText(labels) + " " + std::to_string(s.count) + "\n";
}

std::string Exposition::Text() const {
  std::string out;
  for (const Family& f : families_) {
    out += "# HELP " + f.name + " " + EscapeHelp(f.help) + "\n";
    out += "# TYPE " + f.name + " " + f.type + "\n";
    out += f.samples;
  }
  return out;
}

}  // namespace kvagent::metrics

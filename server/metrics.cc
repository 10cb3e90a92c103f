#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace replayd {

namespace metrics_text {

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
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

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
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

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[32];
  auto [end, ec] = std::to_chars(text, text + sizeof text, value);
  return std::string(text, end);
}

}  // namespace metrics_text

namespace {

// [a-zA-Z_:][a-zA-Z0-9_:]* for metric names; labels the same without ':' and not "__..."
bool ValidName(absl::string_view name, bool label) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  if (label && absl::StartsWith(name, "__")) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return absl::ascii_isalnum(c) || c == '_' || (!label && c == ':'); });
}

void CheckNames(absl::string_view name, const std::vector<std::string>& labels, MetricType type) {
  bool ok = ValidName(name, false) && (type != MetricType::kCounter || absl::EndsWith(name, "_total"));
  for (const std::string& l : labels) ok = ok && ValidName(l, true) && (type != MetricType::kHistogram || l != "le");
  if (!ok) {
    std::fprintf(stderr, "metric %s: invalid name or label names\n", std::string(name).c_str());
    std::abort();
  }
}

// `{a="x",b="y"` without the closing brace, or empty without labels and `extra`.
void WriteLabels(std::string& out, const std::vector<std::string>& names, const std::vector<std::string>& values,
                 absl::string_view extra_name = {}, absl::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return;
  out += '{';
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, names[i], "=\"", metrics_text::EscapeLabelValue(values[i]), "\"");
  }
  if (!extra_name.empty()) absl::StrAppend(&out, names.empty() ? "" : ",", extra_name, "=\"", extra_value, "\"");
  out += '}';
}

void WriteSample(std::string& out, absl::string_view name, const std::vector<std::string>& names,
                 const std::vector<std::string>& values, double value) {
  absl::StrAppend(&out, name);
  WriteLabels(out, names, values);
  absl::StrAppend(&out, " ", metrics_text::FormatValue(value), "\n");
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds.size() + 1]) {
  for (size_t i = 0; i <= bounds.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(total);
  }
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> bounds = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                                             0.0025,  0.005,    0.01,    0.025,  0.05,    0.1,    0.25,
                                             0.5,     1,        2.5,     5,      10,     30,     60};
  return bounds;
}

template <typename Series>
Series& Family<Series>::With(absl::Span<const absl::string_view> values) {
  std::vector<std::string> key(values.begin(), values.end());
  key.resize(labels_.size());  // a programming error otherwise; missing values are empty
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Series>& series = series_[std::move(key)];
  if (!series) {
    if constexpr (std::is_same_v<Series, Histogram>) {
      series = std::make_unique<Histogram>(bounds_);
    } else {
      series = std::make_unique<Series>();
    }
  }
  return *series;
}

template <typename Series>
void Family<Series>::Write(std::string& out) const {
  absl::StrAppend(&out, "# HELP ", name_, " ", metrics_text::EscapeHelp(help_), "\n# TYPE ", name_, " ",
                  TypeName(type_), "\n");
  absl::MutexLock lock(&mu_);
  for (const auto& [values, series] : series_) {
    if constexpr (std::is_same_v<Series, Histogram>) {
      const Histogram::Snapshot s = series->snapshot();
      const std::string bucket = absl::StrCat(name_, "_bucket");
      for (size_t i = 0; i < s.cumulative.size(); ++i) {
        out += bucket;
        const std::string le = i < bounds_.size() ? metrics_text::FormatValue(bounds_[i]) : "+Inf";
        WriteLabels(out, labels_, values, "le", le);
        absl::StrAppend(&out, " ", s.cumulative[i], "\n");
      }
      WriteSample(out, absl::StrCat(name_, "_sum"), labels_, values, s.sum);
      WriteSample(out, absl::StrCat(name_, "_count"), labels_, values, static_cast<double>(s.count));
    } else {
      WriteSample(out, name_, labels_, values, series->value());
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

Family<Counter>& MetricsRegistry::AddCounter(std::string name, std::string help, std::vector<std::string> labels) {
  CheckNames(name, labels, MetricType::kCounter);
  absl::MutexLock lock(&mu_);
  Entry& e = families_.emplace_back();
  e.counter.reset(new Family<Counter>(std::move(name), std::move(help), MetricType::kCounter, std::move(labels)));
  return *e.counter;
}

Family<Gauge>& MetricsRegistry::AddGauge(std::string name, std::string help, std::vector<std::string> labels) {
  CheckNames(name, labels, MetricType::kGauge);
  absl::MutexLock lock(&mu_);
  Entry& e = families_.emplace_back();
  e.gauge.reset(new Family<Gauge>(std::move(name), std::move(help), MetricType::kGauge, std::move(labels)));
  return *e.gauge;
}

Family<Histogram>& MetricsRegistry::AddHistogram(std::string name, std::string help, std::vector<std::string> labels,
                                                 std::vector<double> bounds) {
  CheckNames(name, labels, MetricType::kHistogram);
  std::sort(bounds.begin(), bounds.end());
  absl::MutexLock lock(&mu_);
  Entry& e = families_.emplace_back();
  e.histogram.reset(new Family<Histogram>(std::move(name), std::move(help), MetricType::kHistogram,
                                          std::move(labels), std::move(bounds)));
  return *e.histogram;
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::Text() {
  absl::MutexLock lock(&mu_);
  for (const auto& collect : collectors_) collect();
  std::string out;
  for (const Entry& e : families_) {
    if (e.counter) e.counter->Write(out);
    if (e.gauge) e.gauge->Write(out);
    if (e.histogram) e.histogram->Write(out);
  }
  return out;
}

}  // namespace replayd

// A small metrics registry written in Prometheus' text exposition format (version 0.0.4):
// counters, gauges and histograms with fixed buckets, each a family of series told apart
// by the values of the family's labels.
//
// A series is found once (Family::With, a lookup under the family's mutex) and then kept:
// series are never removed, so a reference stays valid as long as the registry, and
// updating one is a few relaxed atomic operations, with no lock. Values that already live
// elsewhere (memory in use, cache counters) are copied into their series at scrape time by
// the registry's collectors instead of being counted twice.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_SERVER_METRICS_H_
#define REPLAYD_SERVER_METRICS_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace replayd {

// A value that only goes up (reset only by a restart).
class Counter {
 public:
  void Add(double amount = 1) { value_.fetch_add(amount, std::memory_order_relaxed); }
  // For a counter copied at scrape time from a source that counts by itself.
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted in buckets by upper bound, with their sum and count.
class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, ascending; a +Inf bucket follows them. Must
  // outlive the histogram (its family holds them).
  explicit Histogram(const std::vector<double>& bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;  // equals cumulative.back()
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double>& bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bound, then +Inf; not cumulative
  std::atomic<double> sum_{0};
};

// Bucket bounds in seconds from 10 microseconds to 60 seconds: an operation's latency.
const std::vector<double>& LatencyBuckets();

enum class MetricType { kCounter, kGauge, kHistogram };

// The series of one metric name: one per combination of label values.
template <typename Series>
class Family {
 public:
  // The series with `values` (one per label name, in order), made on first use.
  Series& With(absl::Span<const absl::string_view> values);
  Series& With(std::initializer_list<absl::string_view> values) {
    return With(absl::Span<const absl::string_view>(values.begin(), values.size()));
  }

 private:
  friend class MetricsRegistry;
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> labels,
         std::vector<double> bounds = {})
      : name_(std::move(name)), help_(std::move(help)), type_(type), labels_(std::move(labels)),
        bounds_(std::move(bounds)) {}
  void Write(std::string& out) const;

  const std::string name_, help_;
  const MetricType type_;
  const std::vector<std::string> labels_;
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Series>> series_ ABSL_GUARDED_BY(mu_);
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // New families. `name` and `labels` must be valid Prometheus names (checked: a bad one
  // is a programming error and aborts); a counter's name ends in _total. The family lives
  // as long as the registry.
  Family<Counter>& AddCounter(std::string name, std::string help, std::vector<std::string> labels = {});
  Family<Gauge>& AddGauge(std::string name, std::string help, std::vector<std::string> labels = {});
  Family<Histogram>& AddHistogram(std::string name, std::string help, std::vector<std::string> labels,
                                  std::vector<double> bounds);

  // Runs before every Text, one scrape at a time: copies values kept elsewhere into series.
  void AddCollector(std::function<void()> collect);

  // Runs the collectors, then writes every family in the order added, its series sorted by
  // label values: HELP and TYPE lines, then one line per series (a histogram: its buckets,
  // cumulative, ending with le="+Inf", then _sum and _count).
  std::string Text();

 private:
  struct Entry {
    std::unique_ptr<Family<Counter>> counter;
    std::unique_ptr<Family<Gauge>> gauge;
    std::unique_ptr<Family<Histogram>> histogram;
  };
  absl::Mutex mu_;  // held through a scrape
  std::vector<Entry> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

// Helpers of the text format, exposed for tests.
namespace metrics_text {
// A label value with backslash, double quote and line feed escaped.
std::string EscapeLabelValue(absl::string_view value);
// A HELP text with backslash and line feed escaped.
std::string EscapeHelp(absl::string_view help);
// A sample value: the shortest text that reads back as `value`; +Inf, -Inf, NaN.
std::string FormatValue(double value);
}  // namespace metrics_text

}  // namespace replayd

#endif  // REPLAYD_SERVER_METRICS_H_

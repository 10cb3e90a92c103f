// `replayctl stats`: the daemon's Prometheus metrics (its --metrics_listen endpoint) read
// back and summed up for a person: per device its memory, queue and sessions, and per
// tenant on it the replays and launches with their p50 and p99 latency, estimated from
// the histograms' buckets as Prometheus' histogram_quantile does.
#ifndef REPLAYD_CLIENT_METRICS_SUMMARY_H_
#define REPLAYD_CLIENT_METRICS_SUMMARY_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace replayd::client {

// One sample line of the text exposition format.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;  // unescaped values
  double value = 0;
};

// The samples of `text`, in order; comments and blank lines skipped. INVALID_ARGUMENT
// naming the line for one that does not parse.
absl::StatusOr<std::vector<Sample>> ParseExposition(absl::string_view text);

// The `q` quantile (0 to 1) of a histogram from its cumulative buckets (upper bound,
// count), ascending and ending with +Inf: linear within the bucket it falls in, the
// largest finite bound when it falls in +Inf, NaN without observations.
double HistogramQuantile(double q, const std::vector<std::pair<double, double>>& buckets);

// The readable summary of `samples`.
std::string Summarize(const std::vector<Sample>& samples);

}  // namespace replayd::client

#endif  // REPLAYD_CLIENT_METRICS_SUMMARY_H_

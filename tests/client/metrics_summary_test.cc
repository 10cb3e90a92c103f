// replayctl stats' reading of the metrics: the text format parsed back (escapes undone),
// quantiles from histogram buckets, and the summary's figures.
#include "client/metrics_summary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "absl/strings/match.h"
#include "server/metrics.h"
#include "tests/support/status_macros.h"

namespace replayd::client {
namespace {

TEST(MetricsSummaryTest, ParsesWhatTheRegistryWritesWithLabelValuesUnescaped) {
  MetricsRegistry registry;
  registry.AddCounter("test_total", "n", {"tenant"}).With({"we\"ird\\te\nnant"}).Add(7);
  registry.AddHistogram("test_seconds", "h", {}, {1}).With({}).Observe(2);
  ASSERT_OK_AND_ASSIGN(std::vector<Sample> samples, ParseExposition(registry.Text()));
  ASSERT_EQ(samples.size(), 5u);
  EXPECT_EQ(samples[0].name, "test_total");
  EXPECT_EQ(samples[0].labels.at("tenant"), "we\"ird\\te\nnant");
  EXPECT_EQ(samples[0].value, 7);
  EXPECT_EQ(samples[2].name, "test_seconds_bucket");
  EXPECT_EQ(samples[2].labels.at("le"), "+Inf");
  EXPECT_EQ(samples[2].value, 1);
  EXPECT_EQ(samples[4].name, "test_seconds_count");
}

TEST(MetricsSummaryTest, ALineThatDoesNotParseIsNamed) {
  EXPECT_EQ(ParseExposition("ok 1\nbad{x=\"1\" 2\n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(ParseExposition("ok 1\nx 1z\n").status().message(), "line 2"));
}

TEST(MetricsSummaryTest, QuantilesInterpolateWithinTheirBucket) {
  // 10 observations: 4 at most 1, 4 more at most 2, 2 above 4.
  const std::vector<std::pair<double, double>> buckets = {{1, 4}, {2, 8}, {4, 8}, {INFINITY, 10}};
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.2, buckets), 0.5);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.5, buckets), 1.25);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.99, buckets), 4);  // in +Inf: the largest finite bound
  EXPECT_TRUE(std::isnan(HistogramQuantile(0.5, {{1, 0}, {INFINITY, 0}})));
}

TEST(MetricsSummaryTest, SummarySaysEachDevicesMemoryAndEachTenantsReplays) {
  const char* text =
      "replayd_device_memory_total_bytes{device=\"cpu:0\"} 1073741824\n"
      "replayd_device_memory_used_bytes{device=\"cpu:0\"} 1048576\n"
      "replayd_device_memory_free_bytes{device=\"cpu:0\"} 1072693248\n"
      "replayd_open_sessions{device=\"cpu:0\",tenant=\"alice\"} 2\n"
      "replayd_replays_total{device=\"cpu:0\",tenant=\"alice\"} 40\n"
      "replayd_replay_duration_seconds_bucket{device=\"cpu:0\",tenant=\"alice\",le=\"0.001\"} 20\n"
      "replayd_replay_duration_seconds_bucket{device=\"cpu:0\",tenant=\"alice\",le=\"0.002\"} 40\n"
      "replayd_replay_duration_seconds_bucket{device=\"cpu:0\",tenant=\"alice\",le=\"+Inf\"} 40\n"
      "replayd_requests_total{method=\"Replayd/ReplayGraph\",code=\"OK\",tenant=\"alice\"} 40\n"
      "replayd_requests_total{method=\"Replayd/ReplayGraph\",code=\"NOT_FOUND\",tenant=\"alice\"} 3\n";
  ASSERT_OK_AND_ASSIGN(std::vector<Sample> samples, ParseExposition(text));
  const std::string summary = Summarize(samples);
  EXPECT_TRUE(absl::StrContains(summary, "cpu:0: memory 1.0 MiB used, 1023.0 MiB free of 1.0 GiB")) << summary;
  // p50 at the first bucket's bound, 1 ms; p99 in the second, 1.98 ms.
  EXPECT_TRUE(std::regex_search(summary, std::regex(R"(alice +2 +0 B +40 +1\.00ms +1\.98ms )"))) << summary;
  EXPECT_TRUE(std::regex_search(summary, std::regex(R"(alice +43 +3\n)"))) << summary;
}

}  // namespace
}  // namespace replayd::client

// The metrics registry's text exposition: names, HELP and TYPE lines, label escaping,
// histogram buckets, and the metrics address.
#include "server/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "server/metrics_server.h"
#include "tests/support/status_macros.h"

namespace replayd {
namespace {

TEST(MetricsTextTest, LabelValuesEscapeBackslashQuoteAndLineFeed) {
  EXPECT_EQ(metrics_text::EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(metrics_text::EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(metrics_text::EscapeHelp("say \"x\"\\\n"), "say \"x\"\\\\\\n");
}

TEST(MetricsTextTest, ValuesAreShortestAndSpecialValuesSpelledAsPrometheusReadsThem) {
  EXPECT_EQ(metrics_text::FormatValue(0), "0");
  EXPECT_EQ(metrics_text::FormatValue(42), "42");
  EXPECT_EQ(metrics_text::FormatValue(0.1), "0.1");
  EXPECT_EQ(metrics_text::FormatValue(1e21), "1e+21");
  EXPECT_EQ(metrics_text::FormatValue(INFINITY), "+Inf");
  EXPECT_EQ(metrics_text::FormatValue(-INFINITY), "-Inf");
  EXPECT_EQ(metrics_text::FormatValue(NAN), "NaN");
}

TEST(MetricsRegistryTest, CountersAndGaugesWriteHelpTypeAndSortedSeries) {
  MetricsRegistry registry;
  Family<Counter>& calls = registry.AddCounter("test_calls_total", "calls \\ made\nby tenant", {"tenant", "code"});
  Family<Gauge>& depth = registry.AddGauge("test_depth", "depth");
  calls.With({"zed", "OK"}).Add();
  calls.With({"a\"b", "OK"}).Add(2);
  calls.With({"zed", "OK"}).Add(3);
  depth.With({}).Set(-1.5);
  EXPECT_EQ(registry.Text(),
            "# HELP test_calls_total calls \\\\ made\\nby tenant\n"
            "# TYPE test_calls_total counter\n"
            "test_calls_total{tenant=\"a\\\"b\",code=\"OK\"} 2\n"
            "test_calls_total{tenant=\"zed\",code=\"OK\"} 4\n"
            "# HELP test_depth depth\n"
            "# TYPE test_depth gauge\n"
            "test_depth -1.5\n");
}

TEST(MetricsRegistryTest, HistogramBucketsAreCumulativeEndWithInfAndCarrySumAndCount) {
  MetricsRegistry registry;
  Family<Histogram>& latency = registry.AddHistogram("test_seconds", "latency", {"op"}, {0.5, 0.25, 1});
  Histogram& h = latency.With({"replay"});
  for (double v : {0.125, 0.25, 0.375, 0.75, 5.0}) h.Observe(v);
  EXPECT_EQ(registry.Text(),
            "# HELP test_seconds latency\n"
            "# TYPE test_seconds histogram\n"
            "test_seconds_bucket{op=\"replay\",le=\"0.25\"} 2\n"  // an observation on a bound counts in it
            "test_seconds_bucket{op=\"replay\",le=\"0.5\"} 3\n"
            "test_seconds_bucket{op=\"replay\",le=\"1\"} 4\n"
            "test_seconds_bucket{op=\"replay\",le=\"+Inf\"} 5\n"
            "test_seconds_sum{op=\"replay\"} 6.5\n"
            "test_seconds_count{op=\"replay\"} 5\n");
}

TEST(MetricsRegistryTest, ConcurrentUpdatesAreAllCounted) {
  MetricsRegistry registry;
  Counter& c = registry.AddCounter("test_total", "n").With({});
  Histogram& h = registry.AddHistogram("test_h_seconds", "h", {}, LatencyBuckets()).With({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.Add();
        h.Observe(0.001);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
  const Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.count, 40000u);
  EXPECT_NEAR(s.sum, 40.0, 1e-6);
}

TEST(MetricsRegistryTest, CollectorsRunBeforeEachScrape) {
  MetricsRegistry registry;
  Gauge& g = registry.AddGauge("test_scrapes", "scrapes").With({});
  int scrapes = 0;
  registry.AddCollector([&] { g.Set(++scrapes); });
  EXPECT_TRUE(absl::StrContains(registry.Text(), "test_scrapes 1\n"));
  EXPECT_TRUE(absl::StrContains(registry.Text(), "test_scrapes 2\n"));
}

TEST(MetricsRegistryDeathTest, ACounterWithoutTotalIsAProgrammingError) {
  MetricsRegistry registry;
  EXPECT_DEATH(registry.AddCounter("test_calls", "calls"), "invalid name");
  EXPECT_DEATH(registry.AddGauge("test-depth", "depth"), "invalid name");
  EXPECT_DEATH(registry.AddHistogram("test_seconds", "h", {"le"}, {1}), "invalid name");
}

TEST(MetricsAddressTest, APortAloneIsLoopback) {
  ASSERT_OK_AND_ASSIGN(auto bare, ParseMetricsAddress("9464"));
  EXPECT_EQ(bare, std::make_pair(std::string("127.0.0.1"), 9464));
  ASSERT_OK_AND_ASSIGN(auto colon, ParseMetricsAddress(":9464"));
  EXPECT_EQ(colon, std::make_pair(std::string("127.0.0.1"), 9464));
  ASSERT_OK_AND_ASSIGN(auto any, ParseMetricsAddress("0.0.0.0:80"));
  EXPECT_EQ(any, std::make_pair(std::string("0.0.0.0"), 80));
  ASSERT_OK_AND_ASSIGN(auto v6, ParseMetricsAddress("[::1]:0"));
  EXPECT_EQ(v6, std::make_pair(std::string("::1"), 0));
  for (const char* bad : {"", "host:", "x", "127.0.0.1:65536", ":-1", "a:b"})
    EXPECT_EQ(ParseMetricsAddress(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
}

}  // namespace
}  // namespace replayd

#include "client/metrics_summary.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace replayd::client {

namespace {

bool NameChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == ':'; }

absl::Status LineError(size_t line, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("metrics line ", line, ": ", why));
}

// Parses `{a="x",b="y"}` at the start of `rest` into `labels`, consuming it.
absl::Status ParseLabels(absl::string_view& rest, std::map<std::string, std::string>& labels, size_t line) {
  rest.remove_prefix(1);  // '{'
  for (;;) {
    rest = absl::StripLeadingAsciiWhitespace(rest);
    if (!rest.empty() && rest[0] == '}') {
      rest.remove_prefix(1);
      return absl::OkStatus();
    }
    size_t n = 0;
    while (n < rest.size() && NameChar(rest[n])) ++n;
    if (n == 0 || n + 1 >= rest.size() || rest[n] != '=' || rest[n + 1] != '"') return LineError(line, "bad label");
    std::string name(rest.substr(0, n)), value;
    size_t i = n + 2;
    for (; i < rest.size() && rest[i] != '"'; ++i) {
      if (rest[i] != '\\') {
        value += rest[i];
        continue;
      }
      if (++i == rest.size()) break;
      value += rest[i] == 'n' ? '\n' : rest[i];
    }
    if (i >= rest.size()) return LineError(line, "unterminated label value");
    labels[name] = value;
    rest.remove_prefix(i + 1);
    rest = absl::StripLeadingAsciiWhitespace(rest);
    if (!rest.empty() && rest[0] == ',') rest.remove_prefix(1);
  }
}

// Sums of one (device, tenant) pair, or of a device.
struct Figures {
  double sessions = 0, memory = 0, replays = 0, launches = 0, device_seconds = 0;
  std::vector<std::pair<double, double>> replay_buckets, launch_buckets;
};

std::string Bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f %s", bytes, units[u]) : absl::StrFormat("%.1f %s", bytes, units[u]);
}

std::string Latency(double seconds) {
  if (std::isnan(seconds)) return "-";
  if (seconds < 1e-3) return absl::StrFormat("%.0fus", seconds * 1e6);
  if (seconds < 1) return absl::StrFormat("%.2fms", seconds * 1e3);
  return absl::StrFormat("%.2fs", seconds);
}

double Le(const Sample& s) {
  auto it = s.labels.find("le");
  return it == s.labels.end() ? std::numeric_limits<double>::quiet_NaN() : std::strtod(it->second.c_str(), nullptr);
}

}  // namespace

absl::StatusOr<std::vector<Sample>> ParseExposition(absl::string_view text) {
  std::vector<Sample> out;
  size_t number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t n = 0;
    while (n < line.size() && NameChar(line[n])) ++n;
    if (n == 0) return LineError(number, "no metric name");
    s.name = std::string(line.substr(0, n));
    absl::string_view rest = line.substr(n);
    if (!rest.empty() && rest[0] == '{')
      if (absl::Status st = ParseLabels(rest, s.labels, number); !st.ok()) return st;
    rest = absl::StripLeadingAsciiWhitespace(rest);
    const std::string value(rest.substr(0, rest.find(' ')));
    char* end = nullptr;
    s.value = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size()) return LineError(number, "bad value");
    out.push_back(std::move(s));
  }
  return out;
}

double HistogramQuantile(double q, const std::vector<std::pair<double, double>>& buckets) {
  if (buckets.empty() || buckets.back().second <= 0) return std::numeric_limits<double>::quiet_NaN();
  const double rank = q * buckets.back().second;
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i].second < rank) continue;
    if (std::isinf(buckets[i].first)) return i == 0 ? 0 : buckets[i - 1].first;
    const double lower = i == 0 ? 0 : buckets[i - 1].first;
    const double below = i == 0 ? 0 : buckets[i - 1].second;
    const double in = buckets[i].second - below;
    return in <= 0 ? buckets[i].first : lower + (buckets[i].first - lower) * (rank - below) / in;
  }
  return buckets.back().first;
}

std::string Summarize(const std::vector<Sample>& samples) {
  struct Device {
    double total = 0, used = 0, free = 0, queue = 0;
    std::map<std::string, Figures> tenants;
  };
  std::map<std::string, Device> devices;
  std::map<std::string, std::pair<double, double>> requests;  // tenant: calls, failed
  auto label = [](const Sample& s, const char* name) {
    auto it = s.labels.find(name);
    return it == s.labels.end() ? std::string() : it->second;
  };
  for (const Sample& s : samples) {
    const std::string device = label(s, "device"), tenant = label(s, "tenant");
    if (s.name == "replayd_requests_total") {
      auto& [calls, failed] = requests[tenant.empty() ? "(unauthenticated)" : tenant];
      calls += s.value;
      if (label(s, "code") != "OK") failed += s.value;
      continue;
    }
    if (device.empty()) continue;
    Device& d = devices[device];
    if (s.name == "replayd_device_memory_total_bytes") d.total = s.value;
    if (s.name == "replayd_device_memory_used_bytes") d.used = s.value;
    if (s.name == "replayd_device_memory_free_bytes") d.free = s.value;
    if (s.name == "replayd_scheduler_queue_depth") d.queue = s.value;
    if (tenant.empty()) continue;
    Figures& f = d.tenants[tenant];
    if (s.name == "replayd_open_sessions") f.sessions = s.value;
    if (s.name == "replayd_session_memory_bytes") f.memory = s.value;
    if (s.name == "replayd_replays_total") f.replays = s.value;
    if (s.name == "replayd_launches_total") f.launches = s.value;
    if (s.name == "replayd_device_seconds_total") f.device_seconds = s.value;
    if (s.name == "replayd_replay_duration_seconds_bucket") f.replay_buckets.push_back({Le(s), s.value});
    if (s.name == "replayd_launch_duration_seconds_bucket") f.launch_buckets.push_back({Le(s), s.value});
  }
  std::string out;
  for (auto& [id, d] : devices) {
    absl::StrAppend(&out, absl::StrFormat("%s: memory %s used, %s free of %s; %.0f waiting\n", id, Bytes(d.used),
                                          Bytes(d.free), Bytes(d.total), d.queue));
    if (d.tenants.empty()) continue;
    absl::StrAppend(&out, absl::StrFormat("  %-16s %8s %10s %9s %8s %8s %9s %8s %8s %9s\n", "TENANT", "SESSIONS",
                                          "MEMORY", "REPLAYS", "P50", "P99", "LAUNCHES", "P50", "P99", "DEVICE_S"));
    for (auto& [tenant, f] : d.tenants) {
      for (auto* buckets : {&f.replay_buckets, &f.launch_buckets})
        std::sort(buckets->begin(), buckets->end());
      absl::StrAppend(&out, absl::StrFormat("  %-16s %8.0f %10s %9.0f %8s %8s %9.0f %8s %8s %9.3f\n", tenant,
                                            f.sessions, Bytes(f.memory), f.replays,
                                            Latency(HistogramQuantile(0.5, f.replay_buckets)),
                                            Latency(HistogramQuantile(0.99, f.replay_buckets)), f.launches,
                                            Latency(HistogramQuantile(0.5, f.launch_buckets)),
                                            Latency(HistogramQuantile(0.99, f.launch_buckets)), f.device_seconds));
    }
  }
  if (!requests.empty()) {
    absl::StrAppend(&out, absl::StrFormat("requests\n  %-16s %9s %9s\n", "TENANT", "CALLS", "FAILED"));
    for (const auto& [tenant, r] : requests)
      absl::StrAppend(&out, absl::StrFormat("  %-16s %9.0f %9.0f\n", tenant, r.first, r.second));
  }
  return out;
}

}  // namespace replayd::client

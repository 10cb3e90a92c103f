// Tenancy benchmarks, client and daemon in separate processes over loopback, the daemon
// serving a tenants file. The work is the 32-kernel chain of the graph benchmark,
// replayed in sequences back to back (each replay of a sequence takes its own turn on
// the device), so that a few sessions keep cpu:0 saturated with little RPC traffic. Each
// saturating session keeps --outstanding sequences in flight, so its next one waits on
// the daemon while one runs: with one, every sequence ends in a round trip with nothing
// queued, a tenant's sessions (served in turn) end theirs together, and on the daemon's
// one core that round trip took about 1 ms, during which the other tenant had the device
// to itself; the scheduler banks at most a quantum for a queue that empties, so the
// shares measured the clients' gaps (2.4 to 2.9) more than the scheduler.
//   - shares: tenants light (weight 1) and heavy (weight 3), --sessions sessions each,
//     saturating cpu:0. The device time each got over --window, from the Admin service's
//     tenant reports, and its ratio (target: 3 within 10%).
//   - latency: an interactive tenant (priority class interactive) replays the chain with
//     wait, one replay at a time, on an idle device and while a batch tenant saturates it;
//     the loaded p99 against the idle p99 (target: at most 2x). The same replays from a
//     batch-class tenant of equal weight under the same load show what the class buys
//     (measured right after the interactive ones, so the load's threads are still
//     lowered; see --cpu_batch_idle). Then the same against a daemon started with
//     --cpu_batch_idle=false, where only the queue order separates the classes.
//
//   replayd_tenancy_bench [--runs=7] [--window=3s] [--sessions=3] [--outstanding=2] [--iterations=2000]
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "tests/bench/bench_support.h"
#include "tests/support/tenants_file.h"

ABSL_FLAG(absl::Duration, window, absl::Seconds(3), "measuring window of one shares run");
ABSL_FLAG(int, sessions, 3, "sessions per saturating tenant");
ABSL_FLAG(int, sequence, 64, "replays per sequence of the saturating sessions");
ABSL_FLAG(int, outstanding, 2,
          "sequences each saturating session keeps in flight (one client thread each); with 1, a tenant's "
          "queue empties between its sequences");
ABSL_FLAG(int, iterations, 2000, "replays per latency run");

namespace replayd::bench {
namespace {

std::string TenantsFile() {
  const std::string trusted = "  trusted: true\n";
  return TenantText("light", "light-token", trusted + "  weight: 1\n") +
         TenantText("heavy", "heavy-token", trusted + "  weight: 3\n") +
         TenantText("interactive", "interactive-token", trusted + "  priority: PRIORITY_INTERACTIVE\n") +
         TenantText("peer", "peer-token", trusted) + TenantText("batch", "batch-token", trusted) +
         TenantText("root", "root-token", "  admin: true\n");
}

client::ClientOptions As(const std::string& token) {
  client::ClientOptions options = ChainSession::WideWindow();
  options.token = token;
  return options;
}

// Sessions of one tenant replaying sequences back to back while started.
class Load {
 public:
  Load(const std::string& address, const std::string& token, int sessions) {
    for (int i = 0; i < sessions; ++i)
      sessions_.push_back(ChainSession::Open(address, kChainCalls, kChainFloats, As(token)));
  }
  ~Load() { Stop(); }
  void Start() {
    stop_ = false;
    for (auto& s : sessions_)
      for (int i = 0; i < absl::GetFlag(FLAGS_outstanding); ++i)
        threads_.emplace_back([this, &s] {
          while (!stop_)
            if (!s.Sequence(static_cast<uint32_t>(absl::GetFlag(FLAGS_sequence)))) {
              std::fprintf(stderr, "a saturating sequence failed\n");
              std::exit(1);
            }
        });
  }
  void Stop() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  std::vector<ChainSession> sessions_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_ = false;
};

// Device time in microseconds per tenant, from the Admin service.
std::map<std::string, uint64_t> DeviceTimes(client::Client& admin) {
  auto tenants = admin.ListTenants();
  if (!tenants.ok()) {
    std::fprintf(stderr, "ListTenants: %s\n", tenants.status().ToString().c_str());
    std::exit(1);
  }
  std::map<std::string, uint64_t> times;
  for (const auto& t : *tenants) times[t.name()] = t.device_time_us();
  return times;
}

struct Latency {
  double p50 = 0, p99 = 0;
};

Latency Measure(ChainSession& c, int iterations) {
  std::vector<double> us = LatenciesUs(iterations, [&](int i) {
    return c.session->Replay(*c.graph, {c.x.get(), int64_t{1 + i}}, true).ok();
  });
  return {Median(us), Quantile(us, 0.99)};
}

struct Latencies {
  std::vector<Latency> idle, loaded, peer;  // one per run
};

// The medians over runs of each quantile.
Latency Medians(const std::vector<Latency>& runs) {
  std::vector<double> p50, p99;
  for (const Latency& l : runs) {
    p50.push_back(l.p50);
    p99.push_back(l.p99);
  }
  return {Median(p50), Median(p99)};
}

// --runs of: the interactive tenant on an idle device, then it and the batch-class peer
// while the batch tenant saturates the device.
Latencies MeasureLatencies(const std::string& address, int runs, int iterations, int sessions) {
  ChainSession interactive = ChainSession::Open(address, kChainCalls, kChainFloats, As("interactive-token"));
  ChainSession peer = ChainSession::Open(address, kChainCalls, kChainFloats, As("peer-token"));
  Load batch(address, "batch-token", sessions);
  (void)Measure(interactive, 200);
  (void)Measure(peer, 200);
  Latencies out;
  for (int r = 0; r < runs; ++r) {
    out.idle.push_back(Measure(interactive, iterations));
    batch.Start();
    absl::SleepFor(absl::Milliseconds(100));
    out.loaded.push_back(Measure(interactive, iterations));
    out.peer.push_back(Measure(peer, iterations));
    batch.Stop();
  }
  return out;
}

int Main() {
  const int runs = absl::GetFlag(FLAGS_runs), iterations = absl::GetFlag(FLAGS_iterations);
  const int sessions = absl::GetFlag(FLAGS_sessions);
  const absl::Duration window = absl::GetFlag(FLAGS_window);
  char dir[] = "/tmp/replayd-tenants-XXXXXX";
  const std::filesystem::path tenants_dir = mkdtemp(dir);
  const std::filesystem::path tenants = tenants_dir / "tenants.textproto";
  std::ofstream(tenants) << TenantsFile();
  std::unique_ptr<BenchServers> servers = StartServers({"--tenants=" + tenants.string()});
  const std::string& address = servers->daemon_address;
  client::Client admin = client::Client::Connect(address, As("root-token"));

  // Shares.
  Load light(address, "light-token", sessions), heavy(address, "heavy-token", sessions);
  std::vector<double> ratios, utilization;
  for (int r = 0; r < runs; ++r) {
    light.Start();
    heavy.Start();
    absl::SleepFor(absl::Milliseconds(300));
    auto before = DeviceTimes(admin);
    const absl::Time start = absl::Now();
    absl::SleepFor(window);
    auto after = DeviceTimes(admin);
    const double elapsed_us = absl::ToDoubleMicroseconds(absl::Now() - start);
    light.Stop();
    heavy.Stop();
    const double l = static_cast<double>(after["light"] - before["light"]);
    const double h = static_cast<double>(after["heavy"] - before["heavy"]);
    ratios.push_back(h / l);
    utilization.push_back((l + h) / elapsed_us);
  }

  // Latency.
  Latencies latency = MeasureLatencies(address, runs, iterations, sessions);
  std::unique_ptr<BenchServers> plain = StartServers({"--tenants=" + tenants.string(), "--cpu_batch_idle=false"});
  Latencies plain_latency = MeasureLatencies(plain->daemon_address, runs, iterations, sessions);
  plain.reset();
  ChainSession interactive = ChainSession::Open(address, kChainCalls, kChainFloats, As("interactive-token"));
  auto device = interactive.session->Replay(*interactive.graph, {interactive.x.get(), int64_t{1}}, true);

  std::printf("replayd tenancy benchmarks: the %d-kernel chain over %d floats, saturating cpu:0 with %d sessions\n",
              kChainCalls, kChainFloats, sessions);
  std::printf("per tenant replaying %d-replay sequences back to back, %d in flight per session\n",
              absl::GetFlag(FLAGS_sequence), absl::GetFlag(FLAGS_outstanding));
  std::printf("client and daemon as separate processes on loopback; placement: %s\n", servers->Placement().c_str());
  std::printf("%d runs, medians; one chain replay holds the device %.1f us\n\n", runs,
              device.ok() ? device->device_seconds * 1e6 : 0.0);
  std::printf("shares over %.1f s windows: device time heavy (weight 3) / light (weight 1)\n",
              absl::ToDoubleSeconds(window));
  std::printf("  ratio %.3f (target 3.0 within 10%%; runs %.3f .. %.3f), device busy %.0f%% of the window\n\n",
              Median(ratios), Quantile(ratios, 0), Quantile(ratios, 1), 100 * Median(utilization));
  std::printf("%-52s %10s %10s %8s  %s\n", "replay with wait, one at a time", "p50", "p99", "p99/idle", "target");
  const double idle99 = Medians(latency.idle).p99;
  auto row = [&](const char* name, const std::vector<Latency>& runs, const char* target) {
    const Latency m = Medians(runs);
    std::printf("%-52s %7.1f us %7.1f us %7.2fx  %s\n", name, m.p50, m.p99, m.p99 / idle99, target);
  };
  row("interactive tenant, idle device", latency.idle, "");
  row("interactive tenant, batch tenant saturating", latency.loaded, "<= 2x");
  row("batch-class tenant, batch tenant saturating", latency.peer, "");
  std::printf("with --cpu_batch_idle=false (batch turns keep their thread priority):\n");
  row("  interactive tenant, idle device", plain_latency.idle, "");
  row("  interactive tenant, batch tenant saturating", plain_latency.loaded, "");
  std::error_code ec;
  std::filesystem::remove_all(tenants_dir, ec);
  return 0;
}

}  // namespace
}  // namespace replayd::bench

int main(int argc, char** argv) { return replayd::bench::BenchMain(argc, argv, replayd::bench::Main); }

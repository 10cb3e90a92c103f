// What every replayd benchmark needs: child processes (the daemon, the baseline server)
// placed on chosen cores, the baseline service, and medians over interleaved runs.
#ifndef REPLAYD_TESTS_BENCH_BENCH_SUPPORT_H_
#define REPLAYD_TESTS_BENCH_BENCH_SUPPORT_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "tests/support/free_port.h"

// Flags every bench binary takes.
ABSL_DECLARE_FLAG(std::string, replayd);
ABSL_DECLARE_FLAG(int, runs);
ABSL_DECLARE_FLAG(std::string, placement);
ABSL_DECLARE_FLAG(std::string, serve_baseline);
ABSL_DECLARE_FLAG(std::string, daemon_args);

namespace replayd::bench {

// A child process, killed (SIGTERM, then SIGKILL) and reaped on destruction.
class ChildProcess {
 public:
  // Starts argv; with cpu >= 0 the child is pinned to that core.
  ChildProcess(const std::vector<std::string>& argv, int cpu);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

// Pins the calling thread to `cpu` (no-op for cpu < 0).
void PinTo(int cpu);


// Serves the Baseline service on `address` until SIGTERM; returns the exit code.
int ServeBaseline(const std::string& address);

// Waits until a gRPC server answers at `address`; false after `timeout`.
bool WaitForServer(const std::string& address, absl::Duration timeout);

// The daemon and the baseline server of one bench run, as separate processes on
// loopback, placed by --placement; the compile cache is removed at the end.
struct BenchServers {
  ~BenchServers();
  bool split = true;        // client on core 0, servers on core 1
  int server_cpu = 1;       // -1 when left to the scheduler
  std::string daemon_address, baseline_address, cache_dir;
  std::unique_ptr<ChildProcess> baseline, daemon;

  // A line saying how the processes were placed.
  std::string Placement() const;
};

// Starts both (the daemon with `daemon_args` added, then those of --daemon_args) and pins
// this process's thread; exits the process when either does not answer in time. The
// daemon is `daemon_binary`, or --replayd when that is empty, or this build's.
std::unique_ptr<BenchServers> StartServers(const std::vector<std::string>& daemon_args,
                                           const std::string& daemon_binary = "");

// `args` split on spaces (empty words dropped): how --daemon_args is read.
std::vector<std::string> SplitArgs(const std::string& args);

// Starts a baseline server of this build whose Chat is served through `api` ("sync",
// "callback", "queue": a completion queue with one thread of its own, or "mixed": that
// queue beside the other methods on the sync API), pinned to `cpu` (unless negative);
// sets `address`. Only "sync" and "mixed" serve the other methods.
std::unique_ptr<ChildProcess> StartBaseline(const std::string& api, std::string* address, int cpu);

// main() of a bench binary: parses flags, serves the baseline when asked to, else runs
// `bench`.
int BenchMain(int argc, char** argv, int (*bench)());

// The chain the graph and stream benchmarks replay: kChainCalls calls of this kernel,
// each over kChainFloats floats, with the variable pos as its last argument.
inline constexpr int kChainCalls = 32, kChainFloats = 1024;
inline constexpr char kChainKernel[] = R"(
void step(float *x, int n, int pos) {
  for (int i = 0; i < n; ++i) x[i] = x[i] * 0.5f + (float)pos;
})";

// The chain of `calls` calls of kChainKernel over `floats` floats, captured in `session`
// over its buffer `x`, with the variable pos.
absl::StatusOr<client::Graph> CaptureChain(client::Session& session, const client::Program& program,
                                           const client::Buffer& x, int calls = kChainCalls,
                                           int floats = kChainFloats);

// One client with one session on cpu:0 holding the chain: its program, its buffer and
// the captured graph. Open exits the process when any step fails.
struct ChainSession {
  std::unique_ptr<client::Client> client;
  std::unique_ptr<client::Session> session;
  std::unique_ptr<client::Program> program;
  std::unique_ptr<client::Buffer> x;
  std::unique_ptr<client::Graph> graph;

  // A client whose stream window is wide (256) unless `options` say otherwise.
  static ChainSession Open(const std::string& address, int calls = kChainCalls, int floats = kChainFloats,
                           client::ClientOptions options = WideWindow());
  static client::ClientOptions WideWindow();
  // Replays/s with `n` replays queued without waiting.
  double Pipelined(int n);
  // One replay sequence of `count` replays with pos stepping from 1; false on failure.
  bool Sequence(uint32_t count);
};

// The latencies in microseconds of `iterations` calls of `call(i)`; exits the process
// when a call fails.
std::vector<double> LatenciesUs(int iterations, const std::function<bool(int)>& call);
double MedianLatencyUs(int iterations, const std::function<bool(int)>& call);

// The median of `values`, and the `q`-quantile (0..1, nearest rank).
double Median(std::vector<double> values);
double Quantile(std::vector<double> values, double q);

// Runs each of `subjects` `runs` times, interleaved (a b a b ...), and returns per
// subject the median over runs of what each run returned.
std::vector<double> InterleavedMedians(const std::vector<std::function<double()>>& subjects,
                                       int runs);

}  // namespace replayd::bench

#endif  // REPLAYD_TESTS_BENCH_BENCH_SUPPORT_H_

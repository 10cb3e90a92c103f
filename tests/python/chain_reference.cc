// The C++ client's side of the Python client benchmark (bench_client.py beside it): the
// chain of tests/bench (kChainCalls calls of kChainKernel over kChainFloats floats, with
// the variable pos) captured in a session of the daemon at --target, then timed as
// tests/bench/stream_bench.cc times it: the median round trip of a replay with a 4 KiB
// read over the Session stream, and replays/s with --iterations queued without waiting.
// Prints one line: "round_trip_us R pipelined_per_s P".
//
//   replayd_chain_reference --target=127.0.0.1:PORT [--iterations=2000] [--cpu=0]
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/client.h"
#include "tests/bench/bench_support.h"

ABSL_FLAG(std::string, target, "127.0.0.1:7070", "the daemon");
ABSL_FLAG(int, iterations, 2000, "round trips timed; replays queued for the pipelined rate");
ABSL_FLAG(int, cpu, -1, "the core to run on (-1: any)");
ABSL_FLAG(int, window, 256, "the client's stream window");

namespace {

using replayd::client::Buffer;
using replayd::client::Session;

[[noreturn]] void Fail(const absl::Status& s) {
  std::fprintf(stderr, "replayd_chain_reference: %s\n", s.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Take(absl::StatusOr<T> v) {
  if (!v.ok()) Fail(v.status());
  return std::move(*v);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  namespace client = replayd::client;
  namespace bench = replayd::bench;
  absl::ParseCommandLine(argc, argv);
  if (const int cpu = absl::GetFlag(FLAGS_cpu); cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  const int n = absl::GetFlag(FLAGS_iterations);
  client::ClientOptions options;
  options.stream_window = absl::GetFlag(FLAGS_window);
  client::Client c = client::Client::Connect(absl::GetFlag(FLAGS_target), options);
  Session s = Take(c.OpenSession("cpu:0"));
  client::Program step =
      Take(s.Load({"cpu-c", bench::kChainKernel, "step", Take(client::ParseSignature("inout,int32,int32")), {}}));
  Buffer x = Take(s.Alloc(uint64_t{bench::kChainFloats} * 4));
  const client::Variable pos{"pos", 1, 1 << 30, 1};
  if (absl::Status st = s.BeginCapture({&x}, {pos}); !st.ok()) Fail(st);
  client::LaunchSpec spec;
  spec.args = {client::View{&x}, int64_t{bench::kChainFloats}, client::Expr{"pos"}};
  spec.variables = {{pos, 1}};
  for (int i = 0; i < bench::kChainCalls; ++i) Take(s.Launch(step, spec));
  client::Graph graph = Take(s.EndCapture({}));

  const std::vector<client::View> read = {client::View{&x, 0, 4096}};
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; i < n; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    client::ReplayResult r = Take(s.Replay(graph, {&x, int64_t{3}}, true, read));
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (r.reads.size() != 1 || r.reads[0].size() != 4096) Fail(absl::InternalError("short read"));
  }
  std::vector<std::future<absl::StatusOr<client::ReplayResult>>> futures;
  futures.reserve(n);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) futures.push_back(s.ReplayAsync(graph, {&x, int64_t{1 + i}}));
  for (auto& f : futures) Take(f.get());
  const double rate = n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("round_trip_us %.2f pipelined_per_s %.0f\n", Median(us), rate);
  return 0;
}

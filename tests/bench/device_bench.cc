// Per-kernel cost on one device, in this process through the engine (no RPC): the
// 32-call chain replayed as a graph (pos changing every replay, so every node is patched)
// against the same 32 calls launched one at a time, each followed by a Synchronize.
// Ratios are of figures measured in the same run; medians of interleaved runs.
//
//   replayd_device_bench [--device=cuda:0|hip:0] [--runs=7] [--iterations=200]
//                        [--hip_device_graph=graph|stream]
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "server/daemon.h"
#include "tests/bench/bench_support.h"

ABSL_FLAG(std::string, device, "cpu:0", "device to measure");
ABSL_FLAG(int, iterations, 200, "chains per run");
ABSL_FLAG(std::string, hip_device_graph, "auto", "on hip devices: graph, stream or auto (see replayd --help)");

namespace replayd::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kCalls = kChainCalls, kFloats = kChainFloats, kBlock = 256;

// CUDA C, which is also HIP C.
constexpr char kGpuChainKernel[] = R"(
extern "C" __global__ void step(float *x, int n, int pos) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 0.5f + (float)pos;
})";

struct Chain {
  std::unique_ptr<Engine> engine;
  std::shared_ptr<DeviceSession> session;
  LaunchOp op;
  Handle graph = 0, x = 0;
};

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what, v.status());
  return std::move(*v);
}

// Every device this build can serve on this machine.
std::vector<std::unique_ptr<Device>> DiscoverAll() {
  DaemonOptions options;
  options.cpu.memory_limit = 64 << 20;
#ifdef REPLAYD_WITH_HIP
  options.hip.device_graph = Must(ParseHipDeviceGraph(absl::GetFlag(FLAGS_hip_device_graph)), "--hip_device_graph");
#endif
  std::vector<std::unique_ptr<Device>> devices;
  for (absl::string_view kind : absl::StrSplit(kKnownDeviceKinds, ','))
    for (auto& d : Must(DiscoverDevices(std::string(kind), options), "discover")) devices.push_back(std::move(d));
  return devices;
}

// The engine over `devices`, a session on `device` and the chain in the device's format,
// captured once.
Chain Open(std::vector<std::unique_ptr<Device>> devices, const std::string& device,
           const std::filesystem::path& cache) {
  EngineOptions options;
  options.cache_dir = cache;
  Chain c;
  c.engine = Must(Engine::Create(options, std::move(devices)), "engine");
  c.session = Must(c.engine->OpenSession("default", device), "open session on " + device);
  const bool gpu = device.rfind("cuda:", 0) == 0 || device.rfind("hip:", 0) == 0;
  Signature sig;
  sig.params = {{"x", ParamKind::kBuffer, Access::kInout},
                {"n", ParamKind::kInt32, Access::kNone},
                {"pos", ParamKind::kInt32, Access::kNone}};
  const std::string format = !gpu ? "cpu-c" : device.rfind("cuda:", 0) == 0 ? "cuda-c" : "hip-c";
  ProgramSource source{format, gpu ? kGpuChainKernel : kChainKernel, "step", sig, {}};
  ProgramInfo program = Must(c.session->LoadProgram(source), "load");
  c.x = Must(c.session->AllocBuffer(kFloats * 4), "alloc");
  const VariableDecl pos{"pos", 1, 1 << 30, 1};
  c.op.program = program.handle;
  c.op.variables = {{pos, 1}};
  c.op.args = {ViewArg{c.x, 0, 0}, Expression::Constant(kFloats), Expression::Var(0)};
  if (gpu) {
    c.op.global = {Expression::Constant((kFloats + kBlock - 1) / kBlock)};
    c.op.local = {Expression::Constant(kBlock)};
  }
  if (absl::Status s = c.session->BeginCapture({c.x}, {pos}); !s.ok()) Die("capture", s);
  for (int i = 0; i < kCalls; ++i) Must(c.session->Launch(c.op), "launch");
  c.graph = Must(c.session->EndCapture({}), "end capture").handle;
  return c;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Microseconds per kernel of `iterations` chains of 32 eager launches and a Synchronize.
double EagerUsPerKernel(Chain& c, int iterations) {
  auto start = Clock::now();
  for (int it = 0; it < iterations; ++it) {
    c.op.variables[0].value = it + 1;
    for (int i = 0; i < kCalls; ++i) Must(c.session->Launch(c.op), "launch");
    if (absl::Status s = c.session->Synchronize(); !s.ok()) Die("synchronize", s);
  }
  return Seconds(Clock::now() - start) * 1e6 / (iterations * kCalls);
}

// The same as graph replays with pos changing each time, each followed by a Synchronize.
double GraphUsPerKernel(Chain& c, int iterations) {
  ReplayOp op;
  op.graph = c.graph;
  auto start = Clock::now();
  for (int it = 0; it < iterations; ++it) {
    op.params = {BufferParam{c.x}, int64_t{it + 1}};
    Must(c.session->ReplayGraph(op), "replay");
    if (absl::Status s = c.session->Synchronize(); !s.ok()) Die("synchronize", s);
  }
  return Seconds(Clock::now() - start) * 1e6 / (iterations * kCalls);
}

// Device time of one replay (events on GPUs), in microseconds per kernel.
double DeviceUsPerKernel(Chain& c) {
  ReplayOp op;
  op.graph = c.graph;
  op.params = {BufferParam{c.x}, int64_t{1}};
  op.wait = true;
  ReplayOutcome r = Must(c.session->ReplayGraph(op), "replay");
  return r.device_time ? absl::ToDoubleMicroseconds(*r.device_time) / kCalls : 0;
}

int Main() {
  const int runs = absl::GetFlag(FLAGS_runs), iterations = absl::GetFlag(FLAGS_iterations);
  const std::string device = absl::GetFlag(FLAGS_device);
  std::vector<std::unique_ptr<Device>> devices = DiscoverAll();
  std::string found;
  bool there = false;
  for (const auto& d : devices) {
    found += (found.empty() ? "" : ", ") + d->info().id;
    there = there || d->info().id == device;
  }
  if (!there) {
    std::fprintf(stderr, "%s is not on this machine (found: %s)\n", device.c_str(), found.c_str());
    return 1;
  }
  char dir[] = "/tmp/replayd-device-bench-XXXXXX";
  const std::filesystem::path cache = mkdtemp(dir);
  Chain c = Open(std::move(devices), device, cache);
  EagerUsPerKernel(c, iterations / 10 + 1);  // warm up
  GraphUsPerKernel(c, iterations / 10 + 1);
  std::vector<double> m =
      InterleavedMedians({[&] { return EagerUsPerKernel(c, iterations); },
                          [&] { return GraphUsPerKernel(c, iterations); }, [&] { return DeviceUsPerKernel(c); }},
                         runs);
  std::printf("%s, in process (no RPC), a %d-call chain over %d floats; %d interleaved runs of %d chains, medians\n\n",
              device.c_str(), kCalls, kFloats, runs, iterations);
  std::printf("%-52s %10.2f us\n", "eager launch + synchronize per chain, per kernel", m[0]);
  std::printf("%-52s %10.2f us\n", "graph replay (pos patched) + synchronize, per kernel", m[1]);
  std::printf("%-52s %10.2f us\n", "device time of one replay, per kernel", m[2]);
  std::printf("%-52s %10.2fx\n", "eager / graph per-kernel cost", m[0] / m[1]);
  c.session.reset();
  c.engine.reset();
  std::error_code ec;
  std::filesystem::remove_all(cache, ec);
  return 0;
}

}  // namespace
}  // namespace replayd::bench

int main(int argc, char** argv) { return replayd::bench::BenchMain(argc, argv, replayd::bench::Main); }

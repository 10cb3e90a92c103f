// Graph benchmarks, client and daemon in separate processes over loopback. A 32-kernel
// chain (elementwise over 1024 floats, one variable `pos`):
//   - replayed with wait and a 4 KiB read-back, against an empty unary RPC and against
//     the same 32 calls as eager Launch RPCs (plus the read);
//   - DefineGraph, and a repeated capture on a cache hit, against an empty RPC;
//   - replays whose pos changes every time against replays with a fixed pos.
// Every figure is a ratio to a baseline measured in the same run; medians of
// interleaved runs.
//
//   replayd_graph_bench [--runs=7] [--iterations=1000] [--placement=split]
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "baseline.grpc.pb.h"
#include "client/client.h"
#include "tests/bench/bench_support.h"

ABSL_FLAG(int, iterations, 1000, "round trips per latency run");

namespace replayd::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kCalls = kChainCalls, kFloats = kChainFloats;


int Main() {
  const int runs = absl::GetFlag(FLAGS_runs), iterations = absl::GetFlag(FLAGS_iterations);
  std::unique_ptr<BenchServers> servers = StartServers({});
  const std::string& baseline_addr = servers->baseline_address;
  const std::string& daemon_addr = servers->daemon_address;
  auto baseline_stub = Baseline::NewStub(grpc::CreateChannel(baseline_addr, grpc::InsecureChannelCredentials()));
  Client client = Client::Connect(daemon_addr);
  auto session = client.OpenSession("cpu:0");
  if (!session.ok()) return std::fprintf(stderr, "%s\n", session.status().ToString().c_str()), 1;
  auto program = session->Load({"cpu-c", kChainKernel, "step", *client::ParseSignature("inout,int32,int32"), {}});
  auto x = session->Alloc(kFloats * 4);
  if (!program.ok() || !x.ok()) return std::fprintf(stderr, "setup failed\n"), 1;
  const client::Variable pos{"pos", 1, 1 << 20, 1};

  auto chain_spec = [&](int64_t p) {
    client::LaunchSpec spec;
    spec.args = {client::View{&*x}, int64_t{kFloats}, client::Expr{"pos"}};
    spec.variables = {{pos, p}};
    return spec;
  };
  auto capture = [&]() -> absl::StatusOr<client::Graph> {
    if (absl::Status s = session->BeginCapture({&*x}, {pos}); !s.ok()) return s;
    for (int c = 0; c < kCalls; ++c)
      if (absl::Status s = session->Launch(*program, chain_spec(1)).status(); !s.ok()) return s;
    return session->EndCapture({});
  };
  auto graph = capture();
  if (!graph.ok()) return std::fprintf(stderr, "%s\n", graph.status().ToString().c_str()), 1;
  v1::GraphDef def;
  {
    auto* v = def.add_variables();
    v->set_name("pos");
    v->set_min(pos.min);
    v->set_max(pos.max);
    auto* slot = def.add_slots();
    slot->set_kind(v1::Slot::PARAMETER);
    slot->set_bytes(kFloats * 4);
    for (int c = 0; c < kCalls; ++c) {
      auto* call = def.add_calls();
      call->set_program(program->handle());
      call->add_args()->mutable_view()->set_slot(0);
      call->add_args()->mutable_expr()->set_constant(kFloats);
      call->add_args()->mutable_expr()->set_variable("pos");
    }
  }
  const std::vector<client::View> read = {client::View{&*x, 0, 4096}};

  auto empty_rpc = [&] {
    return MedianLatencyUs(iterations, [&](int) {
      grpc::ClientContext ctx;
      Nothing in, out;
      return baseline_stub->Empty(&ctx, in, &out).ok();
    });
  };
  auto replay_changing = [&] {
    return MedianLatencyUs(iterations, [&](int i) {
      auto r = session->Replay(*graph, {&*x, int64_t{1 + i}}, true, read);
      return r.ok() && r->reads[0].size() == 4096;
    });
  };
  auto replay_unary = [&] {
    return MedianLatencyUs(iterations, [&](int i) {
      auto r = session->ReplayUnary(*graph, {&*x, int64_t{1 + i}}, true, read);
      return r.ok() && r->reads[0].size() == 4096;
    });
  };
  auto replay_fixed = [&] {
    return MedianLatencyUs(iterations, [&](int) {
      return session->Replay(*graph, {&*x, int64_t{7}}, true, read).ok();
    });
  };
  auto eager_chain = [&] {
    return MedianLatencyUs(std::max(1, iterations / 10), [&](int i) {
      for (int c = 0; c < kCalls; ++c)
        if (!session->Launch(*program, chain_spec(1 + i)).ok()) return false;
      std::vector<uint8_t> back(4096);
      return session->Read(*x, 0, back).ok();
    });
  };
  // The handles made are freed after each run, outside the timed calls.
  std::vector<client::Graph> made;
  auto define = [&] {
    double us = MedianLatencyUs(std::max(1, iterations / 4), [&](int) {
      auto g = session->DefineGraph(def);
      if (!g.ok() || !g->info().cache_hit()) return false;
      made.push_back(std::move(*g));
      return true;
    });
    made.clear();
    return us;
  };
  auto recapture = [&] {
    double us = MedianLatencyUs(std::max(1, iterations / 20), [&](int) {
      auto g = capture();
      if (!g.ok() || !g->info().cache_hit()) return false;
      made.push_back(std::move(*g));
      return true;
    });
    made.clear();
    return us;
  };

  double device_us = 0;
  for (int i = 0; i < 200; ++i) {
    auto r = session->Replay(*graph, {&*x, int64_t{1}}, true, read);
    if (r.ok()) device_us = r->device_seconds * 1e6;
  }
  std::vector<double> m = InterleavedMedians(
      {empty_rpc, replay_changing, replay_fixed, eager_chain, define, recapture, replay_unary}, runs);
  const double empty = m[0], changing = m[1], fixed = m[2], eager = m[3], def_us = m[4], recap = m[5],
               unary = m[6];

  std::printf("replayd graph benchmarks: a %d-kernel chain over %d floats with variable pos\n", kCalls, kFloats);
  std::printf("client and daemon as separate processes on loopback; placement: %s\n",
              servers->Placement().c_str());
  std::printf("%d interleaved runs, medians of per-run median latencies; the chain's device time is %.1f us\n\n",
              runs, device_us);
  std::printf("%-46s %10s %10s %9s  %s\n", "figure", "baseline", "replayd", "ratio", "target");
  std::printf("%-46s %7.1f us %7.1f us %8.2fx  %s\n", "unary ReplayGraph + 4 KiB read vs empty RPC", empty,
              unary, unary / empty, "<= 1.2x");
  std::printf("%-46s %7.1f us %7.1f us %8.2fx  %s\n", "stream replay + 4 KiB read vs empty unary RPC", empty,
              changing, changing / empty, "<= 1.2x");
  std::printf("%-46s %7.1f us %7.1f us %8.1fx  %s\n", "eager chain (32 Launch + read) vs replay", eager,
              changing, eager / changing, ">= 20x faster");
  std::printf("%-46s %7.1f us %7.1f us %8.3fx  %s\n", "replay, pos changing vs pos fixed", fixed, changing,
              changing / fixed, "within 5%");
  std::printf("%-46s %7.1f us %7.1f us %8.2fx  %s\n", "DefineGraph (cache hit) vs empty unary RPC", empty,
              def_us, def_us / empty, "");
  std::printf("%-46s %7.1f us %7.1f us %8.2fx  %s\n", "capture on a cache hit (34 RPCs) vs empty RPC", empty,
              recap, recap / empty, "");
  return 0;
}

}  // namespace
}  // namespace replayd::bench

int main(int argc, char** argv) { return replayd::bench::BenchMain(argc, argv, replayd::bench::Main); }

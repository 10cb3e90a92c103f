// Session stream benchmarks, client and daemon in separate processes over loopback.
// Baselines, measured in the same run against a plain gRPC server of the same build:
//   - an empty ping-pong on a bidirectional stream with a 4 KiB reply (round trip);
//   - the same stream pipelined: messages/s from one client that does not wait.
// Figures: the 32-kernel chain replay with a 4 KiB read-back over the Session stream;
// pipelined replays/s from one client and from 8; replay-sequence replays/s against the
// same replays run in-process with no RPC at all (the device-only rate).
//
//   replayd_stream_bench [--runs=7] [--iterations=2000] [--placement=split]
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "baseline.grpc.pb.h"
#include "client/client.h"
#include "drivers/cpu/cpu_driver.h"
#include "engine/engine.h"
#include "replayd/v1/replayd.grpc.pb.h"
#include "tests/bench/bench_support.h"

ABSL_FLAG(int, iterations, 2000, "round trips per latency run; messages per throughput run");
ABSL_FLAG(int, stream_window, 8, "the daemon's --stream_window");
ABSL_FLAG(int, stream_threads, 1, "the daemon's --stream_threads");

namespace replayd::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kCalls = kChainCalls, kFloats = kChainFloats;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }


// The device-only rate: the same chain replayed in this process, no RPC, as one
// sequence of `n` replays on the daemon's core.
class InProcessChain {
 public:
  InProcessChain() : driver_(Cpu()) {
    options_.cache_dir = mkdtemp(dir_);
    engine_ = *Engine::Create(options_, driver_.Discover());
    session_ = *engine_->OpenSession("default", "cpu:0");
    Signature sig;
    sig.params = {{"x", ParamKind::kBuffer, Access::kInout}, {"n", ParamKind::kInt32, Access::kNone},
                  {"pos", ParamKind::kInt32, Access::kNone}};
    auto program = *session_->LoadProgram({"cpu-c", kChainKernel, "step", sig, {}});
    Handle x = *session_->AllocBuffer(kFloats * 4);
    VariableDecl pos{"pos", 1, 1 << 30, 1};
    (void)session_->BeginCapture({x}, {pos});
    LaunchOp op;
    op.program = program.handle;
    op.variables = {{pos, 1}};
    op.args = {ViewArg{x, 0, 0}, Expression::Constant(kFloats), Expression::Var(0)};
    for (int c = 0; c < kCalls; ++c) (void)session_->Launch(op);
    auto graph = *session_->EndCapture({});
    seq_.graph = graph.handle;
    seq_.base = {BufferParam{x}, int64_t{1}};
    seq_.step_param = 1;
    seq_.step = 1;
  }
  ~InProcessChain() {
    session_.reset();
    engine_.reset();
    std::error_code ec;
    std::filesystem::remove_all(options_.cache_dir, ec);
  }

  // Replays/s of one sequence of `n` on core `cpu` (the calling thread returns to `home`).
  double Rate(int n, int cpu, int home) {
    PinTo(cpu);
    seq_.count = n;
    auto start = Clock::now();
    if (!session_->ReplaySequence(seq_, [](uint64_t, const ReplayOutcome&) { return absl::OkStatus(); }).ok())
      std::exit(1);
    const double rate = n / Seconds(Clock::now() - start);
    PinTo(home);
    return rate;
  }

 private:
  static CpuDriverOptions Cpu() {
    CpuDriverOptions cpu;
    cpu.memory_limit = 64 << 20;
    return cpu;
  }
  char dir_[32] = "/tmp/replayd-bench-XXXXXX";
  EngineOptions options_;
  CpuDriver driver_;
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<DeviceSession> session_;
  ReplaySequenceOp seq_;
};

using Chat = grpc::ClientReaderWriter<Blob, Blob>;

// The median round trip of `iterations` empty messages each answered with 4 KiB.
double PingPongUs(Chat& chat, int iterations) {
  Blob in, out;
  return MedianLatencyUs(iterations, [&](int) { return chat.Write(in) && chat.Read(&out); });
}

// Messages/s of `iterations` empty messages written by one thread while another reads
// the answers.
double PipelinedPerSecond(Chat& chat, int iterations) {
  Blob in, out;
  auto start = Clock::now();
  std::thread writer([&] {
    for (int i = 0; i < iterations; ++i) chat.Write(in);
  });
  for (int i = 0; i < iterations; ++i) chat.Read(&out);
  writer.join();
  return iterations / Seconds(Clock::now() - start);
}

int Main() {
  const int runs = absl::GetFlag(FLAGS_runs), iterations = absl::GetFlag(FLAGS_iterations);
  const int sequence_n = iterations;
  InProcessChain chain;
  std::unique_ptr<BenchServers> servers =
      StartServers({absl::StrCat("--stream_window=", absl::GetFlag(FLAGS_stream_window)),
                    absl::StrCat("--stream_threads=", absl::GetFlag(FLAGS_stream_threads))});
  const std::string& baseline_addr = servers->baseline_address;
  const std::string& daemon_addr = servers->daemon_address;
  auto baseline_stub = Baseline::NewStub(grpc::CreateChannel(baseline_addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext chat_context;
  auto chat = baseline_stub->Chat(&chat_context);
  ChainSession one = ChainSession::Open(daemon_addr);
  const std::vector<client::View> read = {client::View{one.x.get(), 0, 4096}};

  auto ping_pong = [&] { return PingPongUs(*chat, iterations); };
  auto replay_round_trip = [&] {
    return MedianLatencyUs(iterations, [&](int) {
      auto r = one.session->Replay(*one.graph, {one.x.get(), int64_t{3}}, true, read);
      return r.ok() && r->reads[0].size() == 4096;
    });
  };
  auto stream_pipelined = [&] { return PipelinedPerSecond(*chat, iterations); };
  auto replay_pipelined = [&] { return one.Pipelined(iterations); };
  auto sequence = [&] {
    client::SequenceSpec spec;
    spec.base = {one.x.get(), int64_t{1}};
    spec.step_param = 1;
    spec.count = sequence_n;
    spec.reads = read;
    auto start = Clock::now();
    auto r = one.session->ReplaySequence(*one.graph, spec);
    if (!r.ok() || r->replays != uint32_t(sequence_n)) std::exit(1);
    return sequence_n / Seconds(Clock::now() - start);
  };
  ChainSession tiny = ChainSession::Open(daemon_addr, 1, 1);
  auto tiny_pipelined = [&] { return tiny.Pipelined(iterations); };
  // Interleaved with the rest, on the daemon's core while the daemon idles there.
  auto in_process = [&] { return chain.Rate(sequence_n, servers->server_cpu, servers->split ? 0 : -1); };
  std::vector<ChainSession> eight;
  for (int c = 0; c < 8; ++c) eight.push_back(ChainSession::Open(daemon_addr));
  auto eight_pipelined = [&] {
    std::vector<std::thread> threads;
    const int each = std::max(1, iterations / 8);
    auto start = Clock::now();
    for (auto& c : eight) threads.emplace_back([&c, each] { c.Pipelined(each); });
    for (auto& t : threads) t.join();
    return 8 * each / Seconds(Clock::now() - start);
  };

  // The server APIs against each other: the same Chat served by the callback API, by a
  // completion queue with a thread of its own, and by that queue in a server whose other
  // methods are sync (as the daemon's would be), each in a server of its own.
  struct ApiChat {
    std::string address;
    std::unique_ptr<ChildProcess> server;
    std::unique_ptr<Baseline::Stub> stub;
    grpc::ClientContext context;
    std::unique_ptr<Chat> chat;
  };
  std::vector<std::unique_ptr<ApiChat>> apis;
  for (const char* api : {"callback", "queue", "mixed"}) {
    auto a = std::make_unique<ApiChat>();
    a->server = StartBaseline(api, &a->address, servers->server_cpu);
    a->stub = Baseline::NewStub(grpc::CreateChannel(a->address, grpc::InsecureChannelCredentials()));
    a->chat = a->stub->Chat(&a->context);
    apis.push_back(std::move(a));
  }
  auto api_ping_pong = [&](ApiChat& a) { return PingPongUs(*a.chat, iterations); };

  // Where the replay round trip goes: the daemon's Session stream driven raw, without the
  // client library, with an empty operation (keep-alive) and with the replay itself.
  auto daemon_stub = v1::Replayd::NewStub(grpc::CreateChannel(daemon_addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext raw_context;
  auto raw = daemon_stub->Session(&raw_context);
  v1::SessionRequest keep_alive, raw_replay;
  keep_alive.set_session(one.session->id());
  keep_alive.mutable_keep_alive();
  raw_replay.set_session(one.session->id());
  v1::ReplayGraphRequest* r = raw_replay.mutable_replay();
  r->set_graph(one.graph->handle());
  r->add_params()->set_buffer(one.x->handle());
  r->add_params()->set_int_value(3);
  r->set_wait(true);
  v1::View* v = r->add_reads();
  v->set_buffer(one.x->handle());
  v->set_length(4096);
  auto raw_round_trip = [&](const v1::SessionRequest& request) {
    v1::SessionReply reply;
    return MedianLatencyUs(iterations, [&](int) { return raw->Write(request) && raw->Read(&reply) && reply.code() == 0; });
  };
  auto api_pipelined = [&](ApiChat& a) { return PipelinedPerSecond(*a.chat, iterations); };

  (void)one.Pipelined(200);
  std::vector<double> m = InterleavedMedians(
      {ping_pong, replay_round_trip, stream_pipelined, replay_pipelined, eight_pipelined, in_process, sequence,
       tiny_pipelined, [&] { return api_ping_pong(*apis[0]); }, [&] { return api_pipelined(*apis[0]); },
       [&] { return api_ping_pong(*apis[1]); }, [&] { return api_pipelined(*apis[1]); },
       [&] { return api_ping_pong(*apis[2]); }, [&] { return api_pipelined(*apis[2]); },
       [&] { return raw_round_trip(keep_alive); }, [&] { return raw_round_trip(raw_replay); }},
      runs);
  raw->WritesDone();
  raw->Finish();
  chat->WritesDone();
  chat->Finish();
  for (auto& a : apis) {
    a->chat->WritesDone();
    a->chat->Finish();
  }
  std::printf("replayd stream benchmarks: a %d-kernel chain over %d floats with variable pos\n", kCalls, kFloats);
  std::printf("client and daemon as separate processes on loopback; placement: %s\n",
              servers->Placement().c_str());
  std::printf(
      "%d interleaved runs, medians; %d round trips or messages per run; daemon --stream_window=%d "
      "--stream_threads=%d\n\n",
      runs, iterations, absl::GetFlag(FLAGS_stream_window), absl::GetFlag(FLAGS_stream_threads));
  std::printf("%-50s %12s %12s %8s  %s\n", "figure", "baseline", "replayd", "ratio", "target");
  std::printf("%-50s %9.1f us %9.1f us %7.2fx  %s\n", "replay + 4 KiB read vs stream ping-pong (4 KiB)",
              m[0], m[1], m[1] / m[0], "<= 1.3x");
  std::printf("%-50s %10.0f/s %10.0f/s %7.2fx  %s\n", "pipelined replays, 1 client vs pipelined stream",
              m[2], m[3], m[3] / m[2], ">= 0.7x");
  std::printf("%-50s %10.0f/s %10.0f/s %7.2fx  %s\n", "pipelined replays, 8 clients vs pipelined stream",
              m[2], m[4], m[4] / m[2], "");
  std::printf("%-50s %10.0f/s %10.0f/s %7.2fx  %s\n", "replay sequence vs in-process replays (no RPC)",
              m[5], m[6], m[6] / m[5], ">= 0.9x");
  std::printf("%-50s %10.0f/s %10.0f/s %7.2fx  %s\n", "pipelined replays of a 1-call graph vs stream",
              m[2], m[7], m[7] / m[2], "");
  std::printf("\nthe chain's device-only rate is %.0f replays/s (%.1f us each)\n", m[5], 1e6 / m[5]);
  std::printf("\nthe baseline's Chat by server API (each a server of its own)    ping-pong   pipelined\n");
  std::printf("%-60s %7.1f us %9.0f/s\n", "sync", m[0], m[2]);
  std::printf("%-60s %7.1f us %9.0f/s\n", "callback", m[8], m[9]);
  std::printf("%-60s %7.1f us %9.0f/s\n", "completion queue, one thread", m[10], m[11]);
  std::printf("%-60s %7.1f us %9.0f/s\n", "completion queue beside sync methods", m[12], m[13]);
  std::printf("\nthe replay round trip's parts                                   round trip\n");
  std::printf("%-60s %7.1f us\n", "stream ping-pong baseline (sync server)", m[0]);
  std::printf("%-60s %7.1f us\n", "daemon's Session stream, keep-alive, raw client", m[14]);
  std::printf("%-60s %7.1f us\n", "daemon's Session stream, replay + 4 KiB read, raw client", m[15]);
  std::printf("%-60s %7.1f us\n", "the same replay through the client library", m[1]);
  eight.clear();
  return 0;
}

}  // namespace
}  // namespace replayd::bench

int main(int argc, char** argv) { return replayd::bench::BenchMain(argc, argv, replayd::bench::Main); }

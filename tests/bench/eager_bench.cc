// Eager-path benchmarks, client and daemon in separate processes over loopback:
//   - an empty-kernel Launch round trip against an empty unary RPC;
//   - 256 MiB WriteBuffer and ReadBuffer against plain gRPC byte streams of the same size.
// Every figure is reported as a ratio to its baseline measured in the same run, as the
// median of interleaved runs.
//
//   replayd_bench [--runs=7] [--iterations=2000] [--transfer_mib=256] [--placement=split]
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "baseline.grpc.pb.h"
#include "client/client.h"
#include "tests/bench/bench_support.h"

ABSL_FLAG(int, iterations, 2000, "round trips per latency run");
ABSL_FLAG(int, transfer_mib, 256, "MiB per transfer run");

namespace replayd::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// Median latency in microseconds of `iterations` calls of `call`.

// MiB/s of one transfer.
double Throughput(uint64_t bytes, const std::function<bool()>& transfer) {
  auto start = Clock::now();
  if (!transfer()) {
    std::fprintf(stderr, "transfer failed\n");
    std::exit(1);
  }
  return double(bytes) / (1 << 20) / (Micros(Clock::now() - start) / 1e6);
}

int Main() {
  const int runs = absl::GetFlag(FLAGS_runs), iterations = absl::GetFlag(FLAGS_iterations);
  const uint64_t transfer = uint64_t(absl::GetFlag(FLAGS_transfer_mib)) << 20;
  std::unique_ptr<BenchServers> servers =
      StartServers({absl::StrCat("--cpu_memory_limit=", 2 * transfer + (64 << 20))});
  const std::string& baseline_addr = servers->baseline_address;
  const std::string& daemon_addr = servers->daemon_address;

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(20 << 20);
  args.SetMaxSendMessageSize(20 << 20);
  auto baseline_stub = Baseline::NewStub(
      grpc::CreateCustomChannel(baseline_addr, grpc::InsecureChannelCredentials(), args));
  Client client = Client::Connect(daemon_addr);
  auto session = client.OpenSession("cpu:0");
  if (!session.ok()) return std::fprintf(stderr, "%s\n", session.status().ToString().c_str()), 1;
  client::ProgramSpec empty;
  empty.code = "void empty(void) {}";
  empty.entry = "empty";
  auto program = session->Load(empty);
  auto buffer = session->Alloc(transfer);
  if (!program.ok() || !buffer.ok()) return std::fprintf(stderr, "setup failed\n"), 1;
  std::vector<uint8_t> host(transfer, 7);

  auto empty_rpc = [&] {
    return MedianLatencyUs(iterations, [&](int) {
      grpc::ClientContext ctx;
      Nothing in, out;
      return baseline_stub->Empty(&ctx, in, &out).ok();
    });
  };
  auto launch = [&] {
    return MedianLatencyUs(iterations, [&](int) {
      return session->Launch(*program, {}, {1, 1, 1}, {1, 1, 1}, /*wait=*/true).ok();
    });
  };
  auto plain_upload = [&] {
    return Throughput(transfer, [&] {
      grpc::ClientContext ctx;
      Nothing reply;
      auto writer = baseline_stub->Upload(&ctx, &reply);
      Blob blob;
      for (uint64_t at = 0; at < transfer; at += 1 << 20) {
        blob.set_data(host.data() + at, std::min<uint64_t>(1 << 20, transfer - at));
        if (!writer->Write(blob)) return false;
      }
      writer->WritesDone();
      return writer->Finish().ok();
    });
  };
  auto write = [&] {
    return Throughput(transfer, [&] { return session->Write(*buffer, 0, host).ok(); });
  };
  auto plain_download = [&] {
    return Throughput(transfer, [&] {
      grpc::ClientContext ctx;
      Size size;
      size.set_bytes(transfer);
      auto reader = baseline_stub->Download(&ctx, size);
      Blob blob;
      uint64_t at = 0;
      while (reader->Read(&blob)) {
        std::memcpy(host.data() + at, blob.data().data(), blob.data().size());
        at += blob.data().size();
      }
      return reader->Finish().ok() && at == transfer;
    });
  };
  auto read = [&] {
    return Throughput(transfer, [&] { return session->Read(*buffer, 0, host).ok(); });
  };

  for (int i = 0; i < 200; ++i) (void)session->Launch(*program, {}, {1, 1, 1});
  std::vector<double> latency = InterleavedMedians({empty_rpc, launch}, runs);
  std::vector<double> up = InterleavedMedians({plain_upload, write}, runs);
  std::vector<double> down = InterleavedMedians({plain_download, read}, runs);

  std::printf("replayd eager benchmarks: client and daemon as separate processes on loopback\n");
  std::printf("placement: %s; %d interleaved runs, medians; %d round trips per latency run; %d MiB per transfer\n\n",
              servers->Placement().c_str(),
              runs, iterations, int(transfer >> 20));
  std::printf("%-34s %12s %12s %8s %s\n", "figure", "baseline", "replayd", "ratio", "target");
  std::printf("%-34s %9.1f us %9.1f us %7.2fx %s\n", "empty-kernel Launch vs empty RPC",
              latency[0], latency[1], latency[1] / latency[0], "<= 1.5x");
  std::printf("%-34s %7.0f MiB/s %6.0f MiB/s %7.2fx %s\n", "WriteBuffer vs plain upload", up[0],
              up[1], up[1] / up[0], ">= 0.7x");
  std::printf("%-34s %7.0f MiB/s %6.0f MiB/s %7.2fx %s\n", "ReadBuffer vs plain download",
              down[0], down[1], down[1] / down[0], ">= 0.7x");
  *buffer = client::Buffer();
  return 0;
}

}  // namespace
}  // namespace replayd::bench

int main(int argc, char** argv) { return replayd::bench::BenchMain(argc, argv, replayd::bench::Main); }

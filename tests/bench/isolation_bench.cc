// What --isolation=process costs: two daemons started side by side by this one bench,
// A (in-process, --isolation=shared) and B (the same binary with --isolation=process), each a
// separate process on loopback, measured in the same run, interleaved A B A B, with
// every figure reported as the ratio B/A of the medians over runs:
//   - the 32-kernel chain replayed with wait and a 4 KiB read-back over the Session
//     stream (round trip), and the same replays pipelined from one client (replays/s);
//   - an empty-kernel Launch round trip (eager);
//   - WriteBuffer and ReadBuffer of 1 MiB and of 256 MiB (MiB/s);
//   - OpenSession and its close while the tenant's other sessions keep its executor
//     running (round trip).
// Under --placement=split both daemons (and the executors they spawn, which inherit the
// daemon's affinity) share core 1; the client is on core 0. Only one daemon is driven at
// a time; the other idles.
//
// B can be another daemon binary (--b_replayd, with replayd-executor beside it) and other
// flags (--b_args): e.g. two builds of the executor channel, both isolated.
//
//   replayd_isolation_bench [--runs=5] [--iterations=2000] [--placement=split]
//       [--daemon_args=...] [--b_replayd=PATH] [--b_args=--isolation=process] [--b_first]
//       [--figures=all|pipelined,round_trip,...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "tests/bench/bench_support.h"

ABSL_FLAG(int, iterations, 2000, "round trips per latency run; replays per pipelined run");
ABSL_FLAG(std::string, a_label, "in-process", "what daemon A is, in the report");
ABSL_FLAG(std::string, b_label, "isolated", "what daemon B is, in the report");
ABSL_FLAG(std::string, b_replayd, "", "daemon B's binary (default: the same as A's)");
ABSL_FLAG(std::string, b_args, "--isolation=process", "flags daemon B has beyond A's, split on spaces");
ABSL_FLAG(bool, b_first, false, "start daemon B first and measure it first in each pair (B A B A)");
ABSL_FLAG(int, small_transfers, 32, "1 MiB transfers per run of the 1 MiB figures");
ABSL_FLAG(int, large_transfers, 2, "256 MiB transfers per run of the 256 MiB figures");
ABSL_FLAG(std::string, figures, "all",
          "the figures to measure: all, or some of round_trip, pipelined, launch, write_small, read_small, "
          "write_large, read_large, open_session, separated by commas");

namespace replayd::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1 << 20, kSmall = kMiB, kLarge = 256 * kMiB;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One daemon and what the figures drive on it: the chain session, and an eager session
// with an empty kernel and two buffers.
struct Subject {
  std::unique_ptr<BenchServers> servers;
  ChainSession chain;
  std::unique_ptr<client::Client> client;
  std::unique_ptr<client::Session> session;
  std::unique_ptr<client::Program> empty;
  std::unique_ptr<client::Buffer> small, large;

  Subject(const std::vector<std::string>& args, const std::string& binary) {
    servers = StartServers(args, binary);
    chain = ChainSession::Open(servers->daemon_address);
    client = std::make_unique<client::Client>(client::Client::Connect(servers->daemon_address));
    auto s = client->OpenSession("cpu:0");
    if (!s.ok()) Fail(s.status());
    session = std::make_unique<client::Session>(std::move(*s));
    client::ProgramSpec spec;
    spec.code = "void empty(void) {}";
    spec.entry = "empty";
    auto p = session->Load(spec);
    if (!p.ok()) Fail(p.status());
    empty = std::make_unique<client::Program>(std::move(*p));
    auto a = session->Alloc(kSmall), b = session->Alloc(kLarge);
    if (!a.ok()) Fail(a.status());
    if (!b.ok()) Fail(b.status());
    small = std::make_unique<client::Buffer>(std::move(*a));
    large = std::make_unique<client::Buffer>(std::move(*b));
  }
  ~Subject() {
    small.reset();
    large.reset();
    empty.reset();
    session.reset();
    client.reset();
    chain = ChainSession();
  }
  static void Fail(const absl::Status& s) {
    std::fprintf(stderr, "setting up a daemon: %s\n", s.ToString().c_str());
    std::exit(1);
  }

  double ReplayRoundTripUs(int iterations) {
    const std::vector<client::View> read = {client::View{chain.x.get(), 0, 4096}};
    return MedianLatencyUs(iterations, [&](int) {
      auto r = chain.session->Replay(*chain.graph, {chain.x.get(), int64_t{3}}, true, read);
      return r.ok() && r->reads[0].size() == 4096;
    });
  }
  // OpenSession and its close, while the tenant's other sessions keep its executor running.
  double OpenSessionUs(int iterations) {
    return MedianLatencyUs(iterations, [&](int) {
      auto s = client->OpenSession("cpu:0");
      return s.ok();
    });
  }
  double LaunchRoundTripUs(int iterations) {
    return MedianLatencyUs(iterations, [&](int) {
      return session->Launch(*empty, {}, {1, 1, 1}, {1, 1, 1}, /*wait=*/true).ok();
    });
  }
  // MiB/s of `count` transfers of `host` to (write) or from `buffer`.
  double Transfer(const client::Buffer& buffer, std::vector<uint8_t>& host, int count, bool write) {
    auto start = Clock::now();
    for (int i = 0; i < count; ++i) {
      absl::Status s = write ? session->Write(buffer, 0, host) : session->Read(buffer, 0, host);
      if (!s.ok()) {
        std::fprintf(stderr, "transfer failed: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    }
    return double(host.size()) * count / kMiB / Seconds(Clock::now() - start);
  }
};

std::string Describe(const std::string& binary, const std::vector<std::string>& args) {
  std::string s = binary.empty() ? "this build's replayd" : binary;
  for (const auto& a : args) absl::StrAppend(&s, " ", a);
  return s;
}

int Main() {
  const int runs = absl::GetFlag(FLAGS_runs), iterations = absl::GetFlag(FLAGS_iterations);
  const int small_n = absl::GetFlag(FLAGS_small_transfers), large_n = absl::GetFlag(FLAGS_large_transfers);
  // Both have room for the chain, the two buffers and the transfers of the other session.
  const std::vector<std::string> common = {"--cpu_memory_limit=" + std::to_string(768 * kMiB)};
  std::vector<std::string> b_args = common;
  for (auto& w : SplitArgs(absl::GetFlag(FLAGS_b_args))) b_args.push_back(w);
  const std::string a_binary = absl::GetFlag(FLAGS_replayd), b_binary = absl::GetFlag(FLAGS_b_replayd);
  const bool b_first = absl::GetFlag(FLAGS_b_first);
  std::unique_ptr<Subject> a_owner, b_owner;
  if (b_first) b_owner = std::make_unique<Subject>(b_args, b_binary.empty() ? a_binary : b_binary);
  a_owner = std::make_unique<Subject>(common, a_binary);
  if (!b_first) b_owner = std::make_unique<Subject>(b_args, b_binary.empty() ? a_binary : b_binary);
  Subject &a = *a_owner, &b = *b_owner;
  // The order each pair runs in (and the daemons started in).
  const std::vector<Subject*> order = b_first ? std::vector<Subject*>{&b, &a} : std::vector<Subject*>{&a, &b};
  std::vector<uint8_t> small_host(kSmall, 7), large_host(kLarge, 7);

  // Warm both: the chain's pipeline, the launch path, each buffer's pages.
  for (Subject* s : order) {
    (void)s->chain.Pipelined(200);
    (void)s->LaunchRoundTripUs(200);
    (void)s->Transfer(*s->small, small_host, 4, true);
    (void)s->Transfer(*s->large, large_host, 1, true);
  }

  // The figures, each measured on A and on B; --figures picks some by name.
  struct Figure {
    const char* name;  // for --figures
    const char* label;
    const char* unit;  // "us": a latency; else a rate
    std::function<double(Subject&)> measure;
  };
  const std::vector<Figure> all = {
      {"round_trip", "chain replay + 4 KiB read, round trip", "us",
       [&](Subject& s) { return s.ReplayRoundTripUs(iterations); }},
      {"pipelined", "chain replays pipelined, 1 client", "/s", [&](Subject& s) { return s.chain.Pipelined(iterations); }},
      {"launch", "empty-kernel Launch, round trip", "us", [&](Subject& s) { return s.LaunchRoundTripUs(iterations); }},
      {"write_small", "WriteBuffer 1 MiB", "MiB/s",
       [&](Subject& s) { return s.Transfer(*s.small, small_host, small_n, true); }},
      {"read_small", "ReadBuffer 1 MiB", "MiB/s",
       [&](Subject& s) { return s.Transfer(*s.small, small_host, small_n, false); }},
      {"write_large", "WriteBuffer 256 MiB", "MiB/s",
       [&](Subject& s) { return s.Transfer(*s.large, large_host, large_n, true); }},
      {"read_large", "ReadBuffer 256 MiB", "MiB/s",
       [&](Subject& s) { return s.Transfer(*s.large, large_host, large_n, false); }},
      {"open_session", "OpenSession + close, executor running", "us",
       [&](Subject& s) { return s.OpenSessionUs(iterations / 4 + 1); }},
  };
  const std::string wanted = absl::GetFlag(FLAGS_figures);
  const std::vector<std::string> picked = absl::StrSplit(wanted, ',', absl::SkipEmpty());
  std::vector<const Figure*> figures;
  for (const Figure& f : all)
    if (wanted == "all" || std::find(picked.begin(), picked.end(), f.name) != picked.end()) figures.push_back(&f);
  if (figures.empty()) {
    std::fprintf(stderr, "--figures=%s names none of the figures\n", wanted.c_str());
    return 2;
  }
  // Subjects in this order within each run: figure 1 A, figure 1 B, figure 2 A, ... (B
  // before A with --b_first).
  std::vector<std::function<double()>> subjects;
  for (const Figure* f : figures)
    for (Subject* s : order) subjects.push_back([f, s] { return f->measure(*s); });
  std::vector<double> m = InterleavedMedians(subjects, runs);
  if (b_first)  // back to A, B within each pair
    for (size_t i = 0; i + 1 < m.size(); i += 2) std::swap(m[i], m[i + 1]);

  const std::string a_label = absl::GetFlag(FLAGS_a_label), b_label = absl::GetFlag(FLAGS_b_label);
  std::printf("replayd isolation benchmark: two daemons, A and B, measured in the same run\n");
  std::printf("A (%s): %s\n", a_label.c_str(), Describe(a_binary, common).c_str());
  std::printf("B (%s): %s\n", b_label.c_str(), Describe(b_binary.empty() ? a_binary : b_binary, b_args).c_str());
  if (!absl::GetFlag(FLAGS_daemon_args).empty())
    std::printf("both with --daemon_args: %s\n", absl::GetFlag(FLAGS_daemon_args).c_str());
  std::printf("client and daemons as separate processes on loopback; placement: %s%s\n",
              a.servers->Placement().c_str(), a.servers->split ? " (executors inherit the daemon's core)" : "");
  std::printf("%d interleaved runs (%s), medians; %d round trips or replays per run; %d x 1 MiB and %d x 256 MiB "
              "per transfer run\n\n",
              runs, b_first ? "B A B A, B started first" : "A B A B", iterations, small_n, large_n);
  std::printf("%-46s %14s %14s %8s\n", "figure", a_label.c_str(), b_label.c_str(), "B/A");
  for (size_t i = 0; i < figures.size(); ++i) {
    const Figure& f = *figures[i];
    const double va = m[2 * i], vb = m[2 * i + 1];
    if (std::strcmp(f.unit, "us") == 0) {
      std::printf("%-46s %11.1f us %11.1f us %7.2fx\n", f.label, va, vb, vb / va);
    } else {
      std::printf("%-46s %9.0f %-4s %9.0f %-4s %7.2fx\n", f.label, va, f.unit, vb, f.unit, vb / va);
    }
  }
  return 0;
}

}  // namespace
}  // namespace replayd::bench

int main(int argc, char** argv) { return replayd::bench::BenchMain(argc, argv, replayd::bench::Main); }

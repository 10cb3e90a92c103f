// Load: many concurrent clients, each in a session of its own, replaying a captured chain
// with a changing variable against a daemon process on loopback, every result checked
// against the host; then the daemon's memory and threads, which must come back to where a
// warm-up left them.
//
// The sizes come from the environment, so ctest runs a short load and the same binary runs
// the full one or a soak (tests/integration/load.sh):
//   REPLAYD_LOAD_CLIENTS   concurrent clients (64)
//   REPLAYD_LOAD_REPLAYS   replays per client (200 under ctest)
//   REPLAYD_LOAD_SECONDS   a soak: each client replays until this many seconds have passed
//   REPLAYD_LOAD_ISOLATION the daemon's --isolation (process)
// Even-numbered clients replay over the Session stream (one at a time, and pipelined
// windows of 8), odd-numbered ones through unary ReplayGraph calls.
#include <gmock/gmock.h>

#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/daemon_processes.h"
#include "tests/support/process_footprint.h"
#include "tests/support/status_macros.h"

namespace replayd::client {
namespace {

constexpr int kN = 256;  // floats per buffer
const Variable kPos{"pos", 1, 1000000, 1};

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  int64_t n = 0;
  return v && absl::SimpleAtoi(v, &n) ? n : fallback;
}

// The chain the clients capture: out = ((in * 2 + pos) * 2 + pos + 1) * 2 + 2 * pos.
std::vector<float> ChainReference(const std::vector<float>& in, int64_t pos) {
  std::vector<float> v = in;
  for (int64_t k : {pos, pos + 1, 2 * pos})
    for (float& x : v) x = x * 2.0f + float(k);
  return v;
}

// One client's work: counts of replays checked, and the first thing that went wrong.
struct ClientRun {
  uint64_t checked = 0;
  std::string error;
};

class Client1 {
 public:
  Client1(const std::string& address, int index) : index_(index), client_(Client::Connect(address)) {}

  // Opens the session, captures the chain and replays it `replays` times (or until
  // `until`), checking each result.
  void Run(int64_t replays, absl::Time until, ClientRun& run) {
    absl::Status s = RunOrFail(replays, until, run.checked);
    if (!s.ok()) run.error = absl::StrCat("client ", index_, " after ", run.checked, " replays: ", s.ToString());
  }

 private:
  absl::Status RunOrFail(int64_t replays, absl::Time until, uint64_t& checked) {
    absl::StatusOr<Session> opened = client_.OpenSession("cpu:0");
    if (!opened.ok()) return opened.status();
    Session& session = *opened;
    absl::StatusOr<Program> affine =
        session.Load({"cpu-c", kAffineSource, "affine", *ParseSignature("out,in,int32,int32"), {}});
    if (!affine.ok()) return affine.status();
    absl::StatusOr<Buffer> in = session.Alloc(kN * 4);
    if (!in.ok()) return in.status();
    absl::StatusOr<Buffer> out = session.Alloc(kN * 4);
    if (!out.ok()) return out.status();
    std::mt19937 rng(static_cast<uint32_t>(index_));
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> input(kN);
    for (float& x : input) x = d(rng);
    if (absl::Status s = session.WriteVector(*in, input); !s.ok()) return s;
    absl::StatusOr<Graph> graph = Capture(session, *affine, *in, *out);
    if (!graph.ok()) return graph.status();

    const bool stream = index_ % 2 == 0;
    auto check = [&](int64_t pos, const absl::StatusOr<ReplayResult>& r) -> absl::Status {
      if (!r.ok()) return r.status();
      if (r->reads.size() != 1 || r->reads[0].size() != kN * 4)
        return absl::InternalError(absl::StrCat("replay at pos ", pos, " read ", r->reads.size(), " views"));
      std::vector<float> got(kN);
      std::memcpy(got.data(), r->reads[0].data(), kN * 4);
      if (got != ChainReference(input, pos))
        return absl::DataLossError(absl::StrCat("replay at pos ", pos, " read ", got[0], ", not ",
                                                ChainReference(input, pos)[0]));
      ++checked;
      return absl::OkStatus();
    };
    int64_t pos = 1 + index_;
    auto next_pos = [&] { return pos = pos % kPos.max + 1 + (pos * 7) % 13; };
    auto more = [&] {
      return until == absl::InfinitePast() ? checked < static_cast<uint64_t>(replays) : absl::Now() < until;
    };
    const std::vector<View> reads = {View{&*out}};
    while (more()) {
      if (!stream) {
        const int64_t p = next_pos();
        if (absl::Status s = check(p, session.ReplayUnary(*graph, {&*in, &*out, p}, false, reads)); !s.ok()) return s;
        continue;
      }
      if (checked % 64 < 56) {
        const int64_t p = next_pos();
        if (absl::Status s = check(p, session.Replay(*graph, {&*in, &*out, p}, false, reads)); !s.ok()) return s;
        continue;
      }
      // A pipelined window: eight replays queued before the first is waited for.
      std::vector<std::pair<int64_t, std::future<absl::StatusOr<ReplayResult>>>> window;
      for (int i = 0; i < 8; ++i) {
        const int64_t p = next_pos();
        window.emplace_back(p, session.ReplayAsync(*graph, {&*in, &*out, p}, false, reads));
      }
      for (auto& [p, f] : window)
        if (absl::Status s = check(p, f.get()); !s.ok()) return s;
    }
    return session.Close();
  }

  static absl::StatusOr<Graph> Capture(Session& session, const Program& affine, const Buffer& in, const Buffer& out) {
    if (absl::Status s = session.BeginCapture({&in}, {kPos}); !s.ok()) return s;
    absl::StatusOr<Buffer> t1 = session.Alloc(kN * 4);
    if (!t1.ok()) return t1.status();
    absl::StatusOr<Buffer> t2 = session.Alloc(kN * 4);
    if (!t2.ok()) return t2.status();
    struct Step {
      const Buffer* dst;
      const Buffer* src;
      const char* k;
    };
    for (const Step& step : {Step{&*t1, &in, "pos"}, Step{&*t2, &*t1, "pos + 1"}, Step{&out, &*t2, "2 * pos"}}) {
      LaunchSpec spec;
      spec.args = {View{step.dst}, View{step.src}, int64_t{kN}, Expr{step.k}};
      spec.variables = {{kPos, 1}};
      if (absl::Status s = session.Launch(affine, spec).status(); !s.ok()) return s;
    }
    *t1 = Buffer();
    *t2 = Buffer();
    return session.EndCapture({&out});
  }

  const int index_;
  Client client_;
};

// Runs `clients` clients at once, each `replays` replays (or until `seconds` passed);
// returns what they checked, failing the test with every client's first error.
uint64_t RunClients(const std::string& address, int clients, int64_t replays, int64_t seconds) {
  const absl::Time until = seconds > 0 ? absl::Now() + absl::Seconds(seconds) : absl::InfinitePast();
  std::vector<ClientRun> runs(clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i)
    threads.emplace_back([&, i] { Client1(address, i).Run(replays, until, runs[i]); });
  for (std::thread& t : threads) t.join();
  uint64_t checked = 0;
  for (const ClientRun& r : runs) {
    EXPECT_EQ(r.error, "");
    checked += r.checked;
  }
  return checked;
}

TEST(LoadTest, ManyClientsReplayWithEveryResultCheckedAndTheDaemonComesBackToItsFootprint) {
  const int clients = static_cast<int>(EnvInt("REPLAYD_LOAD_CLIENTS", 64));
  const int64_t replays = EnvInt("REPLAYD_LOAD_REPLAYS", 200);
  const int64_t seconds = EnvInt("REPLAYD_LOAD_SECONDS", 0);
  const char* isolation = std::getenv("REPLAYD_LOAD_ISOLATION");
  DaemonProcesses daemons;
  // Leases longer than any run, so the clients' own closes free what they held; a tenant
  // of its own with room for every client's session. No linger: the executor ends with
  // the last session, so the idle footprint is the same whenever it is read.
  DaemonProcess d = daemons.Start({"--log_level=warn", "--lease_seconds=600", "--executor_linger=0",
                                   absl::StrCat("--isolation=", isolation ? isolation : "process")});
  ASSERT_GT(d.pid, 0);

  // A warm-up at full concurrency: the server's threads, the executor, the compile and
  // graph caches, the allocator's arenas all reach their working size.
  const absl::Time warm_start = absl::Now();
  EXPECT_EQ(RunClients(d.address, clients, 20, 0), static_cast<uint64_t>(clients) * 20);
  const absl::Duration warm = absl::Now() - warm_start;
  const Footprint before = FootprintOf(d.pid);

  const absl::Time start = absl::Now();
  const uint64_t checked = RunClients(d.address, clients, replays, seconds);
  const absl::Duration took = absl::Now() - start;
  if (seconds == 0) {
    EXPECT_EQ(checked, static_cast<uint64_t>(clients) * static_cast<uint64_t>(replays));
  }
  // The clients closed their sessions; what the daemon holds now is its idle footprint.
  const absl::Time ended = absl::Now();
  const Footprint after = Settled(d.pid, before.threads);
  const absl::Duration settling = absl::Now() - ended;

  const double rss_growth_mib = (static_cast<double>(after.rss_bytes) - static_cast<double>(before.rss_bytes)) / (1 << 20);
  std::printf(
      "load: %d clients (%s), %llu replays checked in %.1f s (%.0f replays/s); warm-up %.1f s\n"
      "daemon and executors: %d -> %d processes, RSS %.1f -> %.1f MiB (%+.1f MiB), threads %lld -> %lld "
      "(settled %.1f s after the last client)\n",
      clients, isolation ? isolation : "process", static_cast<unsigned long long>(checked), absl::ToDoubleSeconds(took),
      static_cast<double>(checked) / absl::ToDoubleSeconds(took), absl::ToDoubleSeconds(warm), before.processes,
      after.processes, static_cast<double>(before.rss_bytes) / (1 << 20),
      static_cast<double>(after.rss_bytes) / (1 << 20), rss_growth_mib, static_cast<long long>(before.threads),
      static_cast<long long>(after.threads), absl::ToDoubleSeconds(settling));
  // Bounded growth, whatever the number of replays: 16 MiB of resident memory (the
  // allocator keeps some freed pages), and, once idle, no thread more than after the
  // warm-up.
  EXPECT_LT(rss_growth_mib, 16.0);
  EXPECT_LE(after.threads, before.threads) << ThreadNames(d.pid);
  EXPECT_EQ(after.processes, before.processes);
}

}  // namespace
}  // namespace replayd::client

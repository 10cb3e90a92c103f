// The daemon's metrics as an operator reads them: replayd with --metrics_listen, scraped by
// a real Prometheus server (Debian's prometheus) on loopback, work run through the daemon
// by two tenants, and the figures read back through Prometheus' HTTP API; the scrape
// passes `promtool check metrics`, and `replayctl stats` sums it up.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "tests/support/free_port.h"
#include "tests/support/status_macros.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tenants_file.h"

extern char** environ;

namespace replayd::client {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr char kPromtool[] = "/usr/bin/promtool";

// Starts argv with stdin from `in` and stdout and stderr to `out` (each if given).
pid_t Spawn(const std::vector<std::string>& argv, const std::filesystem::path& out = {},
            const std::filesystem::path& in = {}) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!in.empty()) posix_spawn_file_actions_addopen(&actions, 0, in.c_str(), O_RDONLY, 0);
  if (!out.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string ReadAll(const std::filesystem::path& path) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

// A child process, ended (SIGTERM, then waited for) when the test is done with it.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  ~Child() {
    if (pid_ > 0) Stop();
  }
  pid_t pid() const { return pid_; }
  int Stop() {
    kill(pid_, SIGTERM);
    const int code = WaitExit(pid_);
    pid_ = -1;
    return code;
  }

 private:
  pid_t pid_;
};

// The value of the PromQL `query` (one number: the test's queries are sums), once
// Prometheus has scraped a value equal to `want`; the last value seen otherwise, or -1
// if there was none.
double QueryUntil(httplib::Client& prometheus, const std::string& query, double want) {
  static const std::regex kValue(R"re("value":\[[0-9.e+]+,"([^"]+)"\])re");
  double last = -1;
  for (int attempt = 0; attempt < 600; ++attempt) {  // Prometheus scrapes every second
    httplib::Params params = {{"query", query}};
    httplib::Result r = prometheus.Get("/api/v1/query", params, httplib::Headers{});
    std::smatch m;
    if (r && r->status == 200 && std::regex_search(r->body, m, kValue)) {
      last = std::stod(m[1].str());
      if (last == want) return last;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return last;
}

// The replayd-executor processes among `daemon`'s children.
std::vector<pid_t> ExecutorsOf(pid_t daemon) {
  std::vector<pid_t> out;
  for (const auto& task : std::filesystem::directory_iterator(absl::StrCat("/proc/", daemon, "/task"))) {
    std::ifstream children(task.path() / "children");
    for (pid_t child; children >> child;)
      if (absl::StrContains(ReadAll(absl::StrCat("/proc/", child, "/cmdline")), "replayd-executor"))
        out.push_back(child);
  }
  return out;
}

const char kAddOne[] = "void add_one(float *x, int n) { for (int i = 0; i < n; ++i) x[i] += 1.0f; }";

class MetricsProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kPrometheus, X_OK) != 0 || access(kPromtool, X_OK) != 0)
      GTEST_SKIP() << "needs Debian's prometheus package (deploy/install-deps.sh installs it)";
    std::ofstream(dir_.path() / "tenants.textproto")
        << TenantText("alice", "alice-token", "") << TenantText("bob", "bob-token", "");
    address_ = absl::StrCat("127.0.0.1:", FreePort());
    metrics_port_ = FreePort();
    daemon_ = std::make_unique<Child>(
        Spawn({REPLAYD_BINARY, "--listen=" + address_, absl::StrCat("--metrics_listen=:", metrics_port_),
               "--tenants=" + (dir_.path() / "tenants.textproto").string(),
               "--cache_dir=" + (dir_.path() / "cache").string(), "--log_level=warn",
               "--lease_seconds=3600",  // alice's session outlives the waits for Prometheus
               "--executor_linger=0"},  // bob's executor ends with his session: alice's is the one left
              dir_.path() / "replayd.log"));
    ASSERT_GT(daemon_->pid(), 0);
    absl::StatusOr<std::vector<v1::Device>> up = absl::UnavailableError("not yet");
    for (int i = 0; i < 100 && !up.ok(); ++i) {
      up = Connect("alice-token").ListDevices();
      if (!up.ok()) absl::SleepFor(absl::Milliseconds(100));
    }
    ASSERT_TRUE(up.ok()) << up.status() << ReadAll(dir_.path() / "replayd.log");
  }

  Client Connect(const std::string& token) {
    ClientOptions o;
    o.token = token;
    return Client::Connect(address_, o);
  }

  std::string Scrape() {
    httplib::Client http("127.0.0.1", metrics_port_);
    httplib::Result r = http.Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    return r ? r->body : "";
  }

  TempDir dir_;
  std::string address_;
  int metrics_port_ = 0;
  std::unique_ptr<Child> daemon_;
};

TEST_F(MetricsProcessTest, PrometheusReadsBackTheWorkDone) {
  constexpr int kLaunches = 5, kStreamReplays = 20, kUnaryReplays = 7, kSequence = 13;
  // alice: a compile, eager launches, a captured graph replayed on the stream, by unary
  // calls and as a sequence; a session left open.
  Client alice = Connect("alice-token");
  ASSERT_OK_AND_ASSIGN(Session session, alice.OpenSession("cpu:0"));
  ASSERT_OK_AND_ASSIGN(v1::Signature signature, ParseSignature("inout,int32"));
  const ProgramSpec spec{"cpu-c", kAddOne, "add_one", signature, {}};
  ASSERT_OK_AND_ASSIGN(Program program, session.Load(spec));
  ASSERT_FALSE(program.info().cache_hit());
  ASSERT_OK_AND_ASSIGN(Buffer x, session.Alloc(64));
  for (int i = 0; i < kLaunches; ++i) ASSERT_OK(session.Launch(program, {View{&x}, int64_t{16}}, {1, 1, 1}).status());
  ASSERT_OK(session.BeginCapture({&x}, {}));
  ASSERT_OK(session.Launch(program, {View{&x}, int64_t{16}}, {1, 1, 1}).status());
  ASSERT_OK_AND_ASSIGN(Graph graph, session.EndCapture({&x}));
  // The same capture again: answered by the cached graph (a graph cache hit).
  ASSERT_OK(session.BeginCapture({&x}, {}));
  ASSERT_OK(session.Launch(program, {View{&x}, int64_t{16}}, {1, 1, 1}).status());
  ASSERT_OK(session.EndCapture({&x}).status());
  for (int i = 0; i < kStreamReplays; ++i) ASSERT_OK(session.Replay(graph, {&x}).status());
  for (int i = 0; i < kUnaryReplays; ++i) ASSERT_OK(session.ReplayUnary(graph, {&x}).status());
  SequenceSpec sequence;
  sequence.vectors.assign(kSequence, {&x});
  ASSERT_OK_AND_ASSIGN(SequenceResult sequenced, session.ReplaySequence(graph, sequence));
  ASSERT_EQ(sequenced.replays, static_cast<uint32_t>(kSequence));
  ASSERT_OK_AND_ASSIGN(std::vector<float> values, session.ReadVector<float>(x, 16));
  ASSERT_EQ(values[0], kLaunches + 2 + kStreamReplays + kUnaryReplays + kSequence);
  // bob: the same program, from the compile cache, one replay, and a session closed.
  {
    Client bob = Connect("bob-token");
    ASSERT_OK_AND_ASSIGN(Session other, bob.OpenSession("cpu:0"));
    ASSERT_OK_AND_ASSIGN(Program loaded, other.Load(spec));
    ASSERT_TRUE(loaded.info().cache_hit());
    ASSERT_OK(other.Close());
  }
  // A call that fails: an unknown token.
  EXPECT_EQ(Connect("nobody").OpenSession("cpu:0").status().code(), absl::StatusCode::kUnauthenticated);

  // Prometheus, scraping the daemon every second.
  const int prometheus_port = FreePort();
  const auto config = dir_.path() / "prometheus.yml";
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                        << "scrape_configs:\n  - job_name: replayd\n    static_configs:\n"
                        << "      - targets: ['127.0.0.1:" << metrics_port_ << "']\n";
  Child prometheus(Spawn({kPrometheus, "--config.file=" + config.string(),
                          "--storage.tsdb.path=" + (dir_.path() / "tsdb").string(),
                          absl::StrCat("--web.listen-address=127.0.0.1:", prometheus_port), "--log.level=warn"},
                         dir_.path() / "prometheus.log"));
  ASSERT_GT(prometheus.pid(), 0);
  httplib::Client api("127.0.0.1", prometheus_port);
  api.set_connection_timeout(2);

  const int replays = kStreamReplays + kUnaryReplays + kSequence;
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_replays_total{device="cpu:0",tenant="alice"}))", replays), replays)
      << ReadAll(dir_.path() / "prometheus.log");
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_replay_duration_seconds_count{tenant="alice"}))",
                       kStreamReplays + kUnaryReplays),
            kStreamReplays + kUnaryReplays);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_launches_total{tenant="alice"}))", kLaunches + 2), kLaunches + 2);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_launch_duration_seconds_bucket{tenant="alice",le="+Inf"}))",
                       kLaunches + 2),
            kLaunches + 2);
  EXPECT_EQ(QueryUntil(api,
                       R"(sum(replayd_requests_total{method="Replayd/ReplayGraph",code="OK",device="cpu:0",tenant="alice"}))",
                       kUnaryReplays),
            kUnaryReplays);
  EXPECT_EQ(QueryUntil(api, R"(clamp_max(count(replayd_requests_total{method="Replayd/OpenSession",device="cpu:0"}), 1))", 1), 1);
  // Only devices the daemon serves, or none, label the requests.
  EXPECT_EQ(QueryUntil(api, R"(count(replayd_requests_total{device!~"|cpu:0"}) or vector(0))", 0), 0);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_requests_total{method="Replayd/OpenSession",code="UNAUTHENTICATED"}))", 1),
            1);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_stream_operations_total{tenant="alice",op="replay",code="OK"}))",
                       kStreamReplays),
            kStreamReplays);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_stream_operation_duration_seconds_count{tenant="alice",op="replay"}))",
                       kStreamReplays),
            kStreamReplays);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_compiles_total{tenant="alice"}))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(count(replayd_compile_seconds_total{tenant="alice"} > 0))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_compile_seconds_total{tenant="bob"}))", 0), 0);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_graph_cache_hits_total{tenant="alice"}))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_graph_cache_evictions_total{tenant="alice"}))", 0), 0);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_graph_cache_graphs{tenant="alice"}))", 1), 1);
  // The scheduler's figures for alice's device and tenant (one client at a time: whether
  // any of its work waited behind another's is left to the scheduler's own tests).
  EXPECT_EQ(QueryUntil(api, R"(count(replayd_scheduler_queue_depth{device="cpu:0"}))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(count(replayd_scheduler_waits_total{device="cpu:0",tenant="alice"}))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(count(replayd_scheduler_wait_seconds_total{device="cpu:0",tenant="alice"}))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_scheduler_rejected_total{tenant="alice"}))", 0), 0);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_compile_cache_hits_total{tenant="bob"}))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_graph_cache_instantiations_total{tenant="alice"}))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_graph_cache_misses_total{tenant="alice"}))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_open_sessions{tenant="alice"}))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_open_sessions{tenant="bob"}))", 0), 0);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_session_memory_bytes{tenant="alice"}))", 64), 64);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_executors_started_total{tenant="alice"}))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_executors_died_total) or vector(0))", 0), 0) << "no executor died";
  EXPECT_EQ(QueryUntil(api, R"(count(replayd_device_seconds_total{tenant="alice"} > 0))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(count(replayd_device_memory_used_bytes{device="cpu:0"} > 0))", 1), 1);
  EXPECT_EQ(QueryUntil(api, R"(sum(replayd_device_memory_used_bytes + replayd_device_memory_free_bytes)
                               - sum(replayd_device_memory_total_bytes))",
                       0),
            0);
  EXPECT_EQ(prometheus.Stop(), 0);

  // promtool's lint of a scrape.
  const auto scrape = dir_.path() / "scrape.txt";
  std::ofstream(scrape) << Scrape();
  const auto lint = dir_.path() / "promtool.txt";
  EXPECT_EQ(WaitExit(Spawn({kPromtool, "check", "metrics"}, lint, scrape)), 0) << ReadAll(lint);
  EXPECT_EQ(ReadAll(lint), "") << "promtool has remarks";

  // replayctl stats.
  const auto stats = dir_.path() / "stats.txt";
  EXPECT_EQ(WaitExit(Spawn({REPLAYCTL_BINARY, "stats", absl::StrCat("--metrics=127.0.0.1:", metrics_port_)}, stats)),
            0)
      << ReadAll(stats);
  const std::string summary = ReadAll(stats);
  EXPECT_TRUE(absl::StrContains(summary, "cpu:0: memory ")) << summary;
  EXPECT_TRUE(std::regex_search(summary, std::regex(absl::StrCat(R"(\n  alice +1 +64 B +)", replays, " "))))
      << summary;
  EXPECT_TRUE(std::regex_search(summary, std::regex(R"(\n  bob +0 +0 B +0 )"))) << summary;

  // alice's executor killed from outside: a death by signal.
  const std::vector<pid_t> executors = ExecutorsOf(daemon_->pid());
  ASSERT_EQ(executors.size(), 1u);
  ASSERT_EQ(kill(executors[0], SIGKILL), 0);
  const std::string died = R"(replayd_executors_died_total{device="cpu:0",tenant="alice",cause="signal"} 1)";
  std::string scraped;
  for (int i = 0; i < 300 && !absl::StrContains(scraped, died); ++i) {
    if (i > 0) absl::SleepFor(absl::Milliseconds(100));
    scraped = Scrape();
  }
  EXPECT_TRUE(absl::StrContains(scraped, died)) << scraped;
  EXPECT_EQ(daemon_->Stop(), 0);
}

// A CPU buffer of 64 KiB or more is mapped in the daemon and in its executor while it lives.
TEST_F(MetricsProcessTest, SharedBuffersAreCountedWhileTheyLive) {
  const std::string none = R"(replayd_executor_shared_buffers{device="cpu:0"} 0)";
  const std::string one = R"(replayd_executor_shared_buffers{device="cpu:0"} 1)";
  Client alice = Connect("alice-token");
  ASSERT_OK_AND_ASSIGN(Session session, alice.OpenSession("cpu:0"));
  EXPECT_TRUE(absl::StrContains(Scrape(), none)) << Scrape();
  {
    ASSERT_OK_AND_ASSIGN(Buffer big, session.Alloc(1 << 20));
    ASSERT_OK_AND_ASSIGN(Buffer small, session.Alloc(4096));
    EXPECT_TRUE(absl::StrContains(Scrape(), one)) << Scrape();
    ASSERT_OK(session.WriteVector(big, std::vector<float>(1 << 18, 2.5f)));
    ASSERT_OK_AND_ASSIGN(std::vector<float> back, session.ReadVector<float>(big, 1 << 18));
    EXPECT_EQ(back, std::vector<float>(1 << 18, 2.5f));
  }
  EXPECT_TRUE(absl::StrContains(Scrape(), none)) << Scrape();
  EXPECT_OK(session.Close());  // or the daemon's drain waits for it
  EXPECT_EQ(daemon_->Stop(), 0);
}

TEST_F(MetricsProcessTest, OnlyMetricsIsServed) {
  httplib::Client http("127.0.0.1", metrics_port_);
  httplib::Result other = http.Get("/");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  httplib::Result metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_TRUE(absl::StrContains(metrics->body, "# TYPE replayd_replays_total counter\n"));
}

TEST(MetricsFlagTest, ABadMetricsAddressStopsTheDaemonAtStart) {
  TempDir dir;
  const auto log = dir.path() / "log";
  pid_t pid = Spawn({REPLAYD_BINARY, absl::StrCat("--listen=127.0.0.1:", FreePort()), "--metrics_listen=:99999",
                     "--cache_dir=" + dir.path().string()},
                    log);
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitExit(pid), 1);
  EXPECT_TRUE(absl::StrContains(ReadAll(log), "metrics address \":99999\"")) << ReadAll(log);
}

}  // namespace
}  // namespace replayd::client

// The isolation fault matrix over a real daemon: for each way a cpu-c kernel of tenant
// "research" can misbehave in its executor (crash, exit, overflow its stack, never return,
// write far outside its buffer, try fork/open/system/socket, include /etc/passwd), and
// for its executor killed from outside, the faulting call answers as isolation.md
// promises, tenant "prod" replays a graph on a thread of its own throughout with every
// result right, and afterwards the device's memory, the daemon's threads and the
// executor processes are back where they were and research's next session computes.
// Both tenants say `isolation: ISOLATION_PROCESS`, so the matrix checks the same thing
// in ctest's shared.* pass (REPLAYD_TEST_ISOLATION=shared), where only the defaults change.
#include <gmock/gmock.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/support/status_macros.h"
#include "tests/support/tenants_file.h"

namespace replayd::client {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Polls `done` every 20 ms until it holds or `within` passes; returns its last answer.
bool PollUntil(const std::function<bool()>& done, absl::Duration within = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + within;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

std::string FirstLineOf(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

// The threads of this process, where the daemon runs (executors are processes of their
// own). With `own_only`, those that kept the process's name: the daemon's std::threads,
// not gRPC's, which name theirs and replace them in their pools as they see fit.
std::set<pid_t> Threads(bool own_only = false) {
  const std::string own = FirstLineOf("/proc/self/comm");
  std::error_code error;
  std::set<pid_t> tids;
  for (std::filesystem::directory_iterator it("/proc/self/task", error), end; !error && it != end; it.increment(error))
    if (!own_only || FirstLineOf(it->path() / "comm") == own) tids.insert(std::stoi(it->path().filename().string()));
  return tids;
}

// "name (tid), ..." for this process's threads `tids`.
std::string ThreadNames(const std::set<pid_t>& tids) {
  std::string out;
  for (pid_t tid : tids)
    absl::StrAppend(&out, out.empty() ? "" : ", ", FirstLineOf("/proc/self/task/" + std::to_string(tid) + "/comm"),
                    " (", tid, ")");
  return out;
}

std::set<pid_t> Minus(const std::set<pid_t>& a, const std::set<pid_t>& b) {
  std::set<pid_t> out;
  for (pid_t p : a)
    if (!b.count(p)) out.insert(p);
  return out;
}

// One process as /proc/<pid>/stat describes it.
struct ProcStat {
  std::string comm;
  pid_t ppid = 0;
  uint64_t cpu_ticks = 0;  // utime + stime
};

std::optional<ProcStat> ReadStat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  // "pid (comm) state ppid ... utime stime ...": comm may hold spaces and parentheses.
  const size_t open = line.find('('), close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos) return std::nullopt;
  ProcStat stat;
  stat.comm = line.substr(open + 1, close - open - 1);
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  std::vector<std::string> fields;
  while (rest >> field) fields.push_back(field);
  if (fields.size() < 13) return std::nullopt;  // fields[0] is the state, [11] utime, [12] stime
  stat.ppid = std::stoi(fields[1]);
  stat.cpu_ticks = std::stoull(fields[11]) + std::stoull(fields[12]);
  return stat;
}

// This process's children that run replayd-executor, an unreaped (zombie) one included:
// matched by the command name in /proc/<pid>/stat, which a zombie keeps (its cmdline is
// empty), and which the kernel cuts to 15 characters.
std::set<pid_t> ExecutorChildren() {
  const std::string comm = std::filesystem::path(REPLAYD_EXECUTOR_BINARY).filename().string().substr(0, 15);
  std::set<pid_t> pids;
  std::error_code error;
  for (std::filesystem::directory_iterator it("/proc", error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    std::optional<ProcStat> stat = ReadStat(pid);
    if (stat && stat->ppid == getpid() && stat->comm == comm) pids.insert(pid);
  }
  return pids;
}

// How a case's kernel ends.
enum class Outcome {
  kDies,           // the executor dies: the launch and later calls FAILED_PRECONDITION
  kRunsPastLimit,  // the launch DEADLINE_EXCEEDED, later calls FAILED_PRECONDITION
  kCallRefused,    // the kernel's system call fails and it returns; the session goes on
  kLoadRefused,    // Load answers INVALID_ARGUMENT; the session goes on
};

// One misbehaving cpu-c program `void probe(int *out)`; a refused call's kernel writes
// the call's return value to out[0] and errno to out[1]. "TOUCHED" in the code is
// replaced by a path of this run that must not come to exist.
struct FaultCase {
  const char* name;
  const char* code;
  Outcome outcome;
  const char* cause = "";     // kDies, kRunsPastLimit: what the message names
  std::set<int> errnos = {};  // kCallRefused: the errno the call may set; empty: a non-zero return is enough
};

void PrintTo(const FaultCase& fault, std::ostream* os) { *os << fault.name; }

constexpr char kProbeSignature[] = "inout";

// What research holds besides its kernel's buffer, so that the memory check means something.
constexpr uint64_t kHeld = 4 << 20;

// A launch of some tens of milliseconds.
constexpr char kBusySource[] = "void busy(int *x) { for (long i = 0; i < 30000000L; ++i) *(volatile int *)x += 1; }";

class FaultMatrixTest : public DaemonFixture {
 protected:
  // The daemon starts in each test, with research's launch limit.
  void SetUp() override {}

  void TearDown() override { StopProdLoop(); }

  void StartDaemon(int research_max_launch_seconds) {
    const std::filesystem::path file = cache_.path() / "tenants.textproto";
    std::ofstream(file) << TenantText("research", "research-token",
                                      absl::StrCat("  isolation: ISOLATION_PROCESS\n  max_launch_seconds: ",
                                                   research_max_launch_seconds, "\n"))
                        << TenantText("prod", "prod-token", "  isolation: ISOLATION_PROCESS\n");
    Options options;
    options.tenants_file = file;
    // No linger: research's executors end with its sessions, so the daemon comes back to
    // its baseline at once.
    options.adjust = [](DaemonOptions& d) { d.executor_linger = absl::ZeroDuration(); };
    Start(options);
    research_ = std::make_unique<Client>(As("research-token"));
    prod_ = std::make_unique<Client>(As("prod-token"));
    observer_ = std::make_unique<Client>(As("prod-token"));
  }

  Client As(const std::string& token) {
    ClientOptions o;
    o.token = token;
    return Client::Connect(daemon_->address(), o);
  }

  // cpu:0's free memory; the fixture's own client has no token.
  uint64_t FreeMemory() {
    absl::StatusOr<std::vector<v1::Device>> devices = observer_->ListDevices();
    EXPECT_TRUE(devices.ok()) << devices.status();
    for (const v1::Device& d : devices.ok() ? *devices : std::vector<v1::Device>())
      if (d.id() == "cpu:0") return d.free_memory();
    ADD_FAILURE() << "cpu:0 is not listed";
    return 0;
  }

  // prod's graph: out[i] = in[i] * 2 + k over 16 floats, captured once; one replay checked.
  void SetUpProd() {
    ASSERT_OK_AND_ASSIGN(prod_session_, prod_->OpenSession("cpu:0"));
    Session& s = *prod_session_;
    ProgramSpec spec{"cpu-c", kAffineSource, "affine", *ParseSignature("out,in,int32,int32"), {}};
    ASSERT_OK_AND_ASSIGN(prod_program_, s.Load(spec));
    ASSERT_OK_AND_ASSIGN(prod_in_, s.Alloc(16 * 4));
    ASSERT_OK_AND_ASSIGN(prod_out_, s.Alloc(16 * 4));
    std::vector<float> x(16);
    for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i);
    ASSERT_TRUE(s.WriteVector(*prod_in_, x).ok());
    const Variable k{"k", 0, 100, 1};
    ASSERT_TRUE(s.BeginCapture({&*prod_in_}, {k}).ok());
    LaunchSpec launch;
    launch.args = {View{&*prod_out_}, View{&*prod_in_}, int64_t{16}, Expr{"k"}};
    launch.variables = {{k, 0}};
    ASSERT_TRUE(s.Launch(*prod_program_, launch).ok());
    ASSERT_OK_AND_ASSIGN(prod_graph_, s.EndCapture({&*prod_out_}));
    EXPECT_EQ(ProdReplay(1), "") << "before the loop";
  }

  // One replay of prod's graph with k = v; "" when it read back what the host computes.
  std::string ProdReplay(int64_t v) {
    absl::StatusOr<ReplayResult> r =
        prod_session_->Replay(*prod_graph_, {&*prod_in_, &*prod_out_, v}, true, {View{&*prod_out_}});
    if (!r.ok()) return absl::StrCat("replay with k = ", v, ": ", r.status().ToString());
    if (r->reads.size() != 1 || r->reads[0].size() != 64) return absl::StrCat("replay with k = ", v, ": bad reads");
    float got[16];
    std::memcpy(got, r->reads[0].data(), sizeof(got));
    for (int i = 0; i < 16; ++i)
      if (got[i] != static_cast<float>(i) * 2 + static_cast<float>(v))
        return absl::StrCat("replay with k = ", v, ": out[", i, "] = ", got[i]);
    return "";
  }

  // Replays prod's graph on a thread of its own until StopProdLoop, recording the first
  // wrong or failed replay; returns once the loop has replayed a few times.
  void StartProdLoop() {
    stop_ = false;
    prod_loop_ = std::thread([this] {
      for (int64_t n = 0; !stop_; ++n) {
        std::string wrong = ProdReplay(n % 100 + 1);
        if (!wrong.empty()) {
          std::lock_guard<std::mutex> lock(mu_);
          prod_failure_ = wrong;
          return;
        }
        ++prod_replays_;
      }
    });
    WaitForProdReplays(3);
  }

  // Waits until prod has replayed `more` times since now (or failed).
  void WaitForProdReplays(int64_t more) {
    const int64_t target = prod_replays_ + more;
    EXPECT_TRUE(PollUntil([&] { return prod_replays_ >= target || !ProdFailure().empty(); }))
        << "prod's loop stalled at " << prod_replays_ << " replays";
  }

  std::string ProdFailure() {
    std::lock_guard<std::mutex> lock(mu_);
    return prod_failure_;
  }

  // Lets prod replay a few more times after the fault, then stops its loop; every replay
  // was right.
  void FinishProdLoop() {
    WaitForProdReplays(3);
    StopProdLoop();
    EXPECT_EQ(ProdFailure(), "") << "after " << prod_replays_ << " right replays";
    EXPECT_EQ(ProdReplay(7), "") << "after the loop";
  }

  void StopProdLoop() {
    stop_ = true;
    if (prod_loop_.joinable()) prod_loop_.join();
  }

  // What must be back once research's faulted session is closed.
  struct Baseline {
    uint64_t free_memory = 0;
    std::set<pid_t> own_threads;  // the daemon's own (Threads(true))
    size_t threads = 0;           // all, gRPC's too
    std::set<pid_t> executors;    // prod's
  };

  // The daemon runs a busy moment's session operations on workers (server/dispatch.h),
  // and a worker ends only after 10 s idle, so a fault that meets prod's replays starts
  // workers that the thread check would wait for. So first prod's loop, two long
  // launches and transfers run side by side, leaving idle the workers such a moment
  // needs (the fault reuses them); then the baseline, with no test thread but this one.
  Baseline TakeBaseline() {
    StartProdLoop();
    std::vector<std::thread> busy;
    for (int t = 0; t < 3; ++t)
      busy.emplace_back([this, t] {
        absl::StatusOr<Session> s = prod_->OpenSession("cpu:0");
        ASSERT_TRUE(s.ok()) << s.status();
        ASSERT_OK_AND_ASSIGN(Buffer b, s->Alloc(64));
        if (t < 2) {  // long launches, as the faulting one is
          ProgramSpec spec{"cpu-c", kBusySource, "busy", *ParseSignature("inout"), {}};
          ASSERT_OK_AND_ASSIGN(Program p, s->Load(spec));
          for (int i = 0; i < 2; ++i) ASSERT_TRUE(s->Launch(p, {View{&b}}, {1, 1, 1}, {1, 1, 1}, true).ok());
          return;
        }
        for (int i = 0; i < 30; ++i) {
          ASSERT_TRUE(s->WriteVector(b, std::vector<int32_t>(16, i)).ok());
          ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, s->ReadVector<int32_t>(b, 16));
          ASSERT_EQ(got, std::vector<int32_t>(16, i));
        }
      });
    for (std::thread& t : busy) t.join();
    StopProdLoop();
    return {FreeMemory(), Threads(true), Threads().size(), ExecutorChildren()};
  }

  // research's executor: the one executor child that was not there at `baseline`.
  pid_t ResearchExecutor(const Baseline& baseline) {
    std::set<pid_t> fresh = Minus(ExecutorChildren(), baseline.executors);
    EXPECT_EQ(fresh.size(), 1u) << "research's work runs in one executor process of its own";
    return fresh.empty() ? 0 : *fresh.begin();
  }

  // Closes research's session and checks that nothing of it is left: memory, executor
  // processes; that its next session runs in one fresh executor and computes right; and,
  // that one closed too, that the daemon's threads are back.
  void ExpectResearchLeftNothingBehind(Session& research, const Baseline& baseline) {
    EXPECT_TRUE(research.Close().ok());
    uint64_t free = 0;
    EXPECT_TRUE(PollUntil([&] { return (free = FreeMemory()) == baseline.free_memory; }))
        << "free memory " << free << ", at the start " << baseline.free_memory;
    std::set<pid_t> left;
    EXPECT_TRUE(PollUntil([&] { return (left = Minus(ExecutorChildren(), baseline.executors)).empty(); }))
        << left.size() << " executors of research left (running or unreaped)";
    EXPECT_EQ(Minus(baseline.executors, ExecutorChildren()).size(), 0u) << "prod's executor ended";

    {
      ASSERT_OK_AND_ASSIGN(Session again, research_->OpenSession("cpu:0"));
      ExpectComputes(again);
      EXPECT_EQ(Minus(ExecutorChildren(), baseline.executors).size(), 1u) << "one fresh executor";
    }
    // Last, with every session of research closed: no thread of the daemon's own but those
    // it had at the start (one that ended is fine), and no more threads in all. A worker
    // the fault started beyond the warm ones ends after 10 s idle.
    std::set<pid_t> started;
    size_t threads = 0;
    EXPECT_TRUE(PollUntil(
        [&] {
          started = Minus(Threads(true), baseline.own_threads);
          threads = Threads().size();
          return started.empty() && threads <= baseline.threads;
        },
        absl::Seconds(15)))
        << "the daemon's threads started since the baseline and still running: " << ThreadNames(started) << "; "
        << threads << " threads in all, " << baseline.threads << " at the baseline: " << ThreadNames(Threads());
  }

  // `s` loads a program and a launch of it computes right.
  static void ExpectComputes(Session& s) {
    ProgramSpec spec{"cpu-c", kAffineSource, "affine", *ParseSignature("out,in,int32,int32"), {}};
    ASSERT_OK_AND_ASSIGN(Program p, s.Load(spec));
    ASSERT_OK_AND_ASSIGN(Buffer in, s.Alloc(4 * 4));
    ASSERT_OK_AND_ASSIGN(Buffer out, s.Alloc(4 * 4));
    ASSERT_TRUE(s.WriteVector(in, std::vector<float>{1, 2, 3, 4}).ok());
    ASSERT_TRUE(s.Launch(p, {View{&out}, View{&in}, int64_t{4}, int64_t{10}}, {1, 1, 1}, {1, 1, 1}, true).ok());
    ASSERT_OK_AND_ASSIGN(std::vector<float> got, s.ReadVector<float>(out, 4));
    EXPECT_EQ(got, (std::vector<float>{12, 14, 16, 18}));
  }

  std::unique_ptr<Client> research_, prod_, observer_;
  std::optional<Session> prod_session_;
  std::optional<Program> prod_program_;
  std::optional<Buffer> prod_in_, prod_out_;
  std::optional<Graph> prod_graph_;
  std::thread prod_loop_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> prod_replays_{0};
  std::mutex mu_;
  std::string prod_failure_;  // guarded by mu_
};

class FaultMatrixCaseTest : public FaultMatrixTest, public ::testing::WithParamInterface<FaultCase> {};

// Each line of /etc/passwd that a message must not quote.
std::vector<std::string> PasswdLines() {
  std::vector<std::string> lines;
  std::ifstream in("/etc/passwd");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

TEST_P(FaultMatrixCaseTest, AFaultAnswersAsPromisedAndTouchesNothingElse) {
  const FaultCase& fault = GetParam();
  ASSERT_NO_FATAL_FAILURE(StartDaemon(2));
  ASSERT_NO_FATAL_FAILURE(SetUpProd());
  const Baseline baseline = TakeBaseline();
  const std::string touched = absl::StrCat("/tmp/replayd-fault-matrix-", getpid(), "-", fault.name);
  const std::string code = absl::StrReplaceAll(fault.code, {{"TOUCHED", touched}});

  ASSERT_OK_AND_ASSIGN(Session research, research_->OpenSession("cpu:0"));
  ASSERT_OK_AND_ASSIGN(Buffer out, research.Alloc(2 * 4));
  ASSERT_OK_AND_ASSIGN(Buffer held, research.Alloc(kHeld));
  EXPECT_LE(FreeMemory(), baseline.free_memory - kHeld);
  ASSERT_TRUE(research.WriteVector(out, std::vector<int32_t>{12345, 12345}).ok());
  ResearchExecutor(baseline);
  ASSERT_NO_FATAL_FAILURE(StartProdLoop());

  const ProgramSpec spec{"cpu-c", code, "probe", *ParseSignature(kProbeSignature), {}};
  absl::StatusOr<Program> program = research.Load(spec);
  if (fault.outcome == Outcome::kLoadRefused) {
    ASSERT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument) << program.status();
    const std::string message(program.status().message());
    // The dependency check's words, or, where the cage's Landlock already kept the
    // preprocessor from reading the file, its "/etc/passwd: Permission denied".
    EXPECT_THAT(message, AnyOf(HasSubstr("outside the system headers"), HasSubstr("Permission denied")));
    EXPECT_THAT(message, Not(HasSubstr("root:")));
    for (const std::string& line : PasswdLines()) EXPECT_THAT(message, Not(HasSubstr(line)));
    ExpectComputes(research);
  } else {
    ASSERT_TRUE(program.ok()) << program.status();
    absl::StatusOr<v1::LaunchReply> r = research.Launch(*program, {View{&out}}, {1, 1, 1}, {1, 1, 1}, true);
    if (fault.outcome == Outcome::kCallRefused) {
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, research.ReadVector<int32_t>(out, 2));
      if (fault.errnos.empty()) {
        EXPECT_NE(got[0], 0) << "the call succeeded";
      } else {
        EXPECT_EQ(got[0], -1) << "the call succeeded";
        EXPECT_TRUE(fault.errnos.count(got[1])) << "errno " << got[1] << " (" << std::strerror(got[1]) << ")";
      }
      EXPECT_FALSE(std::filesystem::exists(touched)) << touched;
      std::filesystem::remove(touched);
      // The session goes on: the same kernel again, and a fresh program.
      ASSERT_TRUE(research.WriteVector(out, std::vector<int32_t>{12345, 12345}).ok());
      ASSERT_TRUE(research.Launch(*program, {View{&out}}, {1, 1, 1}, {1, 1, 1}, true).ok());
      ASSERT_OK_AND_ASSIGN(std::vector<int32_t> again, research.ReadVector<int32_t>(out, 2));
      EXPECT_EQ(again, got);
      ExpectComputes(research);
    } else {
      const absl::StatusCode code = fault.outcome == Outcome::kDies ? absl::StatusCode::kFailedPrecondition
                                                                    : absl::StatusCode::kDeadlineExceeded;
      ASSERT_EQ(r.status().code(), code) << r.status();
      EXPECT_THAT(std::string(r.status().message()),
                  AllOf(HasSubstr("executor of tenant research on cpu:0"), HasSubstr(fault.cause)));
      // Every later call of the session finds the executor gone (the stream's calls too:
      // ALostSessionsStreamAnswersTheCauseAfterTheReaperClosedIt).
      absl::StatusOr<Buffer> more = research.Alloc(64);
      EXPECT_EQ(more.status().code(), absl::StatusCode::kFailedPrecondition) << more.status();
      EXPECT_THAT(std::string(more.status().message()), HasSubstr(fault.cause));
      absl::StatusOr<Program> reload = research.Load(spec);
      EXPECT_EQ(reload.status().code(), absl::StatusCode::kFailedPrecondition) << reload.status();
      EXPECT_THAT(std::string(reload.status().message()), HasSubstr(fault.cause));
      // The executor's memory is back before the session closes.
      uint64_t free = 0;
      EXPECT_TRUE(PollUntil([&] { return (free = FreeMemory()) == baseline.free_memory; }))
          << "free memory " << free << ", at the start " << baseline.free_memory;
    }
  }
  FinishProdLoop();
  ExpectResearchLeftNothingBehind(research, baseline);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, FaultMatrixCaseTest,
    ::testing::Values(
        FaultCase{"null_dereference", "void probe(int *out) { *(volatile int *)0 = 1; }", Outcome::kDies,
                  "died: SIGSEGV"},
        FaultCase{"abort", "#include <stdlib.h>\nvoid probe(int *out) { abort(); }", Outcome::kDies,
                  "died: SIGABRT"},
        FaultCase{"exit_0", "#include <stdlib.h>\nvoid probe(int *out) { exit(0); }", Outcome::kDies,
                  "exited with status 0"},
        // Each frame holds 4 KiB the compiler may not drop, and the call is no tail call:
        // the thread's stack (RLIMIT_STACK or the thread default) ends in its guard page.
        FaultCase{"stack_overflow",
                  "static int deeper(int n) {\n"
                  "  volatile char frame[4096];\n"
                  "  frame[n & 4095] = (char)n;\n"
                  "  return deeper(n + 1) + frame[(n * 7) & 4095];\n"
                  "}\n"
                  "void probe(int *out) { out[0] = deeper(0); }",
                  Outcome::kDies, "died: SIGSEGV"},
        FaultCase{"endless_loop", "void probe(int *out) { for (;;) *(volatile int *)out += 1; }",
                  Outcome::kRunsPastLimit, "ran past the time limit of 2s"},
        FaultCase{"write_1gib_past_its_buffer", "void probe(int *out) { ((volatile char *)out)[1L << 30] = 1; }",
                  Outcome::kDies, "died: SIGSEGV"},
        FaultCase{"fork",
                  "#include <errno.h>\n#include <unistd.h>\n"
                  "void probe(int *out) {\n"
                  "  errno = 0;\n"
                  "  int pid = fork();\n"
                  "  if (pid == 0) _exit(0);\n"
                  "  out[0] = pid; out[1] = errno;\n"
                  "}",
                  Outcome::kCallRefused, "", {EPERM}},
        FaultCase{"open_etc_passwd",
                  "#include <errno.h>\n#include <fcntl.h>\n#include <unistd.h>\n"
                  "void probe(int *out) {\n"
                  "  errno = 0;\n"
                  "  int fd = open(\"/etc/passwd\", O_RDONLY);\n"
                  "  out[0] = fd; out[1] = errno;\n"
                  "  if (fd >= 0) close(fd);\n"
                  "}",
                  Outcome::kCallRefused, "", {EACCES, EPERM}},
        FaultCase{"system_touch",
                  "#include <errno.h>\n#include <stdlib.h>\n"
                  "void probe(int *out) { errno = 0; out[0] = system(\"touch TOUCHED\"); out[1] = errno; }",
                  Outcome::kCallRefused},
        FaultCase{"socket",
                  "#include <errno.h>\n#include <sys/socket.h>\n#include <unistd.h>\n"
                  "void probe(int *out) {\n"
                  "  errno = 0;\n"
                  "  int fd = socket(AF_INET, SOCK_STREAM, 0);\n"
                  "  out[0] = fd; out[1] = errno;\n"
                  "  if (fd >= 0) close(fd);\n"
                  "}",
                  Outcome::kCallRefused, "", {EPERM}},
        FaultCase{"include_etc_passwd", "#include \"/etc/passwd\"\nvoid probe(int *out) { out[0] = 1; }",
                  Outcome::kLoadRefused}),
    [](const ::testing::TestParamInfo<FaultCase>& info) { return std::string(info.param.name); });

// SIGKILL from outside while a replay runs answers as a crash does.
TEST_F(FaultMatrixTest, AnExecutorKilledFromOutsideAnswersAsACrashDoes) {
  // A limit far past the wait below, so only the kill can end the replay.
  ASSERT_NO_FATAL_FAILURE(StartDaemon(60));
  ASSERT_NO_FATAL_FAILURE(SetUpProd());
  const Baseline baseline = TakeBaseline();

  ASSERT_OK_AND_ASSIGN(Session research, research_->OpenSession("cpu:0"));
  ProgramSpec spec{"cpu-c", "void hold(int *x, int forever) { while (forever) *(volatile int *)x += 1; }", "hold",
                   *ParseSignature("inout,int32"), {}};
  ASSERT_OK_AND_ASSIGN(Program hold, research.Load(spec));
  ASSERT_OK_AND_ASSIGN(Buffer x, research.Alloc(4));
  ASSERT_OK_AND_ASSIGN(Buffer held, research.Alloc(kHeld));
  EXPECT_LE(FreeMemory(), baseline.free_memory - kHeld);
  const Variable forever{"forever", 0, 1, 1};
  ASSERT_TRUE(research.BeginCapture({&x}, {forever}).ok());
  LaunchSpec launch;
  launch.args = {View{&x}, Expr{"forever"}};
  launch.variables = {{forever, 0}};
  ASSERT_TRUE(research.Launch(hold, launch).ok());
  ASSERT_OK_AND_ASSIGN(Graph g, research.EndCapture({}));
  const pid_t executor = ResearchExecutor(baseline);
  ASSERT_NE(executor, 0);
  std::ifstream cmdline("/proc/" + std::to_string(executor) + "/cmdline");
  std::string argv0;
  std::getline(cmdline, argv0, '\0');
  EXPECT_EQ(argv0, REPLAYD_EXECUTOR_BINARY);

  ASSERT_NO_FATAL_FAILURE(StartProdLoop());
  std::optional<ProcStat> before = ReadStat(executor);
  ASSERT_TRUE(before.has_value());
  absl::StatusOr<ReplayResult> replay = absl::UnknownError("not replayed");
  std::atomic<bool> replayed{false};
  std::thread replayer([&] {
    replay = research.Replay(g, {&x, int64_t{1}}, true);
    replayed = true;
  });
  // The kernel runs once the executor has burnt a fifth of a second of CPU since.
  EXPECT_TRUE(PollUntil([&] {
    std::optional<ProcStat> now = ReadStat(executor);
    return replayed || (now && now->cpu_ticks >= before->cpu_ticks + sysconf(_SC_CLK_TCK) / 5);
  }));
  EXPECT_FALSE(replayed) << "the replay ended by itself: " << replay.status();
  EXPECT_EQ(kill(executor, SIGKILL), 0);
  replayer.join();
  ASSERT_EQ(replay.status().code(), absl::StatusCode::kFailedPrecondition) << replay.status();
  EXPECT_THAT(std::string(replay.status().message()),
              AllOf(HasSubstr("executor of tenant research on cpu:0 died: SIGKILL"), HasSubstr("entry 'hold'")));
  absl::StatusOr<Buffer> more = research.Alloc(64);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kFailedPrecondition) << more.status();
  EXPECT_THAT(std::string(more.status().message()), HasSubstr("died: SIGKILL"));

  FinishProdLoop();
  ExpectResearchLeftNothingBehind(research, baseline);
}

// The daemon's Session stream holds the session it found first (server/session_stream.cc);
// once the engine's reaper has closed a lost session (within a second), Launch, Copy and
// Replay on its stream still answer FAILED_PRECONDITION with the cause, as unary calls
// do, not NOT_FOUND "session N is closed".
TEST_F(FaultMatrixTest, ALostSessionsStreamAnswersTheCauseAfterTheReaperClosedIt) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon(2));
  ASSERT_OK_AND_ASSIGN(Session research, research_->OpenSession("cpu:0"));
  ProgramSpec spec{"cpu-c", "void probe(int *out) { *(volatile int *)0 = 1; }", "probe",
                   *ParseSignature(kProbeSignature), {}};
  ASSERT_OK_AND_ASSIGN(Program probe, research.Load(spec));
  ASSERT_OK_AND_ASSIGN(Buffer out, research.Alloc(8));
  absl::StatusOr<v1::LaunchReply> r = research.Launch(probe, {View{&out}}, {1, 1, 1}, {1, 1, 1}, true);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  // KeepAlive answers the cause at once, before the reaper's pass and after it.
  absl::Status alive = research.KeepAlive();
  EXPECT_EQ(alive.code(), absl::StatusCode::kFailedPrecondition) << alive;
  EXPECT_THAT(std::string(alive.message()), HasSubstr("died: SIGSEGV"));
  EXPECT_TRUE(PollUntil([&] { return daemon_->engine().session_count() == 0; })) << "the reaper never closed it";
  alive = research.KeepAlive();
  EXPECT_EQ(alive.code(), absl::StatusCode::kFailedPrecondition) << alive;
  absl::StatusOr<Buffer> more = research.Alloc(64);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kFailedPrecondition) << more.status();
  EXPECT_THAT(std::string(more.status().message()), HasSubstr("died: SIGSEGV"));
  absl::StatusOr<v1::LaunchReply> relaunch = research.Launch(probe, {View{&out}}, {1, 1, 1}, {1, 1, 1}, true);
  EXPECT_EQ(relaunch.status().code(), absl::StatusCode::kFailedPrecondition) << relaunch.status();
  EXPECT_THAT(std::string(relaunch.status().message()), HasSubstr("died: SIGSEGV"));
}

}  // namespace
}  // namespace replayd::client

// A daemon with --isolation=process over loopback: a tenant's kernel that crashes or runs
// past the time limit (DEADLINE_EXCEEDED for that launch) fails that tenant's operations
// with FAILED_PRECONDITION naming the cause, and nothing else: the daemon serves on, another tenant's graphs replay right
// before and after, the device's memory comes back, and the tenant's next session runs
// in a fresh executor.
#include <gmock/gmock.h>

#include <sys/resource.h>

#include <algorithm>
#include <fstream>

#include "drivers/executor/executor_driver.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/support/status_macros.h"
#include "tests/support/tenants_file.h"

namespace replayd::client {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kCrashSource[] = R"(
void boom(float *x, int at) { if (at == 5) *(volatile int *)0 = 1; x[0] += 1; }
)";
constexpr char kEndlessSource[] = "void spin(float *x, int at) { for (;;) *(volatile float *)x += 1; }";

class IsolationTest : public DaemonFixture {
 protected:
  void SetUp() override {
    const std::filesystem::path file = cache_.path() / "tenants.textproto";
    std::ofstream(file) << TenantText("research", "research-token", "  trusted: true\n")
                        << TenantText("prod", "prod-token", "  trusted: true\n")
                        << TenantText("ops", "ops-token", "  admin: true\n")
                        << TenantText("capped", "capped-token", "  quotas { memory_bytes: 33554432 }\n");
    Options options;
    options.tenants_file = file;
    options.adjust = [](DaemonOptions& d) {
      d.tenant_defaults.isolation = Isolation::kProcess;
      d.tenant_defaults.max_launch = absl::Seconds(3);
    };
    Start(options);
    research_ = std::make_unique<Client>(As("research-token"));
    prod_ = std::make_unique<Client>(As("prod-token"));
  }
  Client As(const std::string& token) {
    ClientOptions o;
    o.token = token;
    return Client::Connect(daemon_->address(), o);
  }
  uint64_t FreeMemoryOf(Client& c) {
    auto devices = c.ListDevices();
    EXPECT_TRUE(devices.ok()) << devices.status();
    return devices.ok() && !devices->empty() ? (*devices)[0].free_memory() : 0;
  }

  // prod's graph: x[i] = x[i] * 2 + k, captured once and replayed with k = 1, 2, 3; true
  // when every replay read back what the host computes.
  void ExpectProdReplaysRight(Session& s) {
    ProgramSpec spec{"cpu-c", kAffineSource, "affine", *ParseSignature("out,in,int32,int32"), {}};
    ASSERT_OK_AND_ASSIGN(Program p, s.Load(spec));
    ASSERT_OK_AND_ASSIGN(Buffer in, s.Alloc(16 * 4));
    ASSERT_OK_AND_ASSIGN(Buffer out, s.Alloc(16 * 4));
    std::vector<float> x(16);
    for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i);
    ASSERT_TRUE(s.WriteVector(in, x).ok());
    const Variable k{"k", 0, 100, 1};
    ASSERT_TRUE(s.BeginCapture({&in}, {k}).ok());
    LaunchSpec launch;
    launch.args = {View{&out}, View{&in}, int64_t{16}, Expr{"k"}};
    launch.variables = {{k, 0}};
    ASSERT_TRUE(s.Launch(p, launch).ok());
    ASSERT_OK_AND_ASSIGN(Graph g, s.EndCapture({&out}));
    for (int64_t v = 1; v <= 3; ++v) {
      ASSERT_OK_AND_ASSIGN(ReplayResult r, s.Replay(g, {&in, &out, v}, true, {View{&out}}));
      ASSERT_EQ(r.reads.size(), 1u);
      std::vector<float> got(16);
      std::memcpy(got.data(), r.reads[0].data(), 64);
      for (int i = 0; i < 16; ++i) EXPECT_EQ(got[i], x[i] * 2 + v) << i;
    }
  }

  std::unique_ptr<Client> research_, prod_;
};

TEST_F(IsolationTest, AKernelThatCrashesFailsOnlyItsTenant) {
  const uint64_t baseline = FreeMemoryOf(*prod_);
  ASSERT_OK_AND_ASSIGN(Session prod, prod_->OpenSession("cpu:0"));
  ExpectProdReplaysRight(prod);
  ASSERT_OK_AND_ASSIGN(Session research, research_->OpenSession("cpu:0"));
  ProgramSpec crash{"cpu-c", kCrashSource, "boom", *ParseSignature("inout,int32"), {}};
  ASSERT_OK_AND_ASSIGN(Program boom, research.Load(crash));
  ASSERT_OK_AND_ASSIGN(Buffer held, research.Alloc(4 << 20));
  EXPECT_LT(FreeMemoryOf(*prod_), baseline);
  // A capture of the kernel, replayed as a sequence that crashes at its fifth step.
  const Variable at{"at", 0, 10, 1};
  ASSERT_TRUE(research.BeginCapture({&held}, {at}).ok());
  LaunchSpec launch;
  launch.args = {View{&held}, Expr{"at"}};
  launch.variables = {{at, 0}};
  ASSERT_TRUE(research.Launch(boom, launch).ok());
  ASSERT_OK_AND_ASSIGN(Graph g, research.EndCapture({}));
  SequenceSpec seq;
  seq.base = {&held, int64_t{1}};
  seq.step_param = 1;
  seq.count = 8;
  absl::StatusOr<SequenceResult> r = research.ReplaySequence(g, seq);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("executor of tenant research on cpu:0 died: SIGSEGV while replaying"),
                    HasSubstr("entry 'boom'")));
  // Every later operation of the session says so; its memory is back at once.
  absl::StatusOr<Buffer> more = research.Alloc(64);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kFailedPrecondition) << more.status();
  EXPECT_EQ(FreeMemoryOf(*prod_), baseline);

  // The other tenant never noticed, and the daemon serves on.
  ExpectProdReplaysRight(prod);
  // Once the daemon has closed the lost session (within a second), the tenant's counts
  // are back to zero and the session still says why, until its owner closes it.
  Client ops = As("ops-token");
  uint64_t sessions = 1, memory = 1;
  for (int i = 0; i < 50 && (sessions != 0 || memory != 0); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    absl::StatusOr<std::vector<v1::TenantStatus>> tenants = ops.ListTenants();
    ASSERT_TRUE(tenants.ok()) << tenants.status();
    for (const v1::TenantStatus& t : *tenants)
      if (t.name() == "research") sessions = t.used().sessions(), memory = t.used().memory_bytes();
  }
  EXPECT_EQ(sessions, 0u);
  EXPECT_EQ(memory, 0u);
  more = research.Alloc(64);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kFailedPrecondition) << more.status();
  EXPECT_THAT(std::string(more.status().message()), HasSubstr("died: SIGSEGV"));
  EXPECT_TRUE(research.Close().ok());
  // The tenant's next session runs in a fresh executor.
  ASSERT_OK_AND_ASSIGN(Session again, research_->OpenSession("cpu:0"));
  ASSERT_OK_AND_ASSIGN(Program boom2, again.Load(crash));
  ASSERT_OK_AND_ASSIGN(Buffer x, again.Alloc(4));
  ASSERT_TRUE(again.Launch(boom2, {View{&x}, int64_t{1}}, {1, 1, 1}, {1, 1, 1}, true).ok());
  ASSERT_OK_AND_ASSIGN(std::vector<float> got, again.ReadVector<float>(x, 1));
  EXPECT_EQ(got[0], 1.0f);
}

TEST_F(IsolationTest, ALaunchPastTheTimeLimitEndsItsExecutor) {
  ASSERT_OK_AND_ASSIGN(Session prod, prod_->OpenSession("cpu:0"));
  ASSERT_OK_AND_ASSIGN(Session research, research_->OpenSession("cpu:0"));
  ProgramSpec endless{"cpu-c", kEndlessSource, "spin", *ParseSignature("inout,int32"), {}};
  ASSERT_OK_AND_ASSIGN(Program spin, research.Load(endless));
  ASSERT_OK_AND_ASSIGN(Buffer x, research.Alloc(4));
  absl::StatusOr<v1::LaunchReply> r = research.Launch(spin, {View{&x}, int64_t{0}}, {1, 1, 1}, {1, 1, 1}, true);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("executor of tenant research on cpu:0 was ended: running program"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("ran past the time limit of 3s"));
  // The session's later operations find the executor ended.
  EXPECT_EQ(research.Alloc(4).status().code(), absl::StatusCode::kFailedPrecondition);
  ExpectProdReplaysRight(prod);
}

// A tenant's executor maps at most what its memory quota lets it hold, a margin and room
// for its one context; the kernel reads its own limit.
TEST_F(IsolationTest, AnExecutorsAddressSpaceFollowsItsTenantsMemoryQuota) {
  constexpr char kProbe[] = R"(
struct rlimit { unsigned long cur, max; };
int getrlimit(int, struct rlimit *);
void probe(unsigned long *out) {
  struct rlimit l = {0, 0};
  getrlimit(9, &l);
  out[0] = l.cur;
  out[1] = l.max;
})";
  auto limits = [&](Client& client) -> std::vector<uint64_t> {
    absl::StatusOr<Session> s = client.OpenSession("cpu:0");
    if (!s.ok()) return {};
    ProgramSpec spec{"cpu-c", kProbe, "probe", *ParseSignature("out"), {}};
    absl::StatusOr<Program> p = s->Load(spec);
    absl::StatusOr<Buffer> out = s->Alloc(16);
    if (!p.ok() || !out.ok() || !s->Launch(*p, {View{&*out}}, {1, 1, 1}, {1, 1, 1}, true).ok()) return {};
    absl::StatusOr<std::vector<uint64_t>> got = s->ReadVector<uint64_t>(*out, 2);
    return got.ok() ? *got : std::vector<uint64_t>{};
  };
  auto devices = prod_->ListDevices();
  ASSERT_TRUE(devices.ok() && !devices->empty());
  // The daemon's margin and one context's room; the hard limit is the daemon's own.
  const uint64_t total = (*devices)[0].total_memory(),
                 extra = (uint64_t{4} << 30) + executor::ExecutorDevice::kContextAddressSpace;
  ASSERT_GT(total, uint64_t{32} << 20);
  struct rlimit inherited;
  ASSERT_EQ(getrlimit(RLIMIT_AS, &inherited), 0);
  const uint64_t hard = inherited.rlim_max;
  Client capped = As("capped-token");
  EXPECT_EQ(limits(capped), (std::vector<uint64_t>{std::min<uint64_t>((uint64_t{32} << 20) + extra, hard), hard}));
  EXPECT_EQ(limits(*prod_), (std::vector<uint64_t>{std::min<uint64_t>(total + extra, hard), hard}));
}

// With --executor_linger, a tenant's sessions opened one after another run in one
// executor process: its kernel reads the same process id each time (without it, each
// session starts a new one: ExecutorDriverTest.AnExecutorEndsWithItsTenantsLastContext).
class ExecutorLingerTest : public DaemonFixture {
 protected:
  void SetUp() override {
    Options options;
    options.adjust = [](DaemonOptions& d) {
      d.tenant_defaults.isolation = Isolation::kProcess;
      d.executor_linger = absl::Seconds(60);
    };
    Start(options);
  }
  // The process id the session's kernel runs in; 0 when a step fails.
  int64_t ProcessOfASession() {
    constexpr char kPid[] = "int getpid(void);\nvoid pid(long *out) { out[0] = getpid(); }";
    absl::StatusOr<Session> s = client_->OpenSession("cpu:0");
    if (!s.ok()) return 0;
    ProgramSpec spec{"cpu-c", kPid, "pid", *ParseSignature("out"), {}};
    absl::StatusOr<Program> p = s->Load(spec);
    absl::StatusOr<Buffer> out = s->Alloc(8);
    if (!p.ok() || !out.ok() || !s->Launch(*p, {View{&*out}}, {1, 1, 1}, {1, 1, 1}, true).ok()) return 0;
    absl::StatusOr<std::vector<int64_t>> got = s->ReadVector<int64_t>(*out, 1);
    return got.ok() ? (*got)[0] : 0;  // the session closes here
  }
};

TEST_F(ExecutorLingerTest, ATenantsSessionsOneAfterAnotherRunInOneExecutor) {
  const int64_t first = ProcessOfASession();
  ASSERT_GT(first, 0);
  EXPECT_NE(first, getpid()) << "in an executor, not the daemon";
  EXPECT_EQ(ProcessOfASession(), first);
  EXPECT_EQ(ProcessOfASession(), first);
}

}  // namespace
}  // namespace replayd::client

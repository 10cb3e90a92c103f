// The executor device with real executor processes: every Context and DeviceGraph
// operation across the process boundary, and the containment it exists for: a kernel that
// crashes, exits or runs past its time limit ends only its tenant's executor, which
// answers FAILED_PRECONDITION naming the tenant, the device and the cause, gives its
// memory back, and is replaced at the tenant's next OpenContext.
#include "drivers/executor/executor_driver.h"

#include <gmock/gmock.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "drivers/cpu/cpu_driver.h"
#include "drivers/executor/executor_server.h"
#include "tests/support/status_macros.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_binaries.h"

namespace replayd::executor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kMemory = 64 << 20;
constexpr uint64_t kAddressSpaceMargin = uint64_t{4} << 30;

Signature Sig(std::vector<replayd::Param> params) {
  Signature s;
  s.params = std::move(params);
  return s;
}

const replayd::Param kInout{"x", ParamKind::kBuffer, Access::kInout};
const replayd::Param kInt{"v", ParamKind::kInt32, Access::kNone};

class ExecutorDriverTest : public ::testing::Test {
 protected:
  void SetUp() override { device_ = MakeDevice(absl::Seconds(30)); }

  // Buffers of at least `shared_from` bytes are shared buffers (the daemon's setting for
  // cpu by default), at most `max_shared` at once.
  std::unique_ptr<ExecutorDevice> MakeDevice(absl::Duration timeout, uint64_t shared_from = 64 << 10,
                                             int64_t max_shared = 8192, absl::Duration linger = absl::ZeroDuration(),
                                             uint64_t own_bytes = 0) {
    CpuDriverOptions cpu;
    cpu.memory_limit = kMemory;
    cpu.threads = 2;
    ExecutorOptions options;
    options.binary = testing::ExecutorBinary();
    options.device_args = {"--device=cpu", "--artifacts=" + dir_.path().string(),
                           absl::StrCat("--memory_limit=", kMemory), "--threads=2"};
    options.command_timeout = timeout;
    options.shared_buffers_from = shared_from;
    options.max_shared_buffers = max_shared;
    options.address_space_margin = kAddressSpaceMargin;  // the daemon's for cpu
    options.linger = linger;
    options.own_bytes = own_bytes;
    return std::make_unique<ExecutorDevice>(std::make_unique<CpuDevice>(cpu), options);
  }

  // Compiles `code` in the daemon (as the engine does) and loads it in `context`.
  absl::StatusOr<std::unique_ptr<Kernel>> Build(Device& device, Context& context, const std::string& code,
                                                const std::string& entry, Signature sig) {
    ProgramSource source{"cpu-c", code, entry, std::move(sig), {}};
    const std::filesystem::path out = dir_.path() / absl::StrCat(entry, ++builds_, ".so");
    if (absl::Status s = device.Compile(source, out); !s.ok()) return s;
    return context.Load(source, out);
  }

  TempDir dir_;
  int builds_ = 0;
  std::unique_ptr<ExecutorDevice> device_;
};

// The mappings of `pid` whose file is the memfd named `name`, from /proc.
int MemfdsMappedBy(pid_t pid, const std::string& name) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("/memfd:" + name) != std::string::npos;
  return n;
}

// The shared buffers of a process: its mappings of the daemon's buffer memfds.
int SharedBuffersOf(pid_t pid) { return MemfdsMappedBy(pid, "replayd-buffer"); }

// Through the channel's data area (no shared buffers), and through shared buffers.
class TransferTest : public ExecutorDriverTest, public ::testing::WithParamInterface<bool> {};

TEST_P(TransferTest, TransfersOfAnySizeCrossTheProcessBoundary) {
  device_ = MakeDevice(absl::Seconds(30), GetParam() ? 64 << 10 : 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
  const uint64_t bytes = 9 << 20;  // three trips through the data area
  const int before = SharedBuffersOf(getpid());
  ASSERT_OK_AND_ASSIGN(Allocation a, c->Allocate(bytes));
  EXPECT_EQ(device_->memory_in_use(), bytes);
  EXPECT_EQ(SharedBuffersOf(getpid()), before + (GetParam() ? 1 : 0));
  std::vector<uint8_t> in(bytes);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + i / 4096);
  ASSERT_TRUE(c->Write(a, 0, in).ok());
  std::vector<uint8_t> out(bytes);
  ASSERT_TRUE(c->Read(a, 0, out).ok());
  EXPECT_EQ(in, out);
  std::vector<uint8_t> middle(100);
  ASSERT_TRUE(c->Read(a, 5 << 20, middle).ok());
  EXPECT_TRUE(std::equal(middle.begin(), middle.end(), in.begin() + (5 << 20)));
  ASSERT_OK_AND_ASSIGN(Allocation b, c->Allocate(1 << 20));
  ASSERT_TRUE(c->Copy(b, 0, a, 4096, 1 << 20).ok());
  ASSERT_TRUE(c->Read(b, 0, middle).ok());
  EXPECT_TRUE(std::equal(middle.begin(), middle.end(), in.begin() + 4096));
  c->Free(a);
  c->Free(b);
  EXPECT_EQ(device_->memory_in_use(), 0u);
  EXPECT_EQ(SharedBuffersOf(getpid()), before);
}

INSTANTIATE_TEST_SUITE_P(Paths, TransferTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "SharedBuffers" : "DataArea");
                         });

// A buffer of 64 KiB or more is one memfd mapped in the daemon and in the executor: a
// kernel's result is read straight from it, in order after the launches posted before
// the read, and a write lands only once the launches before it have run.
TEST_F(ExecutorDriverTest, LargeBuffersAreMappedInBothProcessesAndTransfersKeepTheirOrder) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
  const pid_t executor = device_->ExecutorOf("a")->pid();
  const int daemon_before = SharedBuffersOf(getpid()), executor_before = SharedBuffersOf(executor);
  constexpr uint64_t kFloats = 1 << 16;  // 256 KiB
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(kFloats * 4));
  ASSERT_OK_AND_ASSIGN(Allocation y, c->Allocate(kFloats * 4));
  ASSERT_OK_AND_ASSIGN(Allocation small, c->Allocate(4096));  // below 64 KiB: the executor's own
  EXPECT_EQ(SharedBuffersOf(getpid()), daemon_before + 2);
  EXPECT_EQ(SharedBuffersOf(executor), executor_before + 2);
  EXPECT_EQ(device_->memory_in_use(), 2 * kFloats * 4 + 4096);

  Signature sig = Sig({{"y", ParamKind::kBuffer, Access::kOut}, {"x", ParamKind::kBuffer, Access::kIn}});
  sig.core_id = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> twice,
                       Build(*device_, *c, "void twice(float *y, const float *x, int i) { y[i] = 2 * x[i] + 1; }",
                             "twice", sig));
  std::vector<float> in(kFloats);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  ASSERT_OK(c->Write(x, 0, {reinterpret_cast<const uint8_t*>(in.data()), in.size() * 4}));
  ArgValue args[2];
  args[0].address = y.address;
  args[1].address = x.address;
  // Launches without wait, then writes and reads: each transfer waits for what was posted.
  for (int round = 0; round < 3; ++round) {
    ASSERT_OK(c->Launch(*twice, args, {kFloats, 1, 1}, {1, 1, 1}, false).status());
    std::vector<float> next(kFloats, static_cast<float>(round + 1000));
    ASSERT_OK(c->Write(x, 0, {reinterpret_cast<const uint8_t*>(next.data()), next.size() * 4}));
    std::vector<float> out(kFloats);
    ASSERT_OK(c->Read(y, 0, {reinterpret_cast<uint8_t*>(out.data()), out.size() * 4}));
    for (size_t i = 0; i < kFloats; ++i) {
      const float expect = 2 * (round == 0 ? in[i] : static_cast<float>(round - 1 + 1000)) + 1;
      ASSERT_EQ(out[i], expect) << "round " << round << " element " << i;
    }
  }
  // A part of a buffer, at an offset.
  float middle[3];
  ASSERT_OK(c->Read(x, 4 * 100, {reinterpret_cast<uint8_t*>(middle), sizeof(middle)}));
  for (float v : middle) EXPECT_EQ(v, 1002.0f);

  // A launch without wait that fails is the next transfer's answer, as through the channel.
  ASSERT_OK(c->Launch(*twice, {}, {1, 1, 1}, {1, 1, 1}, false).status());
  absl::Status next = c->Read(y, 0, {reinterpret_cast<uint8_t*>(middle), sizeof(middle)});
  EXPECT_EQ(next.code(), absl::StatusCode::kInvalidArgument) << next;
  EXPECT_THAT(std::string(next.message()), HasSubstr("an earlier command without wait failed"));
  ASSERT_OK(c->Read(y, 0, {reinterpret_cast<uint8_t*>(middle), sizeof(middle)}));

  twice.reset();
  c->Free(x);
  c->Free(small);
  EXPECT_EQ(SharedBuffersOf(getpid()), daemon_before + 1);
  EXPECT_EQ(SharedBuffersOf(executor), executor_before + 1);
  c->Free(y);
  EXPECT_EQ(SharedBuffersOf(getpid()), daemon_before);
  EXPECT_EQ(SharedBuffersOf(executor), executor_before);
  EXPECT_EQ(device_->memory_in_use(), 0u);
}

// Past the device's budget of shared buffers a buffer is the executor's own, and works the
// same; a freed shared buffer makes room for the next.
TEST_F(ExecutorDriverTest, PastTheBudgetOfSharedBuffersABufferIsTheExecutorsOwn) {
  device_ = MakeDevice(absl::Seconds(30), 64 << 10, /*max_shared=*/1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
  const int before = SharedBuffersOf(getpid());
  ASSERT_OK_AND_ASSIGN(Allocation a, c->Allocate(1 << 20));
  ASSERT_OK_AND_ASSIGN(Allocation b, c->Allocate(1 << 20));
  EXPECT_EQ(SharedBuffersOf(getpid()), before + 1);
  std::vector<uint8_t> in(1 << 20), out(1 << 20);
  for (const Allocation& buffer : {a, b}) {
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 13 + buffer.address);
    ASSERT_OK(c->Write(buffer, 0, in));
    ASSERT_OK(c->Read(buffer, 0, out));
    EXPECT_EQ(in, out);
  }
  c->Free(a);
  EXPECT_EQ(SharedBuffersOf(getpid()), before);
  ASSERT_OK_AND_ASSIGN(Allocation d, c->Allocate(1 << 20));
  EXPECT_EQ(SharedBuffersOf(getpid()), before + 1);
  c->Free(b);
  c->Free(d);
  EXPECT_EQ(SharedBuffersOf(getpid()), before);
}

// An executor that ends leaves its shared buffers to the daemon until they are freed:
// transfers answer FAILED_PRECONDITION, the memory is back at once, and the mapping goes
// with the free.
TEST_F(ExecutorDriverTest, ASharedBufferOfAnExecutorKilledFromOutsideFailsItsTransfersAndIsUnmappedWhenFreed) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"research"}));
  const int before = SharedBuffersOf(getpid());
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(1 << 20));
  ASSERT_EQ(kill(device_->ExecutorOf("research")->pid(), SIGKILL), 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (c->health().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  std::vector<uint8_t> bytes(1 << 20);
  EXPECT_EQ(c->Write(x, 0, bytes).code(), absl::StatusCode::kFailedPrecondition);
  absl::Status read = c->Read(x, 0, bytes);
  EXPECT_EQ(read.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(read.message()), HasSubstr("died: SIGKILL"));
  EXPECT_EQ(device_->memory_in_use(), 0u);
  EXPECT_EQ(SharedBuffersOf(getpid()), before + 1);
  c->Free(x);
  EXPECT_EQ(SharedBuffersOf(getpid()), before);
}

TEST_F(ExecutorDriverTest, AnAllocationPastTheDeviceIsRefusedAndChangesNothing) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> a, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> b, device_->OpenContext({"b"}));
  ASSERT_OK_AND_ASSIGN(Allocation big, a->Allocate(kMemory - (1 << 20)));
  // Two tenants' executors share the device's memory.
  EXPECT_EQ(b->Allocate(2 << 20).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(device_->memory_in_use(), kMemory - (1 << 20));
  a->Free(big);
  EXPECT_TRUE(b->Allocate(2 << 20).ok());
}

TEST_F(ExecutorDriverTest, LaunchesAndDeviceGraphsRunInTheExecutor) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                       Build(*device_, *c, "void step(float *x, int v, int i) { x[i] = x[i] * 2 + v; }", "step",
                             [] {
                               Signature s = Sig({kInout, kInt});
                               s.core_id = true;
                               return s;
                             }()));
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(4 * 4));
  ASSERT_OK_AND_ASSIGN(Allocation y, c->Allocate(4 * 4));
  ArgValue args[2];
  args[0].address = x.address;
  args[1].integer = 1;
  ASSERT_OK_AND_ASSIGN(std::optional<absl::Duration> t, c->Launch(*k, args, {4, 1, 1}, {1, 1, 1}, true));
  EXPECT_TRUE(t.has_value());
  // A graph: step(x, 1), step(x, 2), then a copy x -> y.
  std::vector<GraphNode> nodes(3);
  nodes[0] = {k.get(), {args[0], args[1]}, {4, 1, 1}, {1, 1, 1}, 0};
  nodes[1] = nodes[0];
  nodes[1].args[1].integer = 2;
  nodes[2].args.resize(2);
  nodes[2].args[0].address = y.address;
  nodes[2].args[1].address = x.address;
  nodes[2].copy_bytes = 16;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceGraph> g, c->Instantiate(nodes, {}));
  ASSERT_TRUE(g->Launch(true).ok());  // x: 1 -> 3 -> 8
  ArgValue patched[2] = {args[0], args[1]};
  patched[1].integer = 5;
  ASSERT_TRUE(g->Update(1, patched, {4, 1, 1}, {1, 1, 1}).ok());
  ASSERT_TRUE(g->Launch(false).ok());  // x: 8 -> 17 -> 39
  float out[4];
  ASSERT_TRUE(c->Read(y, 0, {reinterpret_cast<uint8_t*>(out), sizeof(out)}).ok());
  for (float v : out) EXPECT_EQ(v, 39.0f);
  // The executor refuses what does not fit instead of running it.
  EXPECT_EQ(g->Update(7, patched, {4, 1, 1}, {1, 1, 1}).code(), absl::StatusCode::kInvalidArgument);
  g.reset();
  k.reset();
  c->Free(x);
  c->Free(y);
}

// The executor runs no kernel on a buffer address outside its allocations (those of all
// its contexts: contexts that share an address space may use each other's buffers),
// eager or in a graph: a wrong address from the daemon (none, a freed buffer's, past an
// allocation's end) is refused with OUT_OF_RANGE, and the executor, the graph and the
// buffers are as they were. (A kernel node's buffer arguments may be placeholders when the
// graph is built; each launch's are checked.)
TEST_F(ExecutorDriverTest, AKernelArgumentOutsideTheExecutorsAllocationsIsRefused) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> other, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                       Build(*device_, *c, "void add(float *x, int v) { x[0] += (float)v; }", "add", Sig({kInout, kInt})));
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(8));
  ASSERT_OK_AND_ASSIGN(Allocation theirs, other->Allocate(8));  // the same executor, another context
  ASSERT_OK_AND_ASSIGN(Allocation freed, c->Allocate(64));
  c->Free(freed);
  const float zero[2] = {0, 0};
  ASSERT_OK(c->Write(x, 0, {reinterpret_cast<const uint8_t*>(zero), 8}));
  ASSERT_OK(other->Write(theirs, 0, {reinterpret_cast<const uint8_t*>(zero), 8}));
  auto args = [](uint64_t address, int64_t v) {
    std::vector<ArgValue> a(2);
    a[0].address = address;
    a[1].integer = v;
    return a;
  };
  for (uint64_t wrong : {uint64_t{0}, uint64_t{64}, x.address + 9, freed.address}) {
    absl::StatusOr<std::optional<absl::Duration>> refused = c->Launch(*k, args(wrong, 1), {1, 1, 1}, {1, 1, 1}, true);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kOutOfRange) << "0x" << std::hex << wrong;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("not inside an allocation"));
  }
  ASSERT_OK(c->Launch(*k, args(x.address + 4, 1), {1, 1, 1}, {1, 1, 1}, true).status());  // x[1] = 1
  ASSERT_OK(c->Launch(*k, args(theirs.address, 5), {1, 1, 1}, {1, 1, 1}, true).status());  // theirs[0] = 5
  std::vector<GraphNode> nodes(1);
  nodes[0] = {k.get(), args(0, 2), {1, 1, 1}, {1, 1, 1}, 0};  // a placeholder until the first launch
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceGraph> g, c->Instantiate(nodes, {}));
  ASSERT_OK(g->Update(0, args(x.address, 2), {1, 1, 1}, {1, 1, 1}));
  ASSERT_OK(g->Launch(true).status());  // x[0] = 2
  ASSERT_OK(g->Update(0, args(freed.address, 2), {1, 1, 1}, {1, 1, 1}));
  absl::StatusOr<std::optional<absl::Duration>> refused = g->Launch(true);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("not inside an allocation"));
  ASSERT_OK(g->Update(0, args(x.address, 2), {1, 1, 1}, {1, 1, 1}));
  ASSERT_OK(g->Launch(true).status());  // x[0] = 4
  float got[2], their[2];
  ASSERT_OK(c->Read(x, 0, {reinterpret_cast<uint8_t*>(got), 8}));
  ASSERT_OK(other->Read(theirs, 0, {reinterpret_cast<uint8_t*>(their), 8}));
  EXPECT_EQ(got[0], 4.0f);
  EXPECT_EQ(got[1], 1.0f);
  EXPECT_EQ(their[0], 5.0f);
  g.reset();
  k.reset();
  c->Free(x);
  other->Free(theirs);
}

// A launch without wait whose updates the executor refuses (a copy node's address in no
// allocation) leaves the other node's update unapplied there too: the daemon then sends
// every value at the next launch, so the graph is again what the engine last set.
TEST_F(ExecutorDriverTest, AfterAGraphLaunchRefusedPartWayTheNextSendsTheWholeGraph) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                       Build(*device_, *c, "void add(float *x, int v) { x[0] += (float)v; }", "add", Sig({kInout, kInt})));
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(4));
  ASSERT_OK_AND_ASSIGN(Allocation y, c->Allocate(4));
  const float zero = 0;
  ASSERT_OK(c->Write(x, 0, {reinterpret_cast<const uint8_t*>(&zero), 4}));
  // y <- x, then x += v.
  std::vector<GraphNode> nodes(2);
  nodes[0].args.resize(2);
  nodes[0].args[0].address = y.address;
  nodes[0].args[1].address = x.address;
  nodes[0].copy_bytes = 4;
  nodes[1] = {k.get(), std::vector<ArgValue>(2), {1, 1, 1}, {1, 1, 1}, 0};
  nodes[1].args[0].address = x.address;
  nodes[1].args[1].integer = 1;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceGraph> g, c->Instantiate(nodes, {}));
  ASSERT_OK(g->Launch(true).status());  // y = 0, x = 1
  ArgValue bad[2] = {nodes[0].args[0], nodes[0].args[1]};
  bad[0].address = 64;  // in no allocation
  ASSERT_OK(g->Update(0, bad, {1, 1, 1}, {1, 1, 1}));
  ArgValue ten[2] = {nodes[1].args[0], nodes[1].args[1]};
  ten[1].integer = 10;
  ASSERT_OK(g->Update(1, ten, {1, 1, 1}, {1, 1, 1}));
  ASSERT_OK(g->Launch(false).status());
  const absl::Status refused = c->Synchronize();
  EXPECT_THAT(std::string(refused.message()), HasSubstr("an earlier command without wait failed")) << refused;
  // Only node 0 changes now; node 1's 10 went with the refused launch.
  ASSERT_OK(g->Update(0, nodes[0].args, {1, 1, 1}, {1, 1, 1}));
  ASSERT_OK(g->Launch(true).status());  // y = 1, x = 11
  float got[2];
  ASSERT_OK(c->Read(x, 0, {reinterpret_cast<uint8_t*>(&got[0]), 4}));
  ASSERT_OK(c->Read(y, 0, {reinterpret_cast<uint8_t*>(&got[1]), 4}));
  EXPECT_EQ(got[0], 11.0f) << "node 1 kept its old value";
  EXPECT_EQ(got[1], 1.0f);
  // From here only what changes travels again, and lands.
  ten[1].integer = 100;
  ASSERT_OK(g->Update(1, ten, {1, 1, 1}, {1, 1, 1}));
  ASSERT_OK(g->Launch(true).status());  // y = 11, x = 111
  ASSERT_OK(c->Read(x, 0, {reinterpret_cast<uint8_t*>(&got[0]), 4}));
  EXPECT_EQ(got[0], 111.0f);
  g.reset();
  k.reset();
  c->Free(x);
  c->Free(y);
}

// The executor's end of a graph launch: indexes past the graph, values without their
// indexes, or a whole graph of the wrong size are refused before any value is set.
TEST(ContextServerTest, AGraphLaunchThatDoesNotFitIsRefusedAndChangesNothing) {
  CpuDriverOptions cpu;
  cpu.memory_limit = kMemory;
  cpu.threads = 1;
  CpuDevice device(cpu);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context, device.OpenContext({"a", Isolation::kShared}));
  Allocations allocations;
  ContextServer server(device, std::move(context), -1, allocations);
  bool done = false;
  std::vector<uint8_t> data(64);
  auto run = [&](const Request& r) { return server.Handle(r, data, done); };
  Request allocate;
  allocate.set_allocate(16);
  const Reply x = run(allocate), y = run(allocate), z = run(allocate);
  ASSERT_EQ(x.code(), 0);
  ASSERT_EQ(y.code(), 0);
  ASSERT_EQ(z.code(), 0);
  auto transfer = [&](bool write, uint64_t address) {
    Request r;
    Transfer* t = write ? r.mutable_write() : r.mutable_read();
    t->mutable_allocation()->set_address(address);
    t->mutable_allocation()->set_bytes(16);
    t->set_bytes(16);
    return run(r).code();
  };
  for (int i = 0; i < 16; ++i) data[i] = static_cast<uint8_t>(i + 1);
  ASSERT_EQ(transfer(true, x.value()), 0);
  Request instantiate;  // y <- x: 2 arguments and 6 sizes, values 0 to 7
  Node* n = instantiate.mutable_instantiate()->add_nodes();
  n->add_args(y.value());
  n->add_args(x.value());
  for (Dims* d : {n->mutable_global(), n->mutable_local()}) d->set_x(1), d->set_y(1), d->set_z(1);
  n->set_copy_bytes(16);
  const Reply g = run(instantiate);
  ASSERT_EQ(g.code(), 0) << g.message();
  auto launch = [&](std::vector<uint32_t> indexes, std::vector<uint64_t> values, bool all = false) {
    Request r;
    GraphLaunch* l = r.mutable_graph_launch();
    l->set_graph(g.value());
    l->set_wait(true);
    l->set_all(all);
    l->mutable_update_indexes()->Add(indexes.begin(), indexes.end());
    l->mutable_update_values()->Add(values.begin(), values.end());
    return run(r);
  };
  const int kInvalid = static_cast<int>(absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(launch({8}, {z.value()}).code(), kInvalid) << "an index past the graph";
  EXPECT_EQ(launch({0, UINT32_MAX}, {z.value(), 0}).code(), kInvalid) << "a good index, then one past the graph";
  EXPECT_EQ(launch({0, 1}, {z.value()}).code(), kInvalid) << "an index without its value";
  EXPECT_EQ(launch({}, std::vector<uint64_t>(7, 1), true).code(), kInvalid) << "7 values for 8";
  EXPECT_EQ(launch({0}, std::vector<uint64_t>(8, 1), true).code(), kInvalid) << "indexes with the whole graph";
  // An address is checked against the allocations made here for the bytes its copy
  // reaches, before any value is set.
  const int kOutOfRange = static_cast<int>(absl::StatusCode::kOutOfRange);
  EXPECT_EQ(launch({1, 0}, {z.value(), 64}).code(), kOutOfRange) << "a good source, then a destination in nothing";
  EXPECT_EQ(launch({0}, {y.value() + 8}).code(), kOutOfRange) << "16 bytes from the middle of a 16-byte allocation";
  std::vector<uint64_t> whole(8, 1);
  whole[0] = y.value();
  whole[1] = x.value() + 1;
  EXPECT_EQ(launch({}, whole, true).code(), kOutOfRange) << "a whole graph whose source runs past its allocation";
  // None of those set value 0 (the destination) or 1 (the source): the copy still goes
  // from x to y.
  const Reply ran = launch({}, {});
  ASSERT_EQ(ran.code(), 0) << ran.message();
  ASSERT_EQ(transfer(false, z.value()), 0);
  EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.begin() + 16), std::vector<uint8_t>(16, 0));
  ASSERT_EQ(transfer(false, y.value()), 0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(data[i], i + 1);
  // A launch that fits moves it.
  ASSERT_EQ(launch({0}, {z.value()}).code(), 0);
  ASSERT_EQ(transfer(false, z.value()), 0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(data[i], i + 1);
}

// A graph of thousands of nodes is built, and relaunched with every node patched, through
// requests longer than a channel slot (they travel in the data area); a transfer posted
// behind such a launch waits for it to be read before it writes the data area.
TEST_F(ExecutorDriverTest, LongGraphRequestsTravelInTheDataAreaAndTransfersWaitForThem) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                       Build(*device_, *c, "void add(float *x, int v, int i) { x[i] += (float)v; }", "add", [] {
                         Signature s = Sig({kInout, kInt});
                         s.core_id = true;
                         return s;
                       }()));
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(4 * 4));
  ASSERT_OK_AND_ASSIGN(Allocation y, c->Allocate(4 * 4));
  const float zeros[4] = {0, 0, 0, 0};
  ASSERT_OK(c->Write(x, 0, {reinterpret_cast<const uint8_t*>(zeros), sizeof(zeros)}));
  // Some 20 bytes a node to build, and 4 (an index and a value) to patch one value of
  // each: both past a 64 KiB slot.
  constexpr size_t kNodes = 20000;
  ArgValue args[2];
  args[0].address = x.address;
  args[1].integer = 1;
  std::vector<GraphNode> nodes(kNodes, GraphNode{k.get(), {args[0], args[1]}, {4, 1, 1}, {1, 1, 1}, 0});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceGraph> g, c->Instantiate(nodes, {}));
  ASSERT_OK(g->Launch(false).status());  // x: kNodes
  args[1].integer = 2;
  for (size_t n = 0; n < kNodes; ++n) ASSERT_OK(g->Update(n, args, {4, 1, 1}, {1, 1, 1}));
  ASSERT_OK(g->Launch(false).status());  // x: 3 * kNodes, every node's update in the request
  const float ys[4] = {1, 2, 3, 4};
  ASSERT_OK(c->Write(y, 0, {reinterpret_cast<const uint8_t*>(ys), sizeof(ys)}));
  float out[4];
  ASSERT_OK(c->Read(x, 0, {reinterpret_cast<uint8_t*>(out), sizeof(out)}));
  for (float v : out) EXPECT_EQ(v, 3.0f * kNodes);
  ASSERT_OK(c->Read(y, 0, {reinterpret_cast<uint8_t*>(out), sizeof(out)}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], ys[i]);
  g.reset();
  k.reset();
  c->Free(x);
  c->Free(y);
}

TEST_F(ExecutorDriverTest, ALaunchWithoutWaitRunsWhileTheDaemonGoesOnAndItsFailureIsTheNextCommands) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                       Build(*device_, *c, "void inc(float *x) { x[0] += 1; }", "inc", Sig({kInout})));
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(4));
  ArgValue args[1];
  args[0].address = x.address;
  // Launches without wait are posted back to back; each waits only for the one before.
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK_AND_ASSIGN(std::optional<absl::Duration> t, c->Launch(*k, args, {1, 1, 1}, {1, 1, 1}, false));
    EXPECT_FALSE(t.has_value());
  }
  float v = 0;
  ASSERT_TRUE(c->Read(x, 0, {reinterpret_cast<uint8_t*>(&v), 4}).ok());
  EXPECT_EQ(v, 10.0f);
  // One the executor refuses (a wrong argument count) is posted; the next command
  // answers for it, and the context goes on.
  ASSERT_TRUE(c->Launch(*k, {}, {1, 1, 1}, {1, 1, 1}, false).ok());
  absl::Status next = c->Synchronize();
  EXPECT_EQ(next.code(), absl::StatusCode::kInvalidArgument) << next;
  EXPECT_THAT(std::string(next.message()), HasSubstr("an earlier command without wait failed"));
  EXPECT_TRUE(c->Synchronize().ok());
  EXPECT_TRUE(c->health().ok());
  // A free after a refused one still gives its memory back (nobody is told of the
  // refusal then), and leaves nothing outstanding.
  const uint64_t before = device_->memory_in_use();
  ASSERT_OK_AND_ASSIGN(Allocation y, c->Allocate(1 << 20));
  ASSERT_TRUE(c->Launch(*k, {}, {1, 1, 1}, {1, 1, 1}, false).ok());
  c->Free(y);
  EXPECT_EQ(device_->memory_in_use(), before);
  EXPECT_TRUE(c->Synchronize().ok());
  // A crash in one is the executor's death, named with that launch.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> boom,
                       Build(*device_, *c, "void boom(float *x) { *(volatile int *)0 = 1; }", "boom", Sig({kInout})));
  ASSERT_TRUE(c->Launch(*boom, args, {1, 1, 1}, {1, 1, 1}, false).ok());
  next = c->Read(x, 0, {reinterpret_cast<uint8_t*>(&v), 4});
  EXPECT_EQ(next.code(), absl::StatusCode::kFailedPrecondition) << next;
  EXPECT_THAT(std::string(next.message()), HasSubstr("died: SIGSEGV while running program"));
  EXPECT_THAT(std::string(next.message()), HasSubstr("entry 'boom'"));
  boom.reset();
  k.reset();
  c->Free(x);
}

// Stops `pid` (SIGSTOP) and returns once every thread of it is stopped: kill returns
// before the signal lands, and a spinning executor thread may take a command meanwhile.
bool StopAndWait(pid_t pid) {
  if (kill(pid, SIGSTOP) != 0) return false;
  for (int i = 0; i < 2000; ++i) {
    bool all = true;
    for (const auto& task : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const size_t close = line.rfind(')');  // the state follows the command's name
      if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'T') all = false;
    }
    if (all) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

// A synchronize with nothing but synchronizes sent since the last one that succeeded
// (a session that ran nothing, as it closes) asks nothing of the executor: here it
// answers while the executor is stopped, where a round trip would wait out the 3 s
// limit and end it. Once work is sent, it waits for the executor again.
TEST_F(ExecutorDriverTest, ASynchronizeWithNothingSentSinceTheLastAsksNothingOfTheExecutor) {
  device_ = MakeDevice(absl::Seconds(3));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
  const pid_t executor = device_->ExecutorOf("a")->pid();
  ASSERT_TRUE(StopAndWait(executor));
  absl::Status idle = c->Synchronize();
  ASSERT_EQ(kill(executor, SIGCONT), 0);
  EXPECT_TRUE(idle.ok()) << idle;

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                       Build(*device_, *c, "void inc(float *x) { x[0] += 1; }", "inc", Sig({kInout})));
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(4));
  ArgValue args[1];
  args[0].address = x.address;
  ASSERT_TRUE(c->Launch(*k, args, {1, 1, 1}, {1, 1, 1}, false).ok());
  ASSERT_TRUE(StopAndWait(executor));
  std::thread resume([executor] {
    absl::SleepFor(absl::Milliseconds(300));
    kill(executor, SIGCONT);
  });
  const absl::Time start = absl::Now();
  absl::Status after_work = c->Synchronize();  // waits for the executor to run again
  const absl::Duration waited = absl::Now() - start;
  resume.join();
  EXPECT_TRUE(after_work.ok()) << after_work;
  EXPECT_GE(waited, absl::Milliseconds(250)) << "it answered without the executor";
  float v = 0;
  ASSERT_TRUE(c->Read(x, 0, {reinterpret_cast<uint8_t*>(&v), 4}).ok());
  EXPECT_EQ(v, 1.0f);
  ASSERT_TRUE(c->Synchronize().ok());  // the read was sent since: a round trip, then none
  ASSERT_TRUE(StopAndWait(executor));
  idle = c->Synchronize();
  ASSERT_EQ(kill(executor, SIGCONT), 0);
  EXPECT_TRUE(idle.ok()) << idle;
  EXPECT_TRUE(c->health().ok());
  k.reset();
  c->Free(x);
}

TEST_F(ExecutorDriverTest, EachTenantHasItsOwnExecutorAndItsContextsShareIt) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> a1, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> a2, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> b, device_->OpenContext({"b"}));
  ASSERT_NE(device_->ExecutorOf("a"), nullptr);
  ASSERT_NE(device_->ExecutorOf("b"), nullptr);
  EXPECT_NE(device_->ExecutorOf("a")->pid(), device_->ExecutorOf("b")->pid());
  EXPECT_EQ(a1->address_space(), a2->address_space());
  EXPECT_NE(a1->address_space(), b->address_space());
}

// The address-space limit of a process, from /proc: {soft, hard}, or {0, 0}.
std::pair<uint64_t, uint64_t> AddressSpaceOf(pid_t pid) {
  std::ifstream limits(absl::StrCat("/proc/", pid, "/limits"));
  std::string line;
  while (std::getline(limits, line)) {
    if (line.rfind("Max address space", 0) != 0) continue;
    std::istringstream fields(line.substr(17));
    std::string soft, hard;
    fields >> soft >> hard;
    auto bytes = [](const std::string& text) -> uint64_t {
      uint64_t b = 0;
      if (text == "unlimited") return RLIM_INFINITY;
      return absl::SimpleAtoi(text, &b) ? b : 0;
    };
    return {bytes(soft), bytes(hard)};
  }
  return {0, 0};
}

// A tenant's executor may map what its tenant may hold on the device, a margin, and room
// for each context: the device's memory, or its memory quota where that is less; the
// limit follows the quota and the contexts the tenant has at each OpenContext, within
// the hard limit the executor inherits, and no kernel can raise it.
TEST_F(ExecutorDriverTest, AnExecutorsAddressSpaceIsItsTenantsMemoryAndAMarginAndNoKernelRaisesIt) {
  constexpr uint64_t kQuota = 16 << 20, kContext = ExecutorDevice::kContextAddressSpace;
  struct rlimit inherited;
  ASSERT_EQ(getrlimit(RLIMIT_AS, &inherited), 0);
  const uint64_t kHard = inherited.rlim_max;
  ASSERT_GT(kHard, kMemory + kAddressSpaceMargin + 8 * kContext) << "the tests' own limit leaves no room";
  ContextOptions options{"a"};
  options.memory_quota = kQuota;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext(options));
  ASSERT_NE(device_->ExecutorOf("a"), nullptr);
  const pid_t pid = device_->ExecutorOf("a")->pid();
  EXPECT_EQ(AddressSpaceOf(pid), std::make_pair(kQuota + kAddressSpaceMargin + kContext, kHard));

  // The kernel sees the limit and cannot move it, by either call.
  const char* code = R"(
struct rlimit { unsigned long cur, max; };
int getrlimit(int, struct rlimit *);
int setrlimit(int, const struct rlimit *);
int prlimit(int, int, const struct rlimit *, struct rlimit *);
void probe(unsigned long *out) {
  struct rlimit l = {0, 0};
  getrlimit(9, &l);
  out[0] = l.cur;
  out[1] = l.max;
  struct rlimit raised = {l.max, l.max};
  out[2] = setrlimit(9, &raised) == 0;
  out[3] = prlimit(0, 9, &raised, 0) == 0;
  getrlimit(9, &l);
  out[4] = l.cur;
})";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                       Build(*device_, *c, code, "probe", Sig({{"out", ParamKind::kBuffer, Access::kOut}})));
  ASSERT_OK_AND_ASSIGN(Allocation out, c->Allocate(5 * 8));
  ArgValue args[1];
  args[0].address = out.address;
  ASSERT_OK(c->Launch(*k, args, {1, 1, 1}, {1, 1, 1}, true).status());
  uint64_t got[5];
  ASSERT_OK(c->Read(out, 0, {reinterpret_cast<uint8_t*>(got), sizeof(got)}));
  EXPECT_EQ(got[0], kQuota + kAddressSpaceMargin + kContext);
  EXPECT_EQ(got[1], kHard);
  EXPECT_EQ(got[2], 0u) << "setrlimit raised the limit";
  EXPECT_EQ(got[3], 0u) << "prlimit raised the limit";
  EXPECT_EQ(got[4], kQuota + kAddressSpaceMargin + kContext);

  // The tenant's quota changes (a reloaded tenants file): its next context moves the
  // limit, with room for both contexts.
  options.memory_quota = 32 << 20;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c2, device_->OpenContext(options));
  EXPECT_EQ(device_->ExecutorOf("a")->pid(), pid);
  EXPECT_EQ(AddressSpaceOf(pid), std::make_pair(uint64_t{32 << 20} + kAddressSpaceMargin + 2 * kContext, kHard));
  // No quota, or one past the device: the device's memory bounds it.
  options.memory_quota = 0;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c3, device_->OpenContext(options));
  EXPECT_EQ(AddressSpaceOf(pid), std::make_pair(kMemory + kAddressSpaceMargin + 3 * kContext, kHard));
  options.memory_quota = kMemory * 4;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c4, device_->OpenContext(options));
  EXPECT_EQ(AddressSpaceOf(pid), std::make_pair(kMemory + kAddressSpaceMargin + 4 * kContext, kHard));
  k.reset();
  c->Free(out);

  // Another tenant's executor has its own.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> b, device_->OpenContext({"b"}));
  ASSERT_NE(device_->ExecutorOf("b"), nullptr);
  EXPECT_EQ(AddressSpaceOf(device_->ExecutorOf("b")->pid()),
            std::make_pair(kMemory + kAddressSpaceMargin + kContext, kHard));
}

// Each context takes room in its executor's address space (its channel, its thread's
// stack): a tenant with no memory to speak of still opens many, and allocates in each.
TEST_F(ExecutorDriverTest, ATenantsManyContextsEachHaveRoomInItsExecutor) {
  ContextOptions options{"a"};
  options.memory_quota = 1 << 20;
  std::vector<std::unique_ptr<Context>> contexts;
  // Past what the margin alone would hold: some 16 MiB of stack and channel each.
  const size_t n = kAddressSpaceMargin / (16 << 20) + 40;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext(options));
    ASSERT_OK_AND_ASSIGN(Allocation a, c->Allocate(1024));
    const uint8_t byte = static_cast<uint8_t>(i);
    ASSERT_OK(c->Write(a, 0, {&byte, 1}));
    uint8_t back = 0;
    ASSERT_OK(c->Read(a, 0, {&back, 1}));
    ASSERT_EQ(back, byte);
    c->Free(a);
    contexts.push_back(std::move(c));
  }
}

// The threads of an executor's process, or -1.
int ThreadsOf(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/task", ec), end; !ec && it != end;
       it.increment(ec))
    ++n;
  return ec ? -1 : n;
}

// Polls ThreadsOf(pid) until it is `want` (threads end a moment after their context).
int ThreadsBecome(pid_t pid, int want) {
  int n = ThreadsOf(pid);
  for (int i = 0; i < 500 && n != want; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    n = ThreadsOf(pid);
  }
  return n;
}

// A context's thread in the executor serves the next context once its own has closed;
// up to four wait, the others end. Each context on a reused thread is a context of its own.
TEST_F(ExecutorDriverTest, AClosedContextsThreadServesTheNextAndAtMostFourWait) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> keeper, device_->OpenContext({"a"}));
  ASSERT_NE(device_->ExecutorOf("a"), nullptr);
  const pid_t pid = device_->ExecutorOf("a")->pid();
  const int base = ThreadsOf(pid);
  ASSERT_GT(base, 0);
  {
    std::vector<std::unique_ptr<Context>> six;
    for (int i = 0; i < 6; ++i) {
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
      six.push_back(std::move(c));
    }
    EXPECT_EQ(ThreadsOf(pid), base + 6);
  }
  EXPECT_EQ(ThreadsBecome(pid, base + 4), base + 4);
  std::vector<std::unique_ptr<Context>> three;
  std::vector<Allocation> buffers;
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
    ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(4));
    ASSERT_OK(c->Write(x, 0, {reinterpret_cast<const uint8_t*>(&i), 4}));
    three.push_back(std::move(c));
    buffers.push_back(x);
  }
  EXPECT_EQ(ThreadsOf(pid), base + 4);  // three reused, one still waiting
  for (uint32_t i = 0; i < 3; ++i) {
    uint32_t v = 99;
    ASSERT_OK(three[i]->Read(buffers[i], 0, {reinterpret_cast<uint8_t*>(&v), 4}));
    EXPECT_EQ(v, i);
    // Another context's allocation is not this one's.
    EXPECT_FALSE(three[i]->Read(buffers[(i + 1) % 3], 0, {reinterpret_cast<uint8_t*>(&v), 4}).ok());
    three[i]->Free(buffers[i]);
  }
}

// The executor channels this process maps (a context's or the control channel).
int ChannelsMappedHere() { return MemfdsMappedBy(getpid(), "replayd-executor"); }

// A closed context's channel is kept for the executor's next context: the next opens
// without a new mapping, and starts clean (its commands run and answer as on a fresh one).
TEST_F(ExecutorDriverTest, AClosedContextsChannelServesTheNextContext) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> keep, device_->OpenContext({"a"}));
  const int before = ChannelsMappedHere();
  for (int round = 0; round < 3; ++round) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
    EXPECT_EQ(ChannelsMappedHere(), before + 1) << "one channel more, made once, round " << round;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                         Build(*device_, *c, "void inc(float *x) { x[0] += 1; }", "inc", Sig({kInout})));
    ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(4));
    const float start = static_cast<float>(round * 10);
    ASSERT_TRUE(c->Write(x, 0, {reinterpret_cast<const uint8_t*>(&start), 4}).ok());
    ArgValue args[1];
    args[0].address = x.address;
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(c->Launch(*k, args, {1, 1, 1}, {1, 1, 1}, false).ok());
    float v = 0;
    ASSERT_TRUE(c->Read(x, 0, {reinterpret_cast<uint8_t*>(&v), 4}).ok());
    EXPECT_EQ(v, start + 5) << "round " << round;
    k.reset();
    c->Free(x);
    c.reset();
    EXPECT_EQ(ChannelsMappedHere(), before + 1) << "kept for the next context, round " << round;
  }
  ASSERT_TRUE(keep->Synchronize().ok());
}

TEST_F(ExecutorDriverTest, ContextsOfOneTenantRunSideBySide) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> busy, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> other, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> wait,
                       Build(*device_, *busy,
                             "long time(long *);\n"
                             "void hold(float *x) { long end = time(0) + 2; while (time(0) < end) x[0] += 1; }",
                             "hold", Sig({kInout})));
  ASSERT_OK_AND_ASSIGN(Allocation x, busy->Allocate(4));
  std::atomic<bool> ended{false};
  std::thread launch([&] {
    ArgValue args[1];
    args[0].address = x.address;
    EXPECT_TRUE(busy->Launch(*wait, args, {1, 1, 1}, {1, 1, 1}, true).ok());
    ended = true;
  });
  absl::SleepFor(absl::Milliseconds(200));  // the long launch runs by then
  // The other context's commands do not wait for it.
  absl::StatusOr<Allocation> y = other->Allocate(64);
  ASSERT_TRUE(y.ok()) << y.status();
  std::vector<uint8_t> bytes(64, 7), back(64);
  EXPECT_TRUE(other->Write(*y, 0, bytes).ok());
  EXPECT_TRUE(other->Read(*y, 0, back).ok());
  EXPECT_EQ(bytes, back);
  EXPECT_FALSE(ended) << "the long launch ended first: the test proved nothing";
  launch.join();
  other->Free(*y);
  wait.reset();
  busy->Free(x);
}

// Many contexts of one executor, each from a thread of its own, post launches and graph
// launches without wait with reads and writes behind them: every read sees exactly what its
// own context's earlier commands wrote.
TEST_F(ExecutorDriverTest, ManyContextsOfOneExecutorEachReadWhatTheirOwnCommandsWrote) {
  constexpr int kContexts = 8;
  constexpr int kWords = 64;
  ProgramSource source{"cpu-c", "void step(unsigned *x, int v, int i) { x[i] = x[i] * 3u + (unsigned)v; }", "step",
                       [] {
                         Signature s = Sig({kInout, kInt});
                         s.core_id = true;
                         return s;
                       }(),
                       {}};
  const std::filesystem::path artifact = dir_.path() / "step.so";
  ASSERT_OK(device_->Compile(source, artifact));
  std::vector<std::unique_ptr<Context>> contexts;
  for (int i = 0; i < kContexts; ++i) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
    contexts.push_back(std::move(c));
  }
  auto step = [](std::vector<uint32_t>& x, int v) {
    for (uint32_t& w : x) w = w * 3u + static_cast<uint32_t>(v);
  };
  std::atomic<int> checked{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kContexts; ++t) {
    threads.emplace_back([&, t] {
      Context& c = *contexts[t];
      absl::StatusOr<std::unique_ptr<Kernel>> k = c.Load(source, artifact);
      ASSERT_TRUE(k.ok()) << k.status();
      absl::StatusOr<Allocation> x = c.Allocate(kWords * 4);
      ASSERT_TRUE(x.ok()) << x.status();
      std::vector<uint32_t> want(kWords), got(kWords);
      for (int i = 0; i < kWords; ++i) want[i] = static_cast<uint32_t>(t * 1000 + i);
      ASSERT_OK(c.Write(*x, 0, {reinterpret_cast<const uint8_t*>(want.data()), kWords * 4}));
      ArgValue args[2];
      args[0].address = x->address;
      args[1].integer = 0;
      std::vector<GraphNode> nodes(1);
      nodes[0] = {k->get(), {args[0], args[1]}, {kWords, 1, 1}, {1, 1, 1}, 0};
      absl::StatusOr<std::unique_ptr<DeviceGraph>> g = c.Instantiate(nodes, {});
      ASSERT_TRUE(g.ok()) << g.status();
      auto read = [&] {
        return c.Read(*x, 0, {reinterpret_cast<uint8_t*>(got.data()), kWords * 4});
      };
      for (int p = 1; p <= 200; ++p) {
        args[1].integer = p + t;
        ASSERT_OK((*g)->Update(0, args, {kWords, 1, 1}, {1, 1, 1}));
        ASSERT_OK((*g)->Launch(/*wait=*/false).status());
        step(want, p + t);
        if (p % 3 == 0) {  // a plain launch without wait behind it
          args[1].integer = -p;
          ASSERT_OK(c.Launch(**k, args, {kWords, 1, 1}, {1, 1, 1}, false).status());
          step(want, -p);
        }
        ASSERT_OK(read());
        ASSERT_EQ(got, want) << "context " << t << ", replay " << p;
        checked.fetch_add(1);
        if (p % 50 == 0) {  // a write behind a launch without wait
          ASSERT_OK((*g)->Launch(/*wait=*/false).status());
          for (int i = 0; i < kWords; ++i) want[i] = static_cast<uint32_t>(p * 7 + i);
          ASSERT_OK(c.Write(*x, 0, {reinterpret_cast<const uint8_t*>(want.data()), kWords * 4}));
        }
      }
      g->reset();
      k->reset();
      c.Free(*x);
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(checked.load(), kContexts * 200);
}

TEST_F(ExecutorDriverTest, AnExecutorEndsWithItsTenantsLastContext) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> first, device_->OpenContext({"a"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> second, device_->OpenContext({"a"}));
  ASSERT_NE(device_->ExecutorOf("a"), nullptr);
  const pid_t pid = device_->ExecutorOf("a")->pid();
  first.reset();
  ASSERT_NE(device_->ExecutorOf("a"), nullptr) << "a context is still open";
  EXPECT_EQ(kill(pid, 0), 0) << "still running";
  second.reset();
  EXPECT_EQ(device_->ExecutorOf("a"), nullptr);
  EXPECT_EQ(kill(pid, 0), -1) << "ended and reaped with the last context";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> again, device_->OpenContext({"a"}));
  ASSERT_NE(device_->ExecutorOf("a"), nullptr);
  EXPECT_NE(device_->ExecutorOf("a")->pid(), pid);
}

// What a kernel may not do in its executor: each attempt fails (-1) and the executor
// serves on.
// With a linger, the executor outlives its tenant's last context: the next context opens
// in it (no new process), and once it has been idle for the linger it ends, reaped, and
// is not counted as a death; the tenant's next context then starts another.
TEST_F(ExecutorDriverTest, WithALingerAnIdleExecutorTakesTheTenantsNextContextThenEnds) {
  device_ = MakeDevice(absl::Seconds(30), 64 << 10, 8192, absl::Milliseconds(300));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> first, device_->OpenContext({"a"}));
  ASSERT_NE(device_->ExecutorOf("a"), nullptr);
  const pid_t pid = device_->ExecutorOf("a")->pid();
  first.reset();
  ASSERT_NE(device_->ExecutorOf("a"), nullptr) << "idle, lingering";
  EXPECT_EQ(kill(pid, 0), 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> second, device_->OpenContext({"a"}));
  ASSERT_NE(device_->ExecutorOf("a"), nullptr);
  EXPECT_EQ(device_->ExecutorOf("a")->pid(), pid) << "the lingering executor took it";
  ASSERT_OK_AND_ASSIGN(Allocation x, second->Allocate(4));
  const float one = 1;
  ASSERT_TRUE(second->Write(x, 0, {reinterpret_cast<const uint8_t*>(&one), 4}).ok());
  float back = 0;
  ASSERT_TRUE(second->Read(x, 0, {reinterpret_cast<uint8_t*>(&back), 4}).ok());
  EXPECT_EQ(back, 1.0f);
  second->Free(x);
  // Open while the linger runs, the executor stays past it.
  absl::SleepFor(absl::Milliseconds(600));
  ASSERT_NE(device_->ExecutorOf("a"), nullptr);
  second.reset();
  const absl::Time closed = absl::Now();
  // Taken off the device, then stopped and reaped by the supervisor.
  while ((device_->ExecutorOf("a") != nullptr || kill(pid, 0) == 0) && absl::Now() - closed < absl::Seconds(20))
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(device_->ExecutorOf("a"), nullptr) << "ended once idle for its linger";
  EXPECT_EQ(kill(pid, 0), -1) << "and reaped";
  const ExecutorCounts counts = device_->executor_counts()["a"];
  EXPECT_EQ(counts.started, 1u);
  for (uint64_t died : counts.died) EXPECT_EQ(died, 0u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> third, device_->OpenContext({"a"}));
  ASSERT_NE(device_->ExecutorOf("a"), nullptr);
  EXPECT_NE(device_->ExecutorOf("a")->pid(), pid);
  EXPECT_EQ(device_->executor_counts()["a"].started, 2u);
}

// An idle executor's own bytes go back to the device when they are wanted: another
// tenant's new executor, or an allocation, that would not fit otherwise ends idle
// executors, the longest idle first and no more than it needs; a reservation that
// ending them all would not make room for ends none.
TEST_F(ExecutorDriverTest, IdleExecutorsGiveTheirOwnMemoryBackWhenItIsWanted) {
  constexpr uint64_t kOwn = kMemory / 4;
  device_ = MakeDevice(absl::Seconds(30), 64 << 10, 8192, absl::Hours(1), kOwn);
  auto pid_of = [&](const char* tenant) {
    std::shared_ptr<Executor> e = device_->ExecutorOf(tenant);
    return e ? e->pid() : pid_t{-1};
  };
  pid_t a = -1, b = -1;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> first, device_->OpenContext({"a"}));
    a = pid_of("a");
  }
  absl::SleepFor(absl::Milliseconds(5));  // a has been idle the longer
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> first, device_->OpenContext({"b"}));
    b = pid_of("b");
  }
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  EXPECT_EQ(device_->memory_in_use(), 2 * kOwn) << "two idle executors hold their own bytes";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"c"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> d, device_->OpenContext({"d"}));
  EXPECT_EQ(device_->memory_in_use(), kMemory);
  EXPECT_EQ(pid_of("a"), a) << "room was left: nobody gave way";
  EXPECT_EQ(pid_of("b"), b);

  // The device is full: e's executor takes a's place, and b lingers on.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> e, device_->OpenContext({"e"}));
  EXPECT_EQ(pid_of("a"), -1) << "the longest idle gave way";
  EXPECT_EQ(kill(a, 0), -1) << "ended and reaped";
  EXPECT_EQ(pid_of("b"), b);
  EXPECT_EQ(device_->memory_in_use(), kMemory);

  // More than b holds: b stays, and the allocation is refused.
  absl::StatusOr<Allocation> refused = c->Allocate(kOwn + 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_EQ(pid_of("b"), b) << "giving way would not have made room";
  EXPECT_EQ(device_->memory_in_use(), kMemory);
  // What b holds is enough: b gives way, and the allocation works.
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(kOwn / 2));
  EXPECT_EQ(pid_of("b"), -1);
  EXPECT_EQ(kill(b, 0), -1);
  const float one = 1;
  ASSERT_TRUE(c->Write(x, 0, {reinterpret_cast<const uint8_t*>(&one), 4}).ok());
  float back = 0;
  ASSERT_TRUE(c->Read(x, 0, {reinterpret_cast<uint8_t*>(&back), 4}).ok());
  EXPECT_EQ(back, 1.0f);
  EXPECT_EQ(device_->memory_in_use(), 3 * kOwn + kOwn / 2);

  // No idle executor is left to give way: a's next executor does not fit.
  absl::StatusOr<std::unique_ptr<Context>> no_room = device_->OpenContext({"a"});
  EXPECT_EQ(no_room.status().code(), absl::StatusCode::kResourceExhausted) << no_room.status();
  EXPECT_THAT(std::string(no_room.status().message()), HasSubstr("an executor for tenant a needs"));
  EXPECT_EQ(pid_of("a"), -1) << "no process was started for it";
  c->Free(x);
  // Giving way is not dying.
  for (const char* tenant : {"a", "b"}) {
    const ExecutorCounts counts = device_->executor_counts()[tenant];
    EXPECT_EQ(counts.started, 1u) << tenant;
    for (uint64_t died : counts.died) EXPECT_EQ(died, 0u) << tenant;
  }
}

TEST_F(ExecutorDriverTest, ASharedContextRunsInTheDaemonAndDrawsOnTheSameMemory) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> shared,
                       device_->OpenContext({"trusted", Isolation::kShared}));
  EXPECT_EQ(device_->ExecutorOf("trusted"), nullptr) << "a shared context starts no executor";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> isolated, device_->OpenContext({"other"}));
  ASSERT_NE(device_->ExecutorOf("other"), nullptr);

  // One account for both: what the shared context holds is not free for an executor.
  ASSERT_OK_AND_ASSIGN(Allocation a, shared->Allocate(kMemory / 2));
  EXPECT_EQ(device_->memory_in_use(), kMemory / 2);
  EXPECT_EQ(isolated->Allocate(kMemory / 2 + 4096).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_OK_AND_ASSIGN(Allocation b, isolated->Allocate(kMemory / 4));
  EXPECT_EQ(device_->memory_in_use(), kMemory / 2 + kMemory / 4);
  EXPECT_EQ(shared->Allocate(kMemory / 2).status().code(), absl::StatusCode::kResourceExhausted);

  // The shared context computes in this process.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                       Build(*device_, *shared, "void inc(float *x) { x[0] += 1; }", "inc", Sig({kInout})));
  ArgValue args[1];
  args[0].address = a.address;
  ASSERT_TRUE(shared->Launch(*k, args, {1, 1, 1}, {1, 1, 1}, true).ok());
  float v = 0;
  ASSERT_TRUE(shared->Read(a, 0, {reinterpret_cast<uint8_t*>(&v), 4}).ok());
  EXPECT_EQ(v, 1.0f);
  k.reset();
  shared->Free(a);
  isolated->Free(b);
  EXPECT_EQ(device_->memory_in_use(), 0u);
}

TEST_F(ExecutorDriverTest, AContextsOwnLaunchLimitEndsItsExecutorWithDeadlineExceeded) {
  // The device's default is 30 s; the tenant's policy says 1 s.
  ContextOptions options{"research"};
  options.max_launch = absl::Seconds(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext(options));
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(4));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                       Build(*device_, *c, "void spin(float *x) { for (;;) *(volatile float *)x += 1; }", "spin",
                             Sig({kInout})));
  ArgValue args[1];
  args[0].address = x.address;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<absl::Duration>> r = c->Launch(*k, args, {1, 1, 1}, {1, 1, 1}, true);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "the tenant's limit, not the device's default";
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("executor of tenant research on cpu:0 was ended"), HasSubstr("entry 'spin'"),
                    HasSubstr("time limit of 1s")));
  EXPECT_EQ(c->health().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Synchronize().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(device_->memory_in_use(), 0u);
  k.reset();
  c->Free(x);
}

TEST_F(ExecutorDriverTest, AnExecutorKilledFromOutsideWhileIdleIsNoticedWithoutACommand) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"research"}));
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(1 << 20));
  EXPECT_EQ(device_->memory_in_use(), 1u << 20);
  ASSERT_EQ(kill(device_->ExecutorOf("research")->pid(), SIGKILL), 0);
  // The supervisor sees the death on its own: health and memory change with no command sent.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (c->health().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(c->health().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(c->health().message()),
              AllOf(HasSubstr("executor of tenant research on cpu:0 died: SIGKILL"), Not(HasSubstr(" while "))));
  EXPECT_EQ(device_->memory_in_use(), 0u);
  c->Free(x);
  EXPECT_EQ(device_->memory_in_use(), 0u);
}

TEST_F(ExecutorDriverTest, AnExecutorKilledFromOutsideMidLaunchFailsItLikeACrash) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"research"}));
  ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(4));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                       Build(*device_, *c, "void spin(float *x) { for (;;) *(volatile float *)x += 1; }", "spin",
                             Sig({kInout})));
  const pid_t pid = device_->ExecutorOf("research")->pid();
  ArgValue args[1];
  args[0].address = x.address;
  std::atomic<bool> done{false};
  absl::Status launched;
  std::thread launch([&] {
    launched = c->Launch(*k, args, {1, 1, 1}, {1, 1, 1}, true).status();
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(200));  // the kernel is spinning (or about to)
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  launch.join();
  EXPECT_EQ(launched.code(), absl::StatusCode::kFailedPrecondition) << launched;
  EXPECT_THAT(std::string(launched.message()),
              AllOf(HasSubstr("died: SIGKILL while running program"), HasSubstr("entry 'spin'")));
  EXPECT_EQ(device_->memory_in_use(), 0u);
  k.reset();
  c->Free(x);
}

TEST_F(ExecutorDriverTest, AKernelCannotOpenFilesStartProgramsOrReachTheNetwork) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device_->OpenContext({"a"}));
  const char* code = R"(
int socket(int, int, int);
int open(const char *, int, ...);
int fork(void);
int execve(const char *, char *const[], char *const[]);
void probe(float *out) {
  char *argv[] = {"/bin/true", 0};
  out[0] = socket(2, 1, 0);
  out[1] = open("/etc/passwd", 0);
  out[2] = fork();
  out[3] = execve("/bin/true", argv, argv + 1);
  out[4] = open("/tmp/replayd-executor-probe", 0101, 0600);
  out[5] = 7;
})";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k,
                       Build(*device_, *c, code, "probe", Sig({{"out", ParamKind::kBuffer, Access::kOut}})));
  ASSERT_OK_AND_ASSIGN(Allocation out, c->Allocate(6 * 4));
  ArgValue args[1];
  args[0].address = out.address;
  ASSERT_TRUE(c->Launch(*k, args, {1, 1, 1}, {1, 1, 1}, true).ok());
  float got[6];
  ASSERT_TRUE(c->Read(out, 0, {reinterpret_cast<uint8_t*>(got), sizeof(got)}).ok());
  const char* what[] = {"socket", "open /etc/passwd", "fork", "execve", "create a file"};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got[i], -1.0f) << what[i];
  EXPECT_EQ(got[5], 7.0f);
  EXPECT_FALSE(std::filesystem::exists("/tmp/replayd-executor-probe"));
  k.reset();
  c->Free(out);
}

// The cases of containment: each kernel ends its executor a different way.
struct Fault {
  const char* name;
  const char* code;
  const char* cause;
  absl::StatusCode status = absl::StatusCode::kFailedPrecondition;  // of the command in flight
};

class ExecutorFaultTest : public ExecutorDriverTest, public ::testing::WithParamInterface<Fault> {};

TEST_P(ExecutorFaultTest, AFaultEndsOnlyItsTenantsExecutor) {
  const Fault& fault = GetParam();
  std::unique_ptr<ExecutorDevice> device = MakeDevice(absl::Seconds(2));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> bad, device->OpenContext({"research"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> good, device->OpenContext({"prod"}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> k, Build(*device, *bad, fault.code, "boom", Sig({kInout})));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> ok,
                       Build(*device, *good, "void inc(float *x) { x[0] += 1; }", "inc", Sig({kInout})));
  ASSERT_OK_AND_ASSIGN(Allocation held, bad->Allocate(1 << 20));
  ASSERT_OK_AND_ASSIGN(Allocation x, good->Allocate(4));
  EXPECT_EQ(device->memory_in_use(), (1u << 20) + 4);
  const pid_t first = device->ExecutorOf("research")->pid();

  ArgValue args[1];
  args[0].address = held.address;
  absl::StatusOr<std::optional<absl::Duration>> r = bad->Launch(*k, args, {1, 1, 1}, {1, 1, 1}, true);
  ASSERT_EQ(r.status().code(), fault.status) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("executor of tenant research on cpu:0"), HasSubstr(fault.cause), HasSubstr("entry 'boom'")));
  // Every later command of its contexts fails the same way; its memory is back.
  EXPECT_EQ(bad->Allocate(64).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(bad->health().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad->health().message()), HasSubstr(fault.cause));
  EXPECT_EQ(device->memory_in_use(), 4u);
  bad->Free(held);
  EXPECT_EQ(device->memory_in_use(), 4u);

  // The other tenant never noticed.
  args[0].address = x.address;
  ASSERT_TRUE(good->Launch(*ok, args, {1, 1, 1}, {1, 1, 1}, true).ok());
  float v = 0;
  ASSERT_TRUE(good->Read(x, 0, {reinterpret_cast<uint8_t*>(&v), 4}).ok());
  EXPECT_EQ(v, 1.0f);

  // The tenant's next context runs in a fresh executor.
  k.reset();
  bad.reset();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> again, device->OpenContext({"research"}));
  EXPECT_NE(device->ExecutorOf("research")->pid(), first);
  ASSERT_OK_AND_ASSIGN(Allocation y, again->Allocate(4));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> inc,
                       Build(*device, *again, "void inc(float *x) { x[0] += 1; }", "inc", Sig({kInout})));
  args[0].address = y.address;
  ASSERT_TRUE(again->Launch(*inc, args, {1, 1, 1}, {1, 1, 1}, true).ok());
  ASSERT_TRUE(again->Read(y, 0, {reinterpret_cast<uint8_t*>(&v), 4}).ok());
  EXPECT_EQ(v, 1.0f);
  inc.reset();
  again->Free(y);
  ok.reset();
  good->Free(x);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, ExecutorFaultTest,
    ::testing::Values(Fault{"null_write", "void boom(float *x) { *(volatile int *)0 = 1; }", "died: SIGSEGV while running"},
                      Fault{"abort", "void abort(void);\nvoid boom(float *x) { abort(); }", "died: SIGABRT while running"},
                      Fault{"exit", "void exit(int);\nvoid boom(float *x) { exit(3); }", "exited with status 3 while running"},
                      Fault{"endless", "void boom(float *x) { for (;;) *(volatile float *)x += 1; }",
                            "ran past the time limit of 2s", absl::StatusCode::kDeadlineExceeded}),
    [](const ::testing::TestParamInfo<Fault>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace replayd::executor

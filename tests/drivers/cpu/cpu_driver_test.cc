#include "drivers/cpu/cpu_driver.h"

#include <gmock/gmock.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>

#include "tests/support/status_macros.h"
#include "tests/support/temp_dir.h"

namespace replayd {
namespace {

class CpuDriverTest : public ::testing::Test {
 protected:
  CpuDriverTest() {
    CpuDriverOptions options;
    options.memory_limit = 1 << 20;
    options.threads = 2;
    device_ = std::make_unique<CpuDevice>(options);
    context_ = *device_->OpenContext({"test"});
  }

  std::unique_ptr<Kernel> Build(const std::string& code, const std::string& entry,
                                Signature signature) {
    ProgramSource s{"cpu-c", code, entry, std::move(signature), {}};
    auto out = dir_.path() / "k.so";
    absl::Status st = device_->Compile(s, out);
    EXPECT_TRUE(st.ok()) << st;
    auto k = context_->Load(s, out);
    EXPECT_TRUE(k.ok()) << k.status();
    return k.ok() ? std::move(*k) : nullptr;
  }

  TempDir dir_;
  std::unique_ptr<CpuDevice> device_;
  std::unique_ptr<Context> context_;
};

TEST_F(CpuDriverTest, ReportsItselfAsCpu0) {
  const DeviceInfo& info = device_->info();
  EXPECT_EQ(info.id, "cpu:0");
  EXPECT_EQ(info.kind, DeviceKind::kCpu);
  EXPECT_EQ(info.total_memory, 1u << 20);
  EXPECT_EQ(info.formats, std::vector<std::string>{"cpu-c"});
  EXPECT_FALSE(info.driver_version.empty());
  EXPECT_EQ(info.limits.max_local_total, 1u);
}

// Everything an artifact depends on enters its compile key through the target: the
// compiler, the default optimization, and the CPU's extensions (for -march=native).
TEST_F(CpuDriverTest, TheCompileTargetNamesTheCompilerItsFlagsAndTheCpu) {
  const DeviceInfo& info = device_->info();
  EXPECT_EQ(info.target.rfind(info.driver_version, 0), 0u) << info.target;
  EXPECT_THAT(info.target, ::testing::HasSubstr(" -O3 "));
  EXPECT_THAT(info.target, ::testing::ContainsRegex("cpu-[0-9a-f]{16}$"));
  CpuDriverOptions options;
  options.threads = 1;
  EXPECT_EQ(CpuDevice(options).info().target, info.target) << "stable across devices of one host";
}

TEST_F(CpuDriverTest, AllocationsAreZeroedAlignedAndAccounted) {
  for (uint64_t bytes : {1ull, 100ull, 200000ull}) {
    auto a = context_->Allocate(bytes);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->address % 64, 0u);
    EXPECT_EQ(device_->memory_in_use(), bytes);
    std::vector<uint8_t> back(bytes, 0xff);
    ASSERT_TRUE(context_->Read(*a, 0, back).ok());
    EXPECT_EQ(std::count(back.begin(), back.end(), 0), static_cast<long>(bytes));
    context_->Free(*a);
    EXPECT_EQ(device_->memory_in_use(), 0u);
  }
}

TEST_F(CpuDriverTest, AllocationPastTheLimitIsResourceExhaustedAndChangesNothing) {
  auto a = context_->Allocate(768 << 10);
  ASSERT_TRUE(a.ok());
  auto b = context_->Allocate(512 << 10);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(device_->memory_in_use(), 768u << 10);
  EXPECT_EQ(context_->Allocate(1ull << 62).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(context_->Allocate(~0ull).status().code(), absl::StatusCode::kResourceExhausted);
  context_->Free(*a);
  EXPECT_EQ(device_->memory_in_use(), 0u);
}

// Memory another process maps too: what a kernel writes there is in the other mapping,
// it is counted like an allocation, and a memfd shorter than asked is refused.
TEST_F(CpuDriverTest, SharedMemoryIsAnAllocationBothMappingsSee) {
  constexpr uint64_t kBytes = 256 << 10;
  const int fd = memfd_create("cpu-driver-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes), 0);
  void* other = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(other, MAP_FAILED);
  EXPECT_EQ(context_->AllocateShared(fd, kBytes + 4096).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_->memory_in_use(), 0u);
  EXPECT_EQ(context_->AllocateShared(fd, 4 << 20).status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<Allocation> a = context_->AllocateShared(fd, kBytes);
  ASSERT_TRUE(a.ok()) << a.status();
  close(fd);  // the mappings keep the memory
  EXPECT_EQ(device_->memory_in_use(), kBytes);
  Signature sig;
  sig.params = {{"x", ParamKind::kBuffer, Access::kOut}};
  sig.core_id = true;
  std::unique_ptr<Kernel> k = Build("void fill(int *x, int i) { x[i] = i * 3; }", "fill", sig);
  ASSERT_NE(k, nullptr);
  ArgValue args[1];
  args[0].address = a->address;
  ASSERT_TRUE(context_->Launch(*k, args, {kBytes / 4, 1, 1}, {1, 1, 1}, true).ok());
  const int* seen = static_cast<const int*>(other);
  for (uint64_t i = 0; i < kBytes / 4; i += 997) ASSERT_EQ(seen[i], static_cast<int>(i * 3)) << i;
  static_cast<int*>(other)[5] = -1;
  int v = 0;
  ASSERT_TRUE(context_->Read(*a, 20, {reinterpret_cast<uint8_t*>(&v), 4}).ok());
  EXPECT_EQ(v, -1);
  // A device graph's copy node may use it, as any allocation of the device.
  ASSERT_OK_AND_ASSIGN(Allocation b, context_->Allocate(4096));
  GraphNode copy;
  copy.args.resize(2);
  copy.args[0].address = b.address;
  copy.args[1].address = a->address;
  copy.copy_bytes = 4096;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceGraph> g, context_->Instantiate({&copy, 1}, {}));
  ASSERT_TRUE(g->Launch(true).ok());
  ASSERT_TRUE(context_->Read(b, 20, {reinterpret_cast<uint8_t*>(&v), 4}).ok());
  EXPECT_EQ(v, -1);
  g.reset();
  context_->Free(b);
  context_->Free(*a);
  EXPECT_EQ(device_->memory_in_use(), 0u);
  EXPECT_EQ(static_cast<const int*>(other)[7], 21) << "the other mapping keeps the memory";
  munmap(other, kBytes);
}

TEST_F(CpuDriverTest, WriteCopyReadRoundTrip) {
  auto a = *context_->Allocate(16);
  auto b = *context_->Allocate(16);
  std::vector<uint8_t> data = {1, 2, 3, 4};
  ASSERT_TRUE(context_->Write(a, 4, data).ok());
  ASSERT_TRUE(context_->Copy(b, 8, a, 4, 4).ok());
  std::vector<uint8_t> back(4);
  ASSERT_TRUE(context_->Read(b, 8, back).ok());
  EXPECT_EQ(back, data);
  context_->Free(a);
  context_->Free(b);
}

TEST_F(CpuDriverTest, LaunchesWithNaturalCSignatureAndCoreIds) {
  Signature sig;
  sig.params = {{"out", ParamKind::kBuffer, Access::kOut},
                {"scale", ParamKind::kInt32, Access::kNone},
                {"bias", ParamKind::kInt64, Access::kNone}};
  sig.core_id = true;
  auto k = Build("void fill(long long *out, int scale, long long bias, int core) {"
                 " out[core] = (long long)core * scale + bias; }",
                 "fill", sig);
  ASSERT_NE(k, nullptr);
  auto out = *context_->Allocate(64 * 8);
  ArgValue args[3];
  args[0].address = out.address;
  args[1].integer = -3;
  args[2].integer = 1ll << 40;
  auto t = context_->Launch(*k, args, {8, 4, 2}, {1, 1, 1}, true);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->has_value());
  std::vector<int64_t> back(64);
  ASSERT_TRUE(context_->Read(out, 0, {reinterpret_cast<uint8_t*>(back.data()), 64 * 8}).ok());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(back[i], int64_t{i} * -3 + (1ll << 40)) << i;
  k.reset();
  context_->Free(out);
}

TEST_F(CpuDriverTest, CompileErrorCarriesTheDiagnostics) {
  ProgramSource s{"cpu-c", "void k(float *x) {\n  x[0] = undefined_name;\n}\n", "k",
                  {{{"x", ParamKind::kBuffer, Access::kOut}}, false}, {}};
  absl::Status st = device_->Compile(s, dir_.path() / "k.so");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("program.c:2"), absl::string_view::npos) << st;
  EXPECT_NE(st.message().find("undefined_name"), absl::string_view::npos) << st;
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "k.so"));
}

TEST_F(CpuDriverTest, SignatureThatDoesNotMatchTheCFunctionFailsToCompile) {
  // The signature says int32, the C function takes a pointer: the trampoline's call
  // does not compile, so the mismatch never reaches a launch.
  ProgramSource s{"cpu-c", "void k(float *x) { x[0] = 1; }", "k",
                  {{{"x", ParamKind::kInt32, Access::kNone}}, false}, {}};
  EXPECT_EQ(device_->Compile(s, dir_.path() / "k.so").code(), absl::StatusCode::kInvalidArgument);
  ProgramSource arity{"cpu-c", "void k(float *x) { x[0] = 1; }", "k", {}, {}};
  EXPECT_EQ(device_->Compile(arity, dir_.path() / "k.so").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuDriverTest, RejectsOptionsOutsideTheAllowList) {
  for (std::string bad : {"-o/etc/passwd", "-fplugin=x.so", "-Wl,-rpath", "-DA;B", "-D1A", "-include/etc/shadow"}) {
    ProgramSource s{"cpu-c", "void k(void) {}", "k", {}, {bad}};
    absl::Status st = device_->Compile(s, dir_.path() / "k.so");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  ProgramSource ok{"cpu-c", "int f(void) { return N; }\nvoid k(void) {}", "k", {}, {"-O3", "-DN=4"}};
  EXPECT_TRUE(device_->Compile(ok, dir_.path() / "k.so").ok());
}

TEST(CCompilerTest, CompileTimeLimitKillsTheCompiler) {
  TempDir dir;
  auto slow = dir.path() / "slow-cc";
  std::ofstream(slow) << "#!/bin/sh\nexec sleep 30\n";
  std::filesystem::permissions(slow, std::filesystem::perms::owner_all);
  CCompiler compiler({slow.string(), absl::Milliseconds(300)});
  ProgramSource s{"cpu-c", "void k(void) {}", "k", {}, {}};
  absl::Time start = absl::Now();
  absl::Status st = compiler.Compile(s, dir.path() / "k.so");
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(CCompilerTest, MissingCompilerIsReported) {
  CCompiler compiler({"/nonexistent/cc", absl::Seconds(5)});
  EXPECT_EQ(compiler.Identify(), "");
  ProgramSource s{"cpu-c", "void k(void) {}", "k", {}, {}};
  EXPECT_FALSE(compiler.Compile(s, "/tmp/replayd-never.so").ok());
}

}  // namespace
}  // namespace replayd

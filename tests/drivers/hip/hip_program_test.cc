// What a HIP device makes of each program format, checked without a GPU: hip-c through
// hiprtc for real (Debian's ROCm runtime compiles for any gfx target), hip-hsaco by its
// form; and discovery on a machine without an AMD GPU.
#include "drivers/hip/hip_program.h"

#include <gmock/gmock.h>

#include "client/demo.h"
#include "drivers/amdgpu_metadata.h"
#include "drivers/hip/hip_driver.h"

namespace replayd {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kScale[] = R"(
extern "C" __global__ void scale(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= 2.0f;
})";

class HipProgramTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto hip = HipLibrary::Load();
    if (!hip.ok()) GTEST_SKIP() << "no HIP runtime on this machine: " << hip.status();
    if (!(*hip)->has_hiprtc()) GTEST_SKIP() << (*hip)->hiprtc_missing();
    hip_ = std::move(*hip);
  }
  std::unique_ptr<HipLibrary> hip_;
};

TEST_F(HipProgramTest, HipCBecomesACodeObjectForTheTarget) {
  auto module = BuildHipModule(ProgramSource{"hip-c", kScale, "scale", {}, {}}, *hip_, "gfx90a:sramecc+:xnack-");
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_EQ(module->entry, "scale");
  EXPECT_THAT(module->image, StartsWith("\x7f"
                                        "ELF"));
  EXPECT_THAT(module->image, HasSubstr("gfx90a"));
}

TEST_F(HipProgramTest, ACppKernelIsLookedUpByItsLoweredName) {
  auto module = BuildHipModule(
      ProgramSource{"hip-c", "__global__ void twice(float *x) { x[0] *= 2; }", "twice", {}, {}}, *hip_, "gfx1030");
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_NE(module->entry, "twice");
  EXPECT_THAT(module->image, HasSubstr(module->entry));
}

TEST_F(HipProgramTest, ABrokenSourceReturnsHiprtcDiagnostics) {
  auto module =
      BuildHipModule(ProgramSource{"hip-c", "extern \"C\" __global__ void k(float *x) {\n  x[0] = y;\n}", "k", {}, {}},
                     *hip_, "gfx90a");
  EXPECT_EQ(module.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(module.status().message()), HasSubstr("program.hip:2"));
}

TEST_F(HipProgramTest, OptionsOutsideTheAllowListAndBadTargetsAreRefused) {
  for (std::string bad : {"-I/etc", "--include=/etc/passwd", "-o/tmp/x", "-DA;B"}) {
    ProgramSource s = ProgramSource{"hip-c", kScale, "scale", {}, {}};
    s.options = {bad};
    EXPECT_EQ(BuildHipModule(s, *hip_, "gfx90a").status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  ProgramSource fine = ProgramSource{"hip-c", kScale, "scale", {}, {}};
  fine.options = {"-DN=4", "-ffast-math"};
  EXPECT_TRUE(BuildHipModule(fine, *hip_, "gfx90a").ok());
  EXPECT_EQ(BuildHipModule(ProgramSource{"hip-c", kScale, "scale", {}, {}}, *hip_, "gfx90a; rm").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildHipModule(ProgramSource{"hip-c", kScale, "other", {}, {}}, *hip_, "gfx90a").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(HipProgramTest, CodeObjectsAreCheckedForTheirForm) {
  EXPECT_EQ(BuildHipModule(ProgramSource{"hip-hsaco", "MZ", "k", {}, {}}, *hip_, "gfx90a").status().code(),
            absl::StatusCode::kInvalidArgument);
  ProgramSource with_options = ProgramSource{"hip-hsaco",
                                             "\x7f"
                                             "ELF",
                                             "k",
                                             {},
                                             {}};
  with_options.options = {"-O3"};
  EXPECT_EQ(BuildHipModule(with_options, *hip_, "gfx90a").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildHipModule(ProgramSource{"cuda-c", kScale, "scale", {}, {}}, *hip_, "gfx90a").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto compiled = BuildHipModule(ProgramSource{"hip-c", kScale, "scale", {}, {}}, *hip_, "gfx90a");
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  auto hsaco = BuildHipModule(ProgramSource{"hip-hsaco", compiled->image, "scale", {}, {}}, *hip_, "gfx90a");
  ASSERT_TRUE(hsaco.ok()) << hsaco.status();
  EXPECT_EQ(hsaco->image, compiled->image);
}

// What hiprtc writes in a code object's metadata is what replayd reads a kernel's
// arguments and launch bounds from (drivers/amdgpu_metadata.h): the explicit arguments'
// sizes and kinds in order (a struct by value at its size), __launch_bounds__ or LLVM's
// default of 1024, and the argument segment the runtime allocates for each launch and
// each graph node update.
TEST_F(HipProgramTest, TheMetadataHiprtcWritesGivesEachKernelsArgumentsAndLaunchBounds) {
  constexpr char kKernels[] = R"(
struct Five { float v[5]; };
extern "C" __global__ void __launch_bounds__(64) mixed(float *out, const float *in, int n, double d, char c) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + d + c;
}
extern "C" __global__ void by_value(Five f, float *x) { x[0] = f.v[3]; }
__global__ void twice(float *x) { x[0] *= 2; }
)";
  for (const char* arch : {"gfx90a", "gfx1030"}) {
    SCOPED_TRACE(arch);
    auto mixed = BuildHipModule(ProgramSource{"hip-c", kKernels, "mixed", {}, {}}, *hip_, arch);
    ASSERT_TRUE(mixed.ok()) << mixed.status();
    auto info = ReadAmdgpuKernelInfo(mixed->image, "mixed", "hip-c");
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_THAT(info->arg_sizes, ::testing::ElementsAre(8, 8, 4, 8, 1));
    EXPECT_THAT(info->arg_kinds,
                ::testing::ElementsAre("global_buffer", "global_buffer", "by_value", "by_value", "by_value"));
    EXPECT_EQ(info->max_flat_workgroup_size, 64u);
    // The explicit arguments end at 33; hidden ones follow only where the kernel uses them.
    EXPECT_GE(info->kernarg_segment_size, 33u);
    EXPECT_GE(info->kernarg_segment_align, 8u);
    info = ReadAmdgpuKernelInfo(mixed->image, "by_value", "hip-c");
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_THAT(info->arg_sizes, ::testing::ElementsAre(20, 8));
    EXPECT_EQ(info->max_flat_workgroup_size, 1024u);
    auto twice = BuildHipModule(ProgramSource{"hip-c", kKernels, "twice", {}, {}}, *hip_, arch);
    ASSERT_TRUE(twice.ok()) << twice.status();
    info = ReadAmdgpuKernelInfo(twice->image, twice->entry, "hip-c");
    ASSERT_TRUE(info.ok()) << "by its lowered name " << twice->entry << ": " << info.status();
    EXPECT_THAT(info->arg_sizes, ::testing::ElementsAre(8));
  }
}

// The decode demo's kernels are plain HIP as well as CUDA C: every entry compiles.
TEST_F(HipProgramTest, TheDemosGpuKernelsCompile) {
  const std::string code = client::DemoKernel("decode.cu");
  for (const char* entry :
       {"embed", "rmsnorm", "matvec", "kv_store", "attn_scores", "attn_softmax", "attn_mix", "argmax"}) {
    auto module = BuildHipModule(ProgramSource{"hip-c", code, entry, {}, {}}, *hip_, "gfx90a");
    ASSERT_TRUE(module.ok()) << entry << ": " << module.status();
  }
}

TEST(HipDriverTest, FindsTheDevicesOrSaysWhyNot) {
  HipDriver driver({});
  auto devices = driver.Discover();
  if (devices.empty()) {
    EXPECT_FALSE(driver.unavailable().empty());
    return;
  }
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceInfo& info = devices[i]->info();
    EXPECT_EQ(info.id, "hip:" + std::to_string(i));
    EXPECT_THAT(info.architecture, StartsWith("gfx"));
    EXPECT_GT(info.total_memory, 0u);
    EXPECT_THAT(info.formats, ::testing::Contains("hip-hsaco"));
  }
}

TEST(HipDeviceGraphTest, ParsesTheThreeChoices) {
  EXPECT_EQ(*ParseHipDeviceGraph("auto"), HipDeviceGraph::kAuto);
  EXPECT_EQ(*ParseHipDeviceGraph("graph"), HipDeviceGraph::kGraph);
  EXPECT_EQ(*ParseHipDeviceGraph("stream"), HipDeviceGraph::kStream);
  EXPECT_EQ(ParseHipDeviceGraph("hipgraph").status().code(), absl::StatusCode::kInvalidArgument);
}

// What the daemon passes to a HIP executor reads back as the same choice.
TEST(HipDeviceGraphTest, NamesReadBack) {
  for (HipDeviceGraph g : {HipDeviceGraph::kAuto, HipDeviceGraph::kGraph, HipDeviceGraph::kStream}) {
    absl::StatusOr<HipDeviceGraph> parsed = ParseHipDeviceGraph(HipDeviceGraphName(g));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, g);
  }
}

}  // namespace
}  // namespace replayd

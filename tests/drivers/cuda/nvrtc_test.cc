// NVRTC runs without a GPU: these compile CUDA C to PTX for sm_90 for real.
#include "drivers/cuda/nvrtc.h"

#include <gmock/gmock.h>

#include "drivers/cuda/cuda_library.h"
#include "tests/drivers/cuda/nvrtc_fixture.h"
#include "tests/support/temp_dir.h"

namespace replayd {
namespace {

using ::testing::HasSubstr;

constexpr char kScale[] = R"(
extern "C" __global__ void scale(float *x, int n, float k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= k;
})";

TEST_F(NvrtcTest, CompilesCudaCToPtxForSm90) {
  auto ptx = nvrtc_->Compile(kScale, "scale", "sm_90", {"-DUNUSED=1"}, NvrtcOutput::kPtx);
  ASSERT_TRUE(ptx.ok()) << ptx.status();
  EXPECT_THAT(ptx->image, HasSubstr(".target sm_90"));
  EXPECT_THAT(ptx->image, HasSubstr(".entry scale("));
  EXPECT_EQ(ptx->lowered_entry, "scale");
  EXPECT_FALSE(nvrtc_->version().empty());
}

TEST_F(NvrtcTest, CompilesCudaCToACubinForSm90) {
  auto cubin = nvrtc_->Compile(kScale, "scale", "sm_90", {}, NvrtcOutput::kCubin);
  ASSERT_TRUE(cubin.ok()) << cubin.status();
  EXPECT_EQ(cubin->lowered_entry, "scale");
  ASSERT_GT(cubin->image.size(), 64u);
  EXPECT_EQ(cubin->image.substr(0, 4),
            "\x7f"
            "ELF");
  uint16_t machine = 0;
  std::memcpy(&machine, cubin->image.data() + 18, 2);
  EXPECT_EQ(machine, 190) << "EM_CUDA";
  EXPECT_THAT(cubin->image, HasSubstr("scale"));
}

TEST_F(NvrtcTest, ACppKernelGetsItsLoweredName) {
  auto ptx = nvrtc_->Compile("__global__ void add(float *a, const float *b) { a[0] += b[0]; }", "add", "sm_90", {},
                             NvrtcOutput::kPtx);
  ASSERT_TRUE(ptx.ok()) << ptx.status();
  EXPECT_NE(ptx->lowered_entry, "add");  // mangled
  EXPECT_THAT(ptx->image, HasSubstr(ptx->lowered_entry));
}

TEST_F(NvrtcTest, ABrokenSourceReturnsItsDiagnostics) {
  auto ptx = nvrtc_->Compile("extern \"C\" __global__ void k(float *x) {\n  x[0] = nope;\n}\n", "k", "sm_90", {},
                             NvrtcOutput::kPtx);
  EXPECT_EQ(ptx.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ptx.status().message()), HasSubstr("program.cu(2)"));
  EXPECT_THAT(std::string(ptx.status().message()), HasSubstr("nope"));
}

TEST_F(NvrtcTest, AMissingEntryAndBadOptionsAreRefused) {
  EXPECT_EQ(
      nvrtc_->Compile("extern \"C\" __global__ void k() {}", "other", "sm_90", {}, NvrtcOutput::kPtx).status().code(),
      absl::StatusCode::kInvalidArgument);
  for (std::string bad : {"--include-path=/etc", "-I/etc", "--pre-include=/etc/passwd", "-DA;B"})
    EXPECT_EQ(
        nvrtc_->Compile("extern \"C\" __global__ void k() {}", "k", "sm_90", {bad}, NvrtcOutput::kPtx).status().code(),
        absl::StatusCode::kInvalidArgument)
        << bad;
  EXPECT_EQ(
      nvrtc_->Compile("extern \"C\" __global__ void k() {}", "k", "90; rm", {}, NvrtcOutput::kPtx).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(CudaLibraryTest, LoadsOrSaysWhyNot) {
  auto lib = CudaLibrary::Load();
  if (!lib.ok()) {
    // The development and CI machines have no NVIDIA driver.
    EXPECT_EQ(lib.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(lib.status().message()), HasSubstr("libcuda.so.1"));
    return;
  }
  int count = -1;
  EXPECT_EQ((*lib)->cuDeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_GE(count, 0);
}

// NVRTC is looked for by its versioned sonames on the loader's path, then under each
// CUDA install and its versioned siblings (/usr/local/cuda-13.0: the runtime package has
// no unversioned libnvrtc.so), and a missing library says where it looked.
TEST(NvrtcLookupTest, LooksUnderVersionedCudaInstalls) {
  TempDir dir;
  for (const char* sub : {"cuda", "cuda-12.4", "cuda-13.0"})
    std::filesystem::create_directories(dir.path() / sub / "targets/x86_64-linux/lib");
  const std::vector<std::string> names = Nvrtc::Candidates({dir.path() / "cuda"});
  ASSERT_GE(names.size(), 4u);
  EXPECT_EQ(names[0], "libnvrtc.so.13");
  EXPECT_EQ(names[1], "libnvrtc.so.12");
  auto at = [&](const std::string& path) { return std::find(names.begin(), names.end(), path) - names.begin(); };
  const std::string root = dir.path().string();
  const auto own = at(root + "/cuda/targets/x86_64-linux/lib/libnvrtc.so.13");
  const auto newest = at(root + "/cuda-13.0/targets/x86_64-linux/lib/libnvrtc.so.13");
  const auto older = at(root + "/cuda-12.4/targets/x86_64-linux/lib/libnvrtc.so.12");
  ASSERT_LT(own, static_cast<long>(names.size()));
  ASSERT_LT(newest, static_cast<long>(names.size()));
  ASSERT_LT(older, static_cast<long>(names.size()));
  EXPECT_LT(own, newest);
  EXPECT_LT(newest, older);
  for (const std::string& name : names) EXPECT_NE(name.substr(name.size() - 11), "libnvrtc.so") << name;

  auto missing = Nvrtc::Load({(dir.path() / "cuda/lib64/libnvrtc.so.13").string()});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("NVRTC not loaded"));
}

TEST(NvrtcLookupTest, TheInstalledToolkitIsFound) {
  auto nvrtc = Nvrtc::Load();
  if (!nvrtc.ok()) GTEST_SKIP() << nvrtc.status();
  EXPECT_THAT((*nvrtc)->path(), HasSubstr("libnvrtc.so.1"));
}

}  // namespace
}  // namespace replayd

// What a CUDA device makes of each program format, checked without a GPU: cuda-c through
// NVRTC for real, cuda-ptx and cuda-cubin by their form.
#include "drivers/cuda/cuda_program.h"

#include <elf.h>
#include <gmock/gmock.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>

#include "client/demo.h"
#include "drivers/cuda/cuda_driver.h"
#include "drivers/elf_image.h"
#include "tests/drivers/cuda/nvrtc_fixture.h"
#include "tests/support/status_macros.h"

namespace replayd {
namespace {

// NVRTC loaded, as in nvrtc_test.cc.
using CudaProgramTest = NvrtcTest;

using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kScale[] = R"(
extern "C" __global__ void scale(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= 2.0f;
})";

// A cubin's ELF header: EM_CUDA, and (CUDA ELF ABI version 8) the SM version in bits
// 8-15 of e_flags.
void ExpectCubinFor(const std::string& image, int sm) {
  ASSERT_GT(image.size(), 64u);
  EXPECT_EQ(image.substr(0, 4),
            "\x7f"
            "ELF");
  uint16_t machine = 0;
  uint32_t flags = 0;
  std::memcpy(&machine, image.data() + 18, 2);
  std::memcpy(&flags, image.data() + 48, 4);
  EXPECT_EQ(machine, 190);
  EXPECT_EQ(static_cast<uint8_t>(image[8]), 8) << "CUDA ELF ABI version";
  EXPECT_EQ((flags >> 8) & 0xff, static_cast<uint32_t>(sm)) << std::hex << flags;
}

TEST_F(CudaProgramTest, CudaCBecomesACubinForTheDevicesArchitecture) {
  auto module = BuildCudaModule(ProgramSource{"cuda-c", kScale, "scale", {}, {}}, nvrtc_.get(), "sm_90");
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_EQ(module->entry, "scale");
  ExpectCubinFor(module->image, 90);
}

TEST_F(CudaProgramTest, ACppKernelIsLookedUpByItsLoweredName) {
  auto module =
      BuildCudaModule(ProgramSource{"cuda-c", "__global__ void twice(float *x) { x[0] *= 2; }", "twice", {}, {}},
                      nvrtc_.get(), "sm_80");
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_NE(module->entry, "twice");
  EXPECT_THAT(module->image, HasSubstr(module->entry));
  ExpectCubinFor(module->image, 80);
}

TEST_F(CudaProgramTest, ABrokenCudaCSourceReturnsNvrtcDiagnostics) {
  auto module = BuildCudaModule(
      ProgramSource{"cuda-c", "extern \"C\" __global__ void k(float *x) {\n  x[0] = y;\n}", "k", {}, {}}, nvrtc_.get(),
      "sm_90");
  EXPECT_EQ(module.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(module.status().message()), HasSubstr("program.cu(2)"));
}

TEST_F(CudaProgramTest, PtxPassesThroughUnderTheProgramsEntry) {
  auto ptx = nvrtc_->Compile(kScale, "scale", "sm_90", {}, NvrtcOutput::kPtx);
  ASSERT_TRUE(ptx.ok()) << ptx.status();
  auto module = BuildCudaModule(ProgramSource{"cuda-ptx", ptx->image, "scale", {}, {}}, nvrtc_.get(), "sm_90");
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_EQ(module->entry, "scale");
  EXPECT_EQ(module->image, ptx->image);
}

TEST_F(CudaProgramTest, ACubinPassesThroughUnderTheProgramsEntry) {
  auto cubin = nvrtc_->Compile(kScale, "scale", "sm_90", {}, NvrtcOutput::kCubin);
  ASSERT_TRUE(cubin.ok()) << cubin.status();
  auto module = BuildCudaModule(ProgramSource{"cuda-cubin", cubin->image, "scale", {}, {}}, nvrtc_.get(), "sm_90");
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_EQ(module->entry, "scale");
  EXPECT_EQ(module->image, cubin->image);
}

TEST(CudaProgramFormTest, PtxAndCubinAreCheckedForTheirForm) {
  auto refused = [](ProgramSource s) { return BuildCudaModule(s, nullptr, "sm_90").status().code(); };
  EXPECT_EQ(refused(ProgramSource{"cuda-ptx", "not ptx at all", "k", {}, {}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(ProgramSource{"cuda-ptx", std::string(".version 8.0\n\0x", 15), "k", {}, {}}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(ProgramSource{"cuda-cubin", "MZ\x90\x00", "k", {}, {}}), absl::StatusCode::kInvalidArgument);
  ProgramSource with_options = ProgramSource{"cuda-ptx", ".version 8.0\n.target sm_90\n", "k", {}, {}};
  with_options.options = {"-O3"};
  EXPECT_EQ(refused(with_options), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(ProgramSource{"cpu-c", "void k(void) {}", "k", {}, {}}), absl::StatusCode::kInvalidArgument);
  // Without NVRTC there is no cuda-c.
  EXPECT_EQ(refused(ProgramSource{"cuda-c", kScale, "scale", {}, {}}), absl::StatusCode::kFailedPrecondition);

  // A cubin's bounds are checked before the loader, which takes no size, reads it.
  auto cut = BuildCudaModule(ProgramSource{"cuda-cubin",
                                           std::string("\x7f"
                                                       "ELF\x02\x01\x01",
                                                       7),
                                           "k",
                                           {},
                                           {}},
                             nullptr, "sm_90");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("shorter than an ELF64 header"));
}

// A real cubin passes the bounds check; every prefix of it, and every copy with a header
// field or a section header's offset or size corrupted, is refused or stays within its
// bytes (run under AddressSanitizer, a read past the end would fail the test).
TEST_F(CudaProgramTest, ACubinCutShortOrCraftedIsRefusedBeforeTheLoader) {
  auto cubin = nvrtc_->Compile(kScale, "scale", "sm_90", {}, NvrtcOutput::kCubin);
  ASSERT_TRUE(cubin.ok()) << cubin.status();
  const std::string& image = cubin->image;
  ASSERT_TRUE(CheckElfImage(image, kElfMachineCuda, "cuda-cubin").ok())
      << CheckElfImage(image, kElfMachineCuda, "cuda-cubin");
  EXPECT_FALSE(CheckElfImage(image, kElfMachineAmdgpu, "hip-hsaco").ok()) << "another machine";
  for (size_t n = 0; n < image.size(); n += std::max<size_t>(1, n / 16)) {
    auto module = BuildCudaModule(ProgramSource{"cuda-cubin", image.substr(0, n), "scale", {}, {}}, nullptr, "sm_90");
    EXPECT_EQ(module.status().code(), absl::StatusCode::kInvalidArgument) << n << " of " << image.size() << " bytes";
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof eh);
  auto with = [&](size_t at, uint64_t value, size_t bytes) {
    std::string crafted = image;
    std::memcpy(crafted.data() + at, &value, bytes);
    return CheckElfImage(crafted, kElfMachineCuda, "cuda-cubin");
  };
  EXPECT_FALSE(with(offsetof(Elf64_Ehdr, e_shoff), image.size(), 8).ok());
  EXPECT_FALSE(with(offsetof(Elf64_Ehdr, e_shoff), ~uint64_t{0} - 8, 8).ok()) << "offset + size overflows";
  EXPECT_FALSE(with(offsetof(Elf64_Ehdr, e_shnum), 0xffff, 2).ok());
  EXPECT_FALSE(with(offsetof(Elf64_Ehdr, e_phoff), image.size() - 8, 8).ok());
  EXPECT_FALSE(with(offsetof(Elf64_Ehdr, e_shstrndx), eh.e_shnum, 2).ok());
  for (uint16_t i = 1; i < eh.e_shnum; ++i) {
    const size_t header = eh.e_shoff + size_t{i} * sizeof(Elf64_Shdr);
    Elf64_Shdr sh;
    std::memcpy(&sh, image.data() + header, sizeof sh);
    if (sh.sh_type == SHT_NOBITS) continue;
    EXPECT_FALSE(with(header + offsetof(Elf64_Shdr, sh_size), image.size(), 8).ok()) << "section " << i;
    EXPECT_FALSE(with(header + offsetof(Elf64_Shdr, sh_offset), ~uint64_t{0}, 8).ok()) << "section " << i;
  }
}

TEST(CudaDriverTest, FindsTheDevicesOrSaysWhyNot) {
  CudaDriver driver({});
  auto devices = driver.Discover();
  if (devices.empty()) {
    // The development and CI machines have no NVIDIA driver.
    EXPECT_THAT(driver.unavailable(), HasSubstr("libcuda.so.1"));
    return;
  }
  EXPECT_THAT(driver.unavailable(), IsEmpty());
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceInfo& info = devices[i]->info();
    EXPECT_EQ(info.id, "cuda:" + std::to_string(i));
    EXPECT_EQ(info.kind, DeviceKind::kCuda);
    EXPECT_FALSE(info.name.empty());
    EXPECT_GT(info.total_memory, 0u);
    EXPECT_GE(info.limits.max_local_total, 64u);
    EXPECT_GE(info.limits.max_global[0], 65535u);
    EXPECT_THAT(info.target, HasSubstr("sm_"));
    EXPECT_THAT(info.formats, ::testing::Contains("cuda-ptx"));
    EXPECT_EQ(devices[i]->memory_in_use(), 0u);
  }
}

// On a GPU (tests/gpu/run.sh): an executor pins its channel's data area, a memfd's shared
// mapping, with cuMemHostRegister; the driver must take such memory, and transfers from and
// into it must be right. Where it refused, transfers would be staged without a word.
TEST(CudaDriverTest, AMemfdMappingLikeAChannelsDataAreaIsPinnedAndCarriesTransfers) {
  CudaDriver driver({});
  std::vector<std::unique_ptr<Device>> devices = driver.Discover();
  if (devices.empty()) GTEST_SKIP() << "no CUDA device: " << driver.unavailable();
  constexpr size_t kBytes = 4 << 20;
  const int fd = memfd_create("cuda-pin-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes), 0);
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  const std::span<uint8_t> area(static_cast<uint8_t*>(p), kBytes);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, devices[0]->OpenContext({"test"}));
    ASSERT_OK(c->PinHost(area));
    ASSERT_OK_AND_ASSIGN(Allocation a, c->Allocate(kBytes / 2));
    for (size_t i = 0; i < kBytes / 2; ++i) area[i] = static_cast<uint8_t>(i * 7 + i / 4096);
    ASSERT_OK(c->Write(a, 0, area.first(kBytes / 2)));
    ASSERT_OK(c->Read(a, 0, area.subspan(kBytes / 2)));
    for (size_t i = 0; i < kBytes / 2; i += 1 + i / 64)
      ASSERT_EQ(area[kBytes / 2 + i], static_cast<uint8_t>(i * 7 + i / 4096)) << i;
    c->Free(a);
  }
  munmap(p, kBytes);
}

TEST(CudaContextPolicyTest, ParsesTheTwoPolicies) {
  EXPECT_EQ(*ParseCudaContextPolicy("session"), CudaContextPolicy::kSession);
  EXPECT_EQ(*ParseCudaContextPolicy("primary"), CudaContextPolicy::kPrimary);
  EXPECT_EQ(ParseCudaContextPolicy("shared").status().code(), absl::StatusCode::kInvalidArgument);
}

// The decode demo's CUDA kernels compile for the H100/H200 architecture, every entry.
TEST_F(CudaProgramTest, TheDemosCudaKernelsCompile) {
  const std::string code = client::DemoKernel("decode.cu");
  ASSERT_FALSE(code.empty());
  for (const char* entry :
       {"embed", "rmsnorm", "matvec", "kv_store", "attn_scores", "attn_softmax", "attn_mix", "argmax"}) {
    auto module = BuildCudaModule(ProgramSource{"cuda-c", code, entry, {}, {}}, nvrtc_.get(), "sm_90");
    ASSERT_TRUE(module.ok()) << entry << ": " << module.status();
    EXPECT_EQ(module->entry, entry);
  }
}

}  // namespace
}  // namespace replayd

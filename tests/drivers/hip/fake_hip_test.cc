// The HIP driver against a fake libamdhip64.so.6 (tests/support/fake_hip), loaded as the
// daemon loads AMD's: the HipDriver, a daemon on loopback and HIP executors run for real
// over a runtime as strict as ROCm where replayd depends on it, so the mistakes that only
// a GPU would show (a memcpy node on address 0, a copy off an allocation, a code object
// for another target, a kernel fault that loses the device's state for every session)
// fail here.
//
// ctest runs it with LD_LIBRARY_PATH set to the fake's folder. By hand, from the build
// folder:
//   LD_LIBRARY_PATH=$PWD/tests/support/fake_hip tests/fake_hip_test
// Without the fake on the loader's path (AMD's runtime or none), every case skips.
//
// The fake's hiprtc compiles nothing, so the programs here are code objects made by hand
// (tests/support/amdgpu_code_object.h): ELF images the fake loads and whose kernels it
// finds by name, with the metadata note replayd reads a kernel's arguments and launch
// bounds from.
#include <dlfcn.h>
#include <elf.h>
#include <gmock/gmock.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "drivers/hip/hip_driver.h"
#include "drivers/hip/hip_library.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/support/amdgpu_code_object.h"
#include "tests/support/fake_gpu_executors.h"
#include "tests/support/fake_hip/fake_hip.h"
#include "tests/support/add_kernel.h"
#include "tests/support/copy_graphs.h"
#include "tests/support/graph_def.h"
#include "tests/support/pinned_transfers.h"
#include "tests/support/status_macros.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tenants_file.h"

namespace replayd::client {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The fake's test hooks, found in the libamdhip64.so.6 that the driver loaded.
struct FakeHip {
  decltype(&fake_hip_reset) reset = nullptr;
  decltype(&fake_hip_count) count = nullptr;
  decltype(&fake_hip_set_kernarg_limit) set_kernarg_limit = nullptr;
};

// The name the fake is loaded by: libamdhip64.so.6, or $REPLAYD_FAKE_HIP_LIBRARY.
const char* FakeLibrary() {
  const char* name = std::getenv("REPLAYD_FAKE_HIP_LIBRARY");
  return name ? name : "libamdhip64.so.6";
}

// The hooks; UNAVAILABLE saying why when the library the driver loads is not the fake.
absl::StatusOr<FakeHip> FindFake() {
  constexpr char kHow[] = "run with LD_LIBRARY_PATH=<build>/tests/support/fake_hip (ctest does)";
  absl::StatusOr<std::unique_ptr<HipLibrary>> loaded = HipLibrary::Load();
  if (!loaded.ok()) return absl::UnavailableError(absl::StrCat(loaded.status().message(), "; ", kHow));
  // The library Load opened stays loaded for the life of the process, as does this handle.
  void* handle = dlopen(FakeLibrary(), RTLD_NOW | RTLD_NOLOAD);
  FakeHip fake;
  if (handle) {
    fake.reset = reinterpret_cast<decltype(fake.reset)>(dlsym(handle, "fake_hip_reset"));
    fake.count = reinterpret_cast<decltype(fake.count)>(dlsym(handle, "fake_hip_count"));
    fake.set_kernarg_limit =
        reinterpret_cast<decltype(fake.set_kernarg_limit)>(dlsym(handle, "fake_hip_set_kernarg_limit"));
  }
  if (!fake.reset || !fake.count || !fake.set_kernarg_limit)
    return absl::UnavailableError(absl::StrCat("the libamdhip64 loaded is AMD's runtime, not the fake; ", kHow));
  return fake;
}

constexpr int64_t kN = 256;  // floats per buffer
using replayd::testing::AmdgpuCodeObject;
using replayd::testing::AmdgpuKernelSpec;
using replayd::testing::copy_graphs::Iota;
using replayd::testing::kGfx1030;
using replayd::testing::OffloadBundle;

// The kernels of the code objects here, as their metadata describes them.
const AmdgpuKernelSpec kScale{"scale", {8, 4}}, kShift{"shift", {8, 4}}, kFault{"fault", {8}},
    kAdd{"add", {8, 8, 8, 4}}, kK{"k", {}};

std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The kinds of object the fake counts, each of which its owner must release.
constexpr const char* kObjects[] = {"allocations", "host_allocations", "registered", "streams",
                                    "events",      "modules",          "graphs",     "graph_execs"};

const char* GraphName(HipDeviceGraph g) { return g == HipDeviceGraph::kGraph ? "graph" : "stream"; }

class FakeHipDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<FakeHip> fake = FindFake();
    // Told which name to find the fake by, the test fails where it would skip.
    if (!fake.ok() && std::getenv("REPLAYD_FAKE_HIP_LIBRARY")) FAIL() << FakeLibrary() << ": " << fake.status();
    if (!fake.ok()) GTEST_SKIP() << fake.status().message();
    fake_ = *fake;
    fake_.reset();
  }

  // The one device the fake serves, through a HipDriver making device graphs as `graph`.
  std::unique_ptr<Device> Discover(HipDeviceGraph graph) {
    HipDriverOptions options;
    options.device_graph = graph;
    HipDriver driver(options);
    std::vector<std::unique_ptr<Device>> devices = driver.Discover();
    EXPECT_EQ(devices.size(), 1u) << driver.unavailable();
    return devices.empty() ? nullptr : std::move(devices[0]);
  }

  void ExpectNothingLeft() {
    for (const char* what : kObjects) EXPECT_EQ(fake_.count(what), 0) << what;
    EXPECT_EQ(fake_.count("reclaimed"), 0) << "objects freed only by hipDeviceReset";
  }

  FakeHip fake_;
};

// The same, for each form of device graph.
class FakeHipDeviceGraphTest : public FakeHipDriverTest, public ::testing::WithParamInterface<HipDeviceGraph> {};

TEST_F(FakeHipDriverTest, DiscoveryFindsTheFakeDeviceWithItsNameMemoryAndLimits) {
  HipDriver driver({});
  std::vector<std::unique_ptr<Device>> devices = driver.Discover();
  ASSERT_EQ(devices.size(), 1u) << driver.unavailable();
  const DeviceInfo& info = devices[0]->info();
  EXPECT_EQ(info.id, "hip:0");
  EXPECT_EQ(info.kind, DeviceKind::kHip);
  EXPECT_EQ(info.name, "Fake MI210");
  EXPECT_EQ(info.total_memory, uint64_t{1} << 30);
  EXPECT_EQ(info.architecture, "gfx90a");
  EXPECT_EQ(info.driver_version, absl::StrCat("HIP ", HIP_VERSION_MAJOR, ".", HIP_VERSION_MINOR, " runtime"));
  EXPECT_EQ(info.target, absl::StrCat("gfx90a:sramecc+:xnack--hiprtc-", HIP_VERSION_MAJOR, ".", HIP_VERSION_MINOR));
  EXPECT_THAT(info.limits.max_global, ElementsAre(2147483647u, 65536u, 65536u));
  EXPECT_EQ(info.limits.max_global_total, uint64_t{2147483647} * 65536 * 65536);
  EXPECT_THAT(info.limits.max_local, ElementsAre(1024u, 1024u, 1024u));
  EXPECT_EQ(info.limits.max_local_total, 1024u);
  EXPECT_THAT(info.formats, ElementsAre("hip-hsaco", "hip-c")) << "the fake's hiprtc is found in the runtime";
  EXPECT_TRUE(devices[0]->health().ok());
}

// Memory starts zeroed (the fake's holds garbage until the driver clears it); writes,
// reads and copies go through the staging buffers; a device graph of copy nodes is
// retargeted by Update and launched, as memcpy nodes of a hipGraph or copies on the
// session's stream.
// Memory a context pins (an executor's channel data area) is registered with the runtime
// while the context lives; a transfer from or into it is one copy straight to the device,
// and one from elsewhere still goes through the staging buffers.
TEST_F(FakeHipDriverTest, PinnedHostMemoryIsCopiedStraightAndUnregisteredWithItsContext) {
  std::unique_ptr<Device> device = Discover(HipDeviceGraph::kStream);
  ASSERT_NE(device, nullptr);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device->OpenContext({"test"}));
    testing::CheckPinnedTransfers(*c, fake_.count);
  }
  EXPECT_EQ(fake_.count("registered"), 0) << "unregistered when the context closed";
  device.reset();
  ExpectNothingLeft();
}

TEST_P(FakeHipDeviceGraphTest, TransfersCopiesAndCopyNodesMoveTheRightBytes) {
  std::unique_ptr<Device> device = Discover(GetParam());
  ASSERT_NE(device, nullptr);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device->OpenContext({"test"}));
    EXPECT_EQ(c->wants_edges(), GetParam() == HipDeviceGraph::kGraph);
    constexpr uint64_t kBytes = kN * 4;
    ASSERT_OK_AND_ASSIGN(Allocation a, c->Allocate(kBytes));
    ASSERT_OK_AND_ASSIGN(Allocation b, c->Allocate(kBytes));
    ASSERT_OK_AND_ASSIGN(Allocation d, c->Allocate(kBytes));
    std::vector<uint8_t> got(kBytes, 0xff);
    ASSERT_TRUE(c->Read(b, 0, got).ok());
    EXPECT_EQ(got, std::vector<uint8_t>(kBytes, 0));
    const std::vector<uint8_t> pattern = Bytes(Iota(kN, 1));
    ASSERT_TRUE(c->Write(a, 0, pattern).ok());
    ASSERT_TRUE(c->Copy(b, 16, a, 0, kBytes - 16).ok());
    ASSERT_TRUE(c->Synchronize().ok());
    ASSERT_TRUE(c->Read(b, 16, std::span(got).first(kBytes - 16)).ok());
    got.resize(kBytes - 16);
    EXPECT_EQ(got, std::vector<uint8_t>(pattern.begin(), pattern.end() - 16));
    EXPECT_FALSE(c->Copy(b, 8, a, 0, kBytes).ok()) << "past the end of the destination";

    // a -> b -> d, ordered by an edge.
    std::vector<GraphNode> nodes(2);
    nodes[0].args = {ArgValue{.address = b.address}, ArgValue{.address = a.address}};
    nodes[1].args = {ArgValue{.address = d.address}, ArgValue{.address = b.address}};
    nodes[0].copy_bytes = nodes[1].copy_bytes = kBytes;
    const std::pair<size_t, size_t> edges[] = {{0, 1}};
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceGraph> graph, c->Instantiate(nodes, edges));
    const int execs = GetParam() == HipDeviceGraph::kGraph ? 1 : 0;
    EXPECT_EQ(fake_.count("graph_execs"), execs);
    ASSERT_TRUE(graph->Launch(/*wait=*/true).ok());
    std::vector<uint8_t> out(kBytes);
    ASSERT_TRUE(c->Read(d, 0, out).ok());
    EXPECT_EQ(out, pattern);
    // Retargeted: d -> b -> a, with fresh bytes in d.
    ASSERT_TRUE(c->Write(d, 0, Bytes(Iota(kN, 500))).ok());
    ASSERT_TRUE(graph->Update(0, std::vector<ArgValue>{{.address = b.address}, {.address = d.address}}, {}, {}).ok());
    ASSERT_TRUE(graph->Update(1, std::vector<ArgValue>{{.address = a.address}, {.address = b.address}}, {}, {}).ok());
    ASSERT_TRUE(graph->Launch(/*wait=*/true).ok());
    ASSERT_TRUE(c->Read(a, 0, out).ok());
    EXPECT_EQ(out, Bytes(Iota(kN, 500)));
    graph.reset();
    for (const Allocation& x : {a, b, d}) c->Free(x);
  }
  device.reset();
  ExpectNothingLeft();
}

// A code object for the device's target loads and its kernels are found by name; one for
// another target, one without the kernel and hip-c (the fake's hiprtc compiles nothing)
// are refused as a client's mistakes, with the runtime's and the compiler's words. A
// kernel node is retargeted in place.
TEST_P(FakeHipDeviceGraphTest, CodeObjectsLoadForTheirTargetAndKernelNodesAreRetargeted) {
  std::unique_ptr<Device> device = Discover(GetParam());
  ASSERT_NE(device, nullptr);
  TempDir dir;
  const Signature signature{{{"x", ParamKind::kBuffer, Access::kInout}, {"n", ParamKind::kInt32}}};
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device->OpenContext({"test"}));
    auto load = [&](const ProgramSource& source) -> absl::StatusOr<std::unique_ptr<Kernel>> {
      const std::filesystem::path artifact = dir.path() / source.entry;
      if (absl::Status s = device->Compile(source, artifact); !s.ok()) return s;
      return c->Load(source, artifact);
    };
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> scale,
                         load({"hip-hsaco", AmdgpuCodeObject({kScale, kShift}), "scale", signature, {}}));
    EXPECT_EQ(fake_.count("modules"), 1);

    absl::StatusOr<std::unique_ptr<Kernel>> other = load({"hip-hsaco", AmdgpuCodeObject({kScale}), "missing", signature, {}});
    EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument) << other.status();
    EXPECT_THAT(std::string(other.status().message()), HasSubstr("no kernel named missing"));
    absl::StatusOr<std::unique_ptr<Kernel>> rdna =
        load({"hip-hsaco", AmdgpuCodeObject({kScale}, kGfx1030), "scale", signature, {}});
    EXPECT_EQ(rdna.status().code(), absl::StatusCode::kInvalidArgument) << rdna.status();
    EXPECT_THAT(std::string(rdna.status().message()),
                AllOf(HasSubstr("does not load on hip:0"), HasSubstr("hipErrorNoBinaryForGpu")));
    absl::StatusOr<std::unique_ptr<Kernel>> source = load({"hip-c", "__global__ void k() {}", "k", signature, {}});
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << source.status();
    EXPECT_THAT(std::string(source.status().message()),
                HasSubstr("program.hip:1:1: error: the fake HIP runtime compiles no hip-c"));
    EXPECT_EQ(fake_.count("modules"), 1) << "a refused module is unloaded";

    ASSERT_OK_AND_ASSIGN(Allocation x, c->Allocate(kN * 4));
    ASSERT_OK_AND_ASSIGN(std::optional<absl::Duration> took,
                         c->Launch(*scale, std::vector<ArgValue>{{.address = x.address}, {.integer = kN}}, {4, 1, 1},
                                   {64, 1, 1}, /*wait=*/true));
    EXPECT_TRUE(took.has_value());
    EXPECT_FALSE(c->Launch(*scale, std::vector<ArgValue>{{.address = x.address}, {.integer = kN}}, {1, 1, 1},
                           {2048, 1, 1}, /*wait=*/true)
                     .ok())
        << "a block past the device's threads";

    std::vector<GraphNode> nodes(1);
    nodes[0].kernel = scale.get();
    nodes[0].args = {ArgValue{.address = x.address}, ArgValue{.integer = kN}};
    nodes[0].global = {4, 1, 1};
    nodes[0].local = {64, 1, 1};
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceGraph> graph, c->Instantiate(nodes, {}));
    ASSERT_TRUE(graph->Launch(/*wait=*/true).ok());
    ASSERT_TRUE(graph->Update(0, std::vector<ArgValue>{{.address = x.address + 64}, {.integer = kN - 16}}, {8, 1, 1},
                              {32, 1, 1})
                    .ok());
    ASSERT_TRUE(graph->Launch(/*wait=*/false).ok());
    ASSERT_TRUE(c->Synchronize().ok());
    graph.reset();
    scale.reset();
    c->Free(x);
  }
  device.reset();
  ExpectNothingLeft();
}

INSTANTIATE_TEST_SUITE_P(DeviceGraphs, FakeHipDeviceGraphTest, ::testing::Values(HipDeviceGraph::kGraph,
                                                                            HipDeviceGraph::kStream),
                         [](const ::testing::TestParamInfo<HipDeviceGraph>& info) { return GraphName(info.param); });

// The fake itself, through the entry points the driver resolves: a memcpy node must lie
// in live allocations, at creation and when retargeted, as the runtime demands, and a
// graph launch performs it; a module image is a code object or an offload bundle with one
// for the device's target.
// ROCm refuses a launch past the kernel's launch bounds with hipErrorLaunchFailure, which
// replayd counts as a refused request, not a fault (its own check comes first); the fake
// does the same, and a kernel whose pointer argument is off the live allocations faults.
TEST_F(FakeHipDriverTest, TheFakeRefusesALaunchPastTheKernelsBoundsAndFaultsOnADeadPointer) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HipLibrary> hip, HipLibrary::Load());
  ASSERT_EQ(hip->hipInit(0), hipSuccess);
  ASSERT_EQ(hip->hipSetDevice(0), hipSuccess);
  const std::string image = AmdgpuCodeObject({AmdgpuKernelSpec{"scale", {8, 4}, 64}});
  hipModule_t module = nullptr;
  ASSERT_EQ(hip->hipModuleLoadData(&module, image.data()), hipSuccess);
  hipFunction_t scale = nullptr;
  ASSERT_EQ(hip->hipModuleGetFunction(&scale, module, "scale"), hipSuccess);
  void* x = nullptr;
  ASSERT_EQ(hip->hipMalloc(&x, 256), hipSuccess);
  int n = 64;
  void* args[] = {&x, &n};
  EXPECT_EQ(hip->hipModuleLaunchKernel(scale, 1, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr), hipErrorLaunchFailure);
  ASSERT_EQ(hip->hipModuleLaunchKernel(scale, 1, 1, 1, 64, 1, 1, 0, nullptr, args, nullptr), hipSuccess);
  ASSERT_EQ(hip->hipStreamSynchronize(nullptr), hipSuccess);
  EXPECT_EQ(fake_.count("faulted"), 0);
  void* dead = x;
  ASSERT_EQ(hip->hipFree(x), hipSuccess);
  void* stale[] = {&dead, &n};
  ASSERT_EQ(hip->hipModuleLaunchKernel(scale, 1, 1, 1, 64, 1, 1, 0, nullptr, stale, nullptr), hipSuccess);
  EXPECT_EQ(hip->hipStreamSynchronize(nullptr), hipErrorIllegalAddress) << "the kernel ran on freed memory";
  EXPECT_EQ(fake_.count("faulted"), 1);
  (void)hip->hipModuleUnload(module);
}

TEST_F(FakeHipDriverTest, TheFakeRefusesAMemcpyNodeOffLiveAllocations) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HipLibrary> hip, HipLibrary::Load());
  ASSERT_EQ(hip->hipInit(0), hipSuccess);
  ASSERT_EQ(hip->hipSetDevice(0), hipSuccess);
  EXPECT_EQ(hip->hipSetDevice(1), hipErrorInvalidDevice);
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(hip->hipMalloc(&a, 256), hipSuccess);
  ASSERT_EQ(hip->hipMalloc(&b, 256), hipSuccess);
  hipStream_t stream = nullptr;
  ASSERT_EQ(hip->hipStreamCreateWithFlags(&stream, hipStreamNonBlocking), hipSuccess);
  std::vector<uint8_t> pattern = Bytes(Iota(64, 7));
  ASSERT_EQ(hip->hipMemcpyHtoDAsync(a, pattern.data(), 256, stream), hipSuccess);
  EXPECT_EQ(hip->hipMemcpyHtoDAsync(static_cast<char*>(a) + 8, pattern.data(), 256, stream), hipErrorInvalidValue)
      << "past the end of its allocation";

  hipGraph_t graph = nullptr;
  ASSERT_EQ(hip->hipGraphCreate(&graph, 0), hipSuccess);
  hipGraphNode_t node = nullptr;
  struct Refused {
    const char* what;
    void* dst;
    const void* src;
    size_t bytes;
  };
  const Refused refused[] = {{"destination 0", nullptr, a, 256},
                             {"source 0", b, nullptr, 256},
                             {"past the source", b, a, 257},
                             {"past the destination", static_cast<char*>(b) + 8, a, 256},
                             {"host memory", b, pattern.data(), 256}};
  for (const Refused& r : refused)
    EXPECT_EQ(hip->hipGraphAddMemcpyNode1D(&node, graph, nullptr, 0, r.dst, r.src, r.bytes, hipMemcpyDeviceToDevice),
              hipErrorInvalidValue)
        << r.what;
  ASSERT_EQ(hip->hipGraphAddMemcpyNode1D(&node, graph, nullptr, 0, b, a, 256, hipMemcpyDeviceToDevice), hipSuccess);
  hipGraphExec_t exec = nullptr;
  ASSERT_EQ(hip->hipGraphInstantiateWithFlags(&exec, graph, 0), hipSuccess);
  EXPECT_EQ(hip->hipGraphExecMemcpyNodeSetParams1D(exec, node, nullptr, a, 256, hipMemcpyDeviceToDevice),
            hipErrorInvalidValue);
  ASSERT_EQ(hip->hipGraphLaunch(exec, stream), hipSuccess);
  std::vector<uint8_t> got(256);
  ASSERT_EQ(hip->hipMemcpyDtoHAsync(got.data(), b, 256, stream), hipSuccess);
  EXPECT_EQ(got, pattern);

  // Module images: an offload bundle loads when it holds a code object for the target.
  hipModule_t module = nullptr;
  const std::string host = "host-x86_64-unknown-linux--";
  const std::string bundle = OffloadBundle({{host, ""},
                                            {"hipv4-amdgcn-amd-amdhsa--gfx1030", AmdgpuCodeObject({kK}, kGfx1030)},
                                            {"hipv4-amdgcn-amd-amdhsa--gfx90a", AmdgpuCodeObject({kK})}});
  ASSERT_EQ(hip->hipModuleLoadData(&module, bundle.data()), hipSuccess);
  hipFunction_t k = nullptr;
  EXPECT_EQ(hip->hipModuleGetFunction(&k, module, "k"), hipSuccess);
  EXPECT_EQ(hip->hipModuleUnload(module), hipSuccess);
  const std::string elsewhere = OffloadBundle({{"hipv4-amdgcn-amd-amdhsa--gfx1030", AmdgpuCodeObject({kK}, kGfx1030)}});
  EXPECT_EQ(hip->hipModuleLoadData(&module, elsewhere.data()), hipErrorNoBinaryForGpu);
  EXPECT_EQ(hip->hipModuleLoadData(&module, "MZ: neither a code object nor a bundle"), hipErrorInvalidImage);

  EXPECT_EQ(hip->hipGraphExecDestroy(exec), hipSuccess);
  EXPECT_EQ(hip->hipGraphDestroy(graph), hipSuccess);
  EXPECT_EQ(hip->hipStreamDestroy(stream), hipSuccess);
  for (void* p : {a, b}) EXPECT_EQ(hip->hipFree(p), hipSuccess);
  ExpectNothingLeft();
}

// hiprtc of AMD's runtime where the machine has one (Debian's libamdhip64.so.5 compiles
// for any target without a GPU), opened beside the fake: what it makes for a target is
// what a client would send as hip-hsaco.
class RealHiprtc {
 public:
  static absl::StatusOr<RealHiprtc> Open() {
    void* handle = dlopen("libamdhip64.so.5", RTLD_NOW | RTLD_LOCAL);
    if (!handle) return absl::UnavailableError("AMD's libamdhip64.so.5 is not installed");
    RealHiprtc rtc;
    rtc.create_ = reinterpret_cast<decltype(&hiprtcCreateProgram)>(dlsym(handle, "hiprtcCreateProgram"));
    rtc.compile_ = reinterpret_cast<decltype(&hiprtcCompileProgram)>(dlsym(handle, "hiprtcCompileProgram"));
    rtc.size_ = reinterpret_cast<decltype(&hiprtcGetCodeSize)>(dlsym(handle, "hiprtcGetCodeSize"));
    rtc.code_ = reinterpret_cast<decltype(&hiprtcGetCode)>(dlsym(handle, "hiprtcGetCode"));
    rtc.destroy_ = reinterpret_cast<decltype(&hiprtcDestroyProgram)>(dlsym(handle, "hiprtcDestroyProgram"));
    if (!rtc.create_ || !rtc.compile_ || !rtc.size_ || !rtc.code_ || !rtc.destroy_)
      return absl::UnavailableError("AMD's libamdhip64.so.5 has no hiprtc");
    return rtc;
  }
  // The code object of `source` for `arch`.
  absl::StatusOr<std::string> Compile(const char* source, const std::string& arch) const {
    hiprtcProgram prog = nullptr;
    if (create_(&prog, source, "program.hip", 0, nullptr, nullptr) != HIPRTC_SUCCESS)
      return absl::InternalError("hiprtcCreateProgram");
    const std::string option = "--offload-arch=" + arch;
    const char* options[] = {option.c_str()};
    std::string image;
    size_t size = 0;
    if (compile_(prog, 1, options) == HIPRTC_SUCCESS && size_(prog, &size) == HIPRTC_SUCCESS && size > 0) {
      image.resize(size);
      if (code_(prog, image.data()) != HIPRTC_SUCCESS) image.clear();
    }
    destroy_(&prog);
    if (image.empty()) return absl::UnavailableError("hiprtc compiled nothing for " + arch);
    return image;
  }

 private:
  decltype(&hiprtcCreateProgram) create_ = nullptr;
  decltype(&hiprtcCompileProgram) compile_ = nullptr;
  decltype(&hiprtcGetCodeSize) size_ = nullptr;
  decltype(&hiprtcGetCode) code_ = nullptr;
  decltype(&hiprtcDestroyProgram) destroy_ = nullptr;
};

// The fake takes what AMD's compiler makes, by the rules it checks AmdgpuCodeObject's
// images with: a code object for the device's target loads and its kernel is found, one
// for the device's target with xnack on (which the device runs without) or for another
// target does not.
TEST_F(FakeHipDriverTest, TheFakeLoadsWhatAmdsCompilerMakesForItsTargetOnly) {
  absl::StatusOr<RealHiprtc> rtc = RealHiprtc::Open();
  if (!rtc.ok()) GTEST_SKIP() << rtc.status().message();
  constexpr char kScale[] = R"(
extern "C" __global__ void scale(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= 2.0f;
})";
  ASSERT_OK_AND_ASSIGN(std::string mine, rtc->Compile(kScale, "gfx90a:sramecc+:xnack-"));
  ASSERT_OK_AND_ASSIGN(std::string xnack, rtc->Compile(kScale, "gfx90a:xnack+"));
  ASSERT_OK_AND_ASSIGN(std::string rdna, rtc->Compile(kScale, "gfx1030"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HipLibrary> hip, HipLibrary::Load());
  ASSERT_EQ(hip->hipInit(0), hipSuccess);
  hipModule_t module = nullptr;
  ASSERT_EQ(hip->hipModuleLoadData(&module, mine.data()), hipSuccess);
  hipFunction_t f = nullptr;
  EXPECT_EQ(hip->hipModuleGetFunction(&f, module, "scale"), hipSuccess);
  EXPECT_EQ(hip->hipModuleGetFunction(&f, module, "other"), hipErrorNotFound);
  EXPECT_EQ(hip->hipModuleUnload(module), hipSuccess);
  EXPECT_EQ(hip->hipModuleLoadData(&module, xnack.data()), hipErrorNoBinaryForGpu);
  EXPECT_EQ(hip->hipModuleLoadData(&module, rdna.data()), hipErrorNoBinaryForGpu);
  ExpectNothingLeft();
}

// A kernel fault loses the device's state for every session on it: both contexts fail
// with the fault, a new one is refused while they are open, and the last to close resets
// the device, which then serves again.
TEST_F(FakeHipDriverTest, AKernelFaultFailsEverySessionUntilTheLastCloses) {
  std::unique_ptr<Device> device = Discover(HipDeviceGraph::kStream);
  ASSERT_NE(device, nullptr);
  TempDir dir;
  const ProgramSource source{
      "hip-hsaco", AmdgpuCodeObject({kFault}), "fault", Signature{{{"x", ParamKind::kBuffer, Access::kInout}}}, {}};
  ASSERT_TRUE(device->Compile(source, dir.path() / "fault").ok());
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> mine, device->OpenContext({"test"}));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> theirs, device->OpenContext({"test"}));
    ASSERT_OK_AND_ASSIGN(Allocation x, mine->Allocate(64));
    ASSERT_OK_AND_ASSIGN(Allocation y, theirs->Allocate(64));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Kernel> fault, mine->Load(source, dir.path() / "fault"));
    auto launched = mine->Launch(*fault, std::vector<ArgValue>{{.address = x.address}}, {1, 1, 1}, {1, 1, 1}, true);
    EXPECT_EQ(launched.status().code(), absl::StatusCode::kFailedPrecondition) << launched.status();
    EXPECT_THAT(std::string(launched.status().message()),
                AllOf(HasSubstr("kernel fault"), HasSubstr("hipErrorIllegalAddress")));
    EXPECT_EQ(fake_.count("faulted"), 1);
    EXPECT_FALSE(device->health().ok());
    std::vector<uint8_t> got(64);
    absl::Status read = theirs->Read(y, 0, got);
    EXPECT_EQ(read.code(), absl::StatusCode::kFailedPrecondition) << read;
    absl::StatusOr<std::unique_ptr<Context>> refused = device->OpenContext({"test"});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
    fault.reset();
    mine->Free(x);
    theirs->Free(y);
  }
  EXPECT_EQ(fake_.count("resets"), 1) << "the last context out resets the device";
  EXPECT_EQ(fake_.count("faulted"), 0);
  EXPECT_TRUE(device->health().ok());
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> again, device->OpenContext({"test"}));
    ASSERT_OK_AND_ASSIGN(Allocation z, again->Allocate(64));
    ASSERT_TRUE(again->Write(z, 0, Bytes(Iota(16, 3))).ok());
    again->Free(z);
  }
  device.reset();
  for (const char* what : kObjects) EXPECT_EQ(fake_.count(what), 0) << what;
}

// Where the daemon runs a tenant's HIP work and which device graph it makes, named for
// test names: in the daemon's process, or in an executor process of the tenant's own
// (whose fake runtime is its own: this process's fake then sees none of its objects).
struct Policy {
  HipDeviceGraph graph;
  Isolation isolation;
  const char* name;
};
void PrintTo(const Policy& p, std::ostream* os) { *os << p.name; }
const auto kPolicies = ::testing::Values(Policy{HipDeviceGraph::kGraph, Isolation::kShared, "graph"},
                                         Policy{HipDeviceGraph::kStream, Isolation::kShared, "stream"},
                                         Policy{HipDeviceGraph::kGraph, Isolation::kProcess, "executor_graph"},
                                         Policy{HipDeviceGraph::kStream, Isolation::kProcess, "executor_stream"});
std::string PolicyName(const ::testing::TestParamInfo<Policy>& info) { return info.param.name; }

// The bytes of argument segments a hipGraph's updates may take before it is instantiated
// afresh, in the daemons here: small, so that a test's replays pass it.
constexpr uint64_t kGraphKernargBytes = 4096;

// A daemon on loopback serving cpu:0 and the fake's hip:0, its HIP work where the
// parameter says.
class FakeHipDaemonTest : public DaemonFixture, public ::testing::WithParamInterface<Policy> {
 protected:
  void SetUp() override {
    absl::StatusOr<FakeHip> fake = FindFake();
    if (!fake.ok()) GTEST_SKIP() << fake.status().message();
    fake_ = *fake;
    fake_.reset();
    Options options;
    options.adjust = [this](DaemonOptions& d) {
      d.devices = {"cpu", "hip"};
      d.hip.device_graph = GetParam().graph;
      d.hip.graph_kernarg_bytes = kGraphKernargBytes;
      d.tenant_defaults.isolation = GetParam().isolation;
    };
    Start(options);
    if (HasFatalFailure()) return;
    auto session = client_->OpenSession("hip:0");
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = std::make_unique<Session>(std::move(*session));
    if (GetParam().isolation == Isolation::kProcess) {
      EXPECT_EQ(fake_.count("streams"), 0) << "the session's stream is its executor's, not the daemon's";
    }
  }

  Buffer Alloc(uint64_t bytes) {
    auto b = session_->Alloc(bytes);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : Buffer();
  }

  // Ends the session and the daemon; the fake must hold nothing that the driver did not
  // release itself.
  void ExpectTheDaemonLeftNothing() {
    ASSERT_TRUE(session_->Close().ok());
    session_.reset();
    client_.reset();
    daemon_.reset();
    for (const char* what : kObjects) EXPECT_EQ(fake_.count(what), 0) << what;
    EXPECT_EQ(fake_.count("reclaimed"), 0) << "objects freed only by hipDeviceReset";
  }

  FakeHip fake_;
  std::unique_ptr<Session> session_;
};

// Copies on every kind of slot in one device graph (tests/support/copy_graphs.h), whose
// memcpy nodes the fake checks against the live allocations: no node on a placeholder
// address.
TEST_P(FakeHipDaemonTest, ACopyGraphOnParametersInternalsAndConstantsReplaysOnFreshBuffers) {
  replayd::testing::CheckACopyGraphOnEveryKindOfSlot(*session_, kN);
  ExpectTheDaemonLeftNothing();
}

// The same kind of graph from a capture.
TEST_P(FakeHipDaemonTest, ACapturedCopyChainReplaysOnFreshBuffers) {
  replayd::testing::CheckACapturedCopyChain(*session_, kN);
  ExpectTheDaemonLeftNothing();
}

// A program freed while a launch of it is still queued on the device: its module stays
// loaded until the launch has run (the fake runs queued work only when it is waited for,
// and faults a kernel whose module has gone by then).
TEST_P(FakeHipDaemonTest, AProgramFreedWithALaunchInFlightOutlivesTheLaunch) {
  const v1::Signature signature = *ParseSignature("out,in,in,int32");
  Buffer a = Alloc(kN * 4), b = Alloc(kN * 4), out = Alloc(kN * 4);
  {
    ASSERT_OK_AND_ASSIGN(Program p,
                         session_->Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({kAdd}), "add", signature, {}}));
    ASSERT_OK(session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1},
                               /*wait=*/false)
                  .status());
  }  // freed here, the launch not waited for
  ASSERT_OK_AND_ASSIGN(Program again,
                       session_->Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({kAdd}), "add", signature, {}}));
  EXPECT_OK(session_->Launch(again, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1},
                             /*wait=*/true)
                .status());
}

// A code object loaded by the fake and launched (the kernel does not run); one for another
// target and hip-c (which the fake's hiprtc refuses) are INVALID_ARGUMENT with the
// runtime's and the compiler's words; a captured launch becomes a kernel node retargeted
// at each replay.
TEST_P(FakeHipDaemonTest, CodeObjectsLoadLaunchAndReplay) {
  {
    const v1::Signature signature = *ParseSignature("out,in,in,int32");
    Buffer a = Alloc(kN * 4), b = Alloc(kN * 4), out = Alloc(kN * 4);
    ASSERT_OK_AND_ASSIGN(Program add,
                         session_->Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({kAdd}), "add", signature, {}}));
    ASSERT_OK_AND_ASSIGN(v1::LaunchReply launched,
                         session_->Launch(add, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1},
                                          /*wait=*/true));
    EXPECT_GT(launched.device_seconds(), 0);
    auto rdna = session_->Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({kAdd}, kGfx1030), "add", signature, {}});
    EXPECT_EQ(rdna.status().code(), absl::StatusCode::kInvalidArgument) << rdna.status();
    EXPECT_THAT(std::string(rdna.status().message()), HasSubstr("hipErrorNoBinaryForGpu"));
    auto source = session_->Load(ProgramSpec{"hip-c", "__global__ void add() {}", "add", signature, {}});
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << source.status();
    EXPECT_THAT(std::string(source.status().message()), HasSubstr("program.hip:1:1"));

    ASSERT_TRUE(session_->BeginCapture({&a, &b}, {}).ok());
    ASSERT_TRUE(session_->Launch(add, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1}).ok());
    ASSERT_OK_AND_ASSIGN(Graph graph, session_->EndCapture({&out}));
    for (int i = 0; i < 2; ++i) {
      Buffer fa = Alloc(kN * 4), fb = Alloc(kN * 4), fout = Alloc(kN * 4);
      ASSERT_TRUE(session_->Replay(graph, {&fa, &fb, &fout}, /*wait=*/true).ok());
    }
  }
  ExpectTheDaemonLeftNothing();
}

// The runtime reads one argument per explicit parameter of the kernel's metadata, each
// one's bytes, whatever the signature says: a signature that differs from the metadata
// is refused at Load, as is a code object without metadata.
TEST_P(FakeHipDaemonTest, ASignatureThatDiffersFromTheKernelsMetadataIsRefused) {
  for (const replayd::testing::WrongAddSignature& wrong : replayd::testing::kWrongAddSignatures) {
    ASSERT_OK_AND_ASSIGN(v1::Signature signature, ParseSignature(wrong.signature));
    auto refused = session_->Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({kAdd}), "add", signature, {}});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
        << wrong.signature << ": " << refused.status();
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr(std::string("hip-hsaco kernel add ") + wrong.message))
        << wrong.signature;
  }
  const v1::Signature right = *ParseSignature("out,in,in,int32");
  auto bare = session_->Load(ProgramSpec{
      "hip-hsaco", AmdgpuCodeObject({kAdd}, replayd::testing::kGfx90a, replayd::testing::AmdgpuNotes{}), "add", right,
      {}});
  EXPECT_EQ(bare.status().code(), absl::StatusCode::kInvalidArgument) << bare.status();
  EXPECT_THAT(std::string(bare.status().message()), HasSubstr("no AMDGPU metadata note"));
  auto missing = session_->Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({kAdd}), "sub", right, {}});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("hip-hsaco program has no kernel named sub"));
  EXPECT_OK(session_->Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({kAdd}), "add", right, {}}).status());
  ExpectTheDaemonLeftNothing();
}

// A kernel runs at most as many work-items a block as its metadata's
// .max_flat_workgroup_size (its launch bounds): a launch that asks more, eager or
// captured, is INVALID_ARGUMENT naming the limit; so is a graph's node at instantiation
// or at a replay's update, whose block size is a variable; within them each runs.
TEST_P(FakeHipDaemonTest, ABlockPastTheKernelsLaunchBoundsIsRefused) {
  const AmdgpuKernelSpec bounded{"add", {8, 8, 8, 4}, 64};
  ASSERT_OK_AND_ASSIGN(Program p, session_->Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({bounded}), "add",
                                                             *ParseSignature("out,in,in,int32"), {}}));
  Buffer a = Alloc(kN * 4), b = Alloc(kN * 4), out = Alloc(kN * 4);
  auto refused =
      session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {2, 1, 1}, {128, 1, 1}, /*wait=*/true);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("kernel add runs at most 64 threads a block (its launch bounds); local 128x1x1 is 128"));
  EXPECT_OK(session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1}, /*wait=*/true)
                .status());
  ASSERT_OK(session_->BeginCapture({&a, &b}, {}));
  auto captured =
      session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {2, 1, 1}, {128, 1, 1}, /*wait=*/true);
  EXPECT_EQ(captured.status().code(), absl::StatusCode::kInvalidArgument) << captured.status();
  ASSERT_OK(session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1}).status());
  ASSERT_OK_AND_ASSIGN(Graph captured_graph, session_->EndCapture({&out}));
  EXPECT_OK(session_->Replay(captured_graph, {&a, &b, &out}, /*wait=*/true).status());

  ASSERT_OK_AND_ASSIGN(Graph graph, session_->DefineGraph(replayd::testing::OneAddCall(
                                         p.handle(), kN, replayd::testing::VariableDef("t", 32, 128, 32), kN / 32, "t")));
  replayd::testing::ExpectReplaysRefusedAbove(*session_, graph, a, b, out, {128, 64, 128, 32}, 64,
                                              "runs at most 64 threads a block");
}

// HIP launches fewer than 2^32 work-items a dimension (blocks times the block's): ROCm
// refuses more at a launch, but truncates them at a graph node's update, so replayd
// refuses them itself, eagerly and at a replay whose grid is a variable.
TEST_P(FakeHipDaemonTest, ALaunchOf2To32WorkItemsADimensionIsRefused) {
  ASSERT_OK_AND_ASSIGN(Program p, session_->Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({kAdd}), "add",
                                                             *ParseSignature("out,in,in,int32"), {}}));
  Buffer a = Alloc(kN * 4), b = Alloc(kN * 4), out = Alloc(kN * 4);
  constexpr uint64_t kBlocks = uint64_t{1} << 22;  // times 1024: 2^32
  auto refused = session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {kBlocks, 1, 1}, {1024, 1, 1},
                                  /*wait=*/true);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("is 2^32 work-items or more"));

  ASSERT_OK_AND_ASSIGN(Graph graph, session_->DefineGraph(replayd::testing::OneAddCall(
                                         p.handle(), kN, replayd::testing::VariableDef("g", 1, int64_t{1} << 30),
                                         "g", 1024)));
  replayd::testing::ExpectReplaysRefusedAbove(
      *session_, graph, a, b, out, {int64_t{kBlocks}, 4, int64_t{kBlocks}, int64_t{kBlocks - 1}}, kBlocks - 1,
      "2^32 work-items");
}

// ROCm's instantiated graph takes a new argument segment at each kernel node update and
// gives none back until it is destroyed: a graph whose kernel and copy move at every
// replay is instantiated afresh each time its updates pass the daemon's limit, the new
// instance given every node's current values (a kernel node left on the build's
// placeholder pointers would fault the fake; a copy left on old buffers would read the
// wrong bytes), so the argument segments held stay bounded where, without it, they pass
// the fake's limit (and ROCm's device memory) and replays fail.
TEST_P(FakeHipDaemonTest, AGraphUpdatedAtEveryReplayIsInstantiatedAfreshWithinItsKernargLimit) {
  using replayd::testing::copy_graphs::Floats;
  // The fake's segments: kAdd's 48 bytes (28 of arguments, 8-aligned, 16 hidden) aligned
  // to 128, and a memcpy node's blit kernel's 512.
  constexpr uint64_t kReplayKernargBytes = 128 + 512;
  constexpr int kReplays = 600;
  fake_.set_kernarg_limit(4 * kGraphKernargBytes);
  ASSERT_OK_AND_ASSIGN(Program p, session_->Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({kAdd}), "add",
                                                             *ParseSignature("out,in,in,int32"), {}}));
  // add(out, a, b) over a global of g blocks, and a copy of a into parameter c.
  v1::GraphDef def = replayd::testing::OneAddCall(p.handle(), kN, replayd::testing::VariableDef("g", 1, 4), "g", 64);
  v1::Slot* c_slot = def.add_slots();
  c_slot->set_kind(v1::Slot::PARAMETER);
  c_slot->set_bytes(kN * 4);
  v1::GraphCopy* copy = def.add_calls()->mutable_copy();
  copy->mutable_dst()->set_slot(3);
  copy->mutable_dst()->set_length(kN * 4);
  copy->mutable_src()->set_slot(0);
  copy->mutable_src()->set_length(kN * 4);
  auto free_memory = [&] {
    absl::StatusOr<std::vector<v1::Device>> devices = client_->ListDevices();
    EXPECT_TRUE(devices.ok()) << devices.status();
    for (const v1::Device& d : devices.ok() ? *devices : std::vector<v1::Device>())
      if (d.id() == "hip:0") return d.free_memory();
    return uint64_t{0};
  };
  const uint64_t free_at_start = free_memory();
  std::optional<Graph> defined;
  ASSERT_OK_AND_ASSIGN(defined, session_->DefineGraph(def));
  Graph& graph = *defined;
  Buffer a[2] = {Alloc(kN * 4), Alloc(kN * 4)}, b = Alloc(kN * 4), out = Alloc(kN * 4),
         c[2] = {Alloc(kN * 4), Alloc(kN * 4)};
  for (int i = 0; i < 2; ++i) ASSERT_OK(session_->WriteVector(a[i], Iota(kN, 1000.0f * i)));
  const uint64_t free_before = free_memory();
  for (int r = 0; r < kReplays; ++r) {
    const int i = r % 2;
    absl::StatusOr<ReplayResult> replayed =
        session_->Replay(graph, {&a[i], &b, &out, &c[i], int64_t{1 + r % 4}}, /*wait=*/true, {View{&c[i]}});
    ASSERT_TRUE(replayed.ok()) << "replay " << r << ": " << replayed.status();
    ASSERT_EQ(replayed->reads.size(), 1u);
    ASSERT_EQ(Floats(replayed->reads[0]), Iota(kN, 1000.0f * i)) << "replay " << r;
    // The runtime's kernarg pool of the graph, and what its updates may take, are counted
    // against the device's memory while the graph lives (in an executor, they are part of
    // the executor's own state).
    if (r == 0 && GetParam().graph == HipDeviceGraph::kGraph && GetParam().isolation == Isolation::kShared) {
      EXPECT_GE(free_at_start - free_before, (128u << 10) + 6 * kN * 4) << "the instance's pool, and the buffers";
      EXPECT_GE(free_before - free_memory(), kGraphKernargBytes) << "what its updates may take";
    }
  }
  if (GetParam().graph == HipDeviceGraph::kGraph && GetParam().isolation == Isolation::kShared) {
    EXPECT_EQ(fake_.count("graph_execs"), 1) << "each instance the graph replaces is destroyed";
    EXPECT_GE(fake_.count("instantiations"), int{kReplays * kReplayKernargBytes / kGraphKernargBytes})
        << "one instantiation each time the updates pass the limit";
    EXPECT_LE(fake_.count("kernarg_bytes"), int{kGraphKernargBytes + 2 * kReplayKernargBytes})
        << "the limit, the build's segments and one replay's";
  }
  EXPECT_EQ(fake_.count("faulted"), 0);
  defined.reset();
  for (Buffer* buffer : {&a[0], &a[1], &b, &out, &c[0], &c[1]}) *buffer = Buffer();
  ASSERT_OK(session_->Close());
  EXPECT_EQ(free_memory(), free_at_start) << "the graph's pool is given back with it";
}

INSTANTIATE_TEST_SUITE_P(Policies, FakeHipDaemonTest, kPolicies, PolicyName);

// In the daemon's process (isolation shared), a kernel fault loses hip:0's state for
// every session on it: the faulting session and the others answer FAILED_PRECONDITION, a
// new HIP session is UNAVAILABLE while they are open, and once the last closes the device
// is reset and serves again. The CPU device serves throughout.
class FakeHipFaultTest : public FakeHipDaemonTest {};

TEST_P(FakeHipFaultTest, AKernelFaultFailsTheDevicesSessionsUntilTheLastCloses) {
  auto other = client_->OpenSession("hip:0");
  ASSERT_TRUE(other.ok()) << other.status();
  {
    Buffer mine = Alloc(64);
    auto theirs = other->Alloc(64);
    ASSERT_TRUE(theirs.ok()) << theirs.status();
    ASSERT_OK_AND_ASSIGN(Program fault, session_->Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({kFault}), "fault",
                                                                   *ParseSignature("inout"), {}}));
    auto launched = session_->Launch(fault, {View{&mine}}, {1, 1, 1}, {1, 1, 1}, /*wait=*/true);
    EXPECT_FALSE(launched.ok());
    EXPECT_EQ(fake_.count("faulted"), 1);

    auto read = session_->ReadVector<float>(mine, 1);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
    EXPECT_THAT(std::string(read.status().message()), HasSubstr("kernel fault"));
    auto their_read = other->ReadVector<float>(*theirs, 1);
    EXPECT_EQ(their_read.status().code(), absl::StatusCode::kFailedPrecondition) << their_read.status();
    EXPECT_THAT(std::string(their_read.status().message()), HasSubstr("kernel fault"));
    auto refused = client_->OpenSession("hip:0");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();

    ASSERT_OK_AND_ASSIGN(Session cpu, client_->OpenSession("cpu:0"));
    ASSERT_OK_AND_ASSIGN(Buffer b, cpu.Alloc(64));
  }
  EXPECT_TRUE(session_->Close().ok());
  session_.reset();
  EXPECT_TRUE(other->Close().ok());
  EXPECT_EQ(fake_.count("resets"), 1) << "the last session out resets the device";
  ASSERT_OK_AND_ASSIGN(Session again, client_->OpenSession("hip:0"));
  ASSERT_OK_AND_ASSIGN(Buffer in, again.Alloc(kN * 4));
  ASSERT_OK_AND_ASSIGN(Buffer out, again.Alloc(kN * 4));
  ASSERT_TRUE(again.WriteVector(in, Iota(kN, 9)).ok());
  ASSERT_TRUE(again.Copy(View{&out}, View{&in}).ok());
  ASSERT_OK_AND_ASSIGN(std::vector<float> got, again.ReadVector<float>(out, kN));
  EXPECT_EQ(got, Iota(kN, 9));
}

INSTANTIATE_TEST_SUITE_P(Policies, FakeHipFaultTest,
                         ::testing::Values(Policy{HipDeviceGraph::kGraph, Isolation::kShared, "graph"},
                                           Policy{HipDeviceGraph::kStream, Isolation::kShared, "stream"}),
                         PolicyName);

// In executors (the default), a kernel fault ends only its tenant's executor: the fake in
// that process faults, while the daemon's process, the other tenant's executor and the
// tenant's next executor each have HIP state of their own.
class FakeHipExecutorTest : public FakeGpuExecutorFixture {
 protected:
  void SetUp() override {
    absl::StatusOr<FakeHip> fake = FindFake();
    if (!fake.ok()) GTEST_SKIP() << fake.status().message();
    fake_ = *fake;
    fake_.reset();
    StartDaemon("hip:0", [](DaemonOptions& d) {
      d.devices = {"cpu", "hip"};
      d.hip_executor_bytes = kExecutorBytes;
    });
  }

  FakeHip fake_;
};

// A tenant's executor holds HIP runtime state of its own, which the device's memory
// counts while it runs (--hip_executor_bytes): past what the device has, a tenant's first
// session is refused, and an executor that ends gives its share back.
TEST_F(FakeHipExecutorTest, AnExecutorsOwnStateIsCountedAgainstTheDevice) { CheckAnExecutorsOwnStateIsCounted(); }

TEST_F(FakeHipExecutorTest, AnIdleExecutorGivesWayToAnotherTenantsExecutor) {
  CheckAnIdleExecutorGivesWayToAnotherTenantsExecutor();
}

// An executor without the fake (here: the daemon started without it on its
// LD_LIBRARY_PATH, which its HIP executors inherit, so they load Debian's runtime, whose
// hipInit finds no GPU, or no runtime at all) says why: the session that started it is
// UNAVAILABLE naming the device and the cause, and the daemon serves on.
TEST_F(FakeHipExecutorTest, AnExecutorWithoutTheRuntimeSaysWhy) {
  const std::string path = std::getenv("LD_LIBRARY_PATH") ? std::getenv("LD_LIBRARY_PATH") : "";
  setenv("LD_LIBRARY_PATH", (cache_.path() / "nothing-here").c_str(), 1);
  SetUp();  // a daemon started now, its executors' environment without the fake
  setenv("LD_LIBRARY_PATH", path.c_str(), 1);
  if (HasFatalFailure() || IsSkipped()) return;
  Client research = As("research-token");
  absl::StatusOr<Session> refused = research.OpenSession("hip:0");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              AllOf(HasSubstr("executor: hip:0 not found: "), AnyOf(HasSubstr("hipInit"), HasSubstr("libamdhip64"))));
  ASSERT_OK_AND_ASSIGN(Session cpu, research.OpenSession("cpu:0"));
  ASSERT_OK_AND_ASSIGN(Buffer b, cpu.Alloc(64));
}

// ROCr sets a process's XNACK mode from HSA_XNACK, and the mode is part of the device's
// target: a daemon started with HSA_XNACK=1 serves gfx90a:...:xnack+, and its executors
// must see the same variable, or they would refuse every code object built for xnack+
// (hiprtc builds for the daemon's target) with hipErrorNoBinaryForGpu.
TEST_F(FakeHipExecutorTest, AnExecutorRunsInTheDaemonsXnackMode) {
  setenv("HSA_XNACK", "1", 1);
  SetUp();  // a daemon started now, its executors started from its environment
  if (HasFatalFailure() || IsSkipped()) return unsetenv("HSA_XNACK"), void();
  Client research = As("research-token");
  absl::StatusOr<Session> session = research.OpenSession("hip:0");
  unsetenv("HSA_XNACK");
  ASSERT_TRUE(session.ok()) << session.status();
  const AmdgpuKernelSpec k{"k", {8}};
  absl::StatusOr<Program> on = session->Load(ProgramSpec{
      "hip-hsaco",
      AmdgpuCodeObject({k}, replayd::testing::kGfx90a, std::nullopt,
                       replayd::testing::kXnackOn | replayd::testing::kSrameccAny),
      "k", *ParseSignature("inout"), {}});
  EXPECT_TRUE(on.ok()) << "an xnack+ code object in the executor of an xnack+ daemon: " << on.status();
  absl::StatusOr<Program> off = session->Load(ProgramSpec{
      "hip-hsaco",
      AmdgpuCodeObject({k}, replayd::testing::kGfx90a, std::nullopt,
                       replayd::testing::kXnackOff | replayd::testing::kSrameccAny),
      "k", *ParseSignature("inout"), {}});
  EXPECT_EQ(off.status().code(), absl::StatusCode::kInvalidArgument) << off.status();
  EXPECT_THAT(std::string(off.status().message()), HasSubstr("hipErrorNoBinaryForGpu"));
}

TEST_F(FakeHipExecutorTest, AKernelFaultEndsOnlyItsTenantsExecutor) {
  Client research = As("research-token"), prod = As("prod-token");
  ASSERT_OK_AND_ASSIGN(Session mine, research.OpenSession("hip:0"));
  ASSERT_OK_AND_ASSIGN(Session mine_too, research.OpenSession("hip:0"));
  ASSERT_OK_AND_ASSIGN(Session theirs, prod.OpenSession("hip:0"));
  ExpectCopiesRight(theirs, 1);
  ExpectCopiesRight(mine_too, 2);
  ASSERT_OK_AND_ASSIGN(Buffer held, mine.Alloc(1 << 20));
  ASSERT_OK_AND_ASSIGN(Buffer also, mine_too.Alloc(64));
  ASSERT_OK_AND_ASSIGN(Program fault, mine.Load(ProgramSpec{"hip-hsaco", AmdgpuCodeObject({kFault}), "fault",
                                                            *ParseSignature("inout"), {}}));
  absl::StatusOr<v1::LaunchReply> launched = mine.Launch(fault, {View{&held}}, {1, 1, 1}, {1, 1, 1}, /*wait=*/true);
  ASSERT_EQ(launched.status().code(), absl::StatusCode::kFailedPrecondition) << launched.status();
  EXPECT_THAT(std::string(launched.status().message()),
              AllOf(HasSubstr("executor of tenant research on hip:0 lost its device while running program"),
                    HasSubstr("entry 'fault'"), HasSubstr("kernel fault")));
  // The tenant's other session shared the executor, and says so.
  absl::StatusOr<std::vector<float>> read = mine_too.ReadVector<float>(also, 1);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();

  // The other tenant never noticed; the daemon's own HIP state was never touched.
  ExpectCopiesRight(theirs, 3);
  EXPECT_EQ(fake_.count("faulted"), 0);
  EXPECT_EQ(fake_.count("streams"), 0);

  // The tenant's next session runs in a fresh executor.
  EXPECT_TRUE(mine.Close().ok());
  EXPECT_TRUE(mine_too.Close().ok());
  ASSERT_OK_AND_ASSIGN(Session again, research.OpenSession("hip:0"));
  ExpectCopiesRight(again, 4);
}

}  // namespace
}  // namespace replayd::client

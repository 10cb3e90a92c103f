// The CUDA driver against a fake libcuda.so.1 (tests/support/fake_cuda), loaded as the
// daemon loads NVIDIA's: the CudaDriver and a daemon on loopback run for real over a
// library as strict as the driver was on an H200 where replayd depends on it, so the
// mistakes that only a GPU showed (a memcpy node on address 0, a context pushed and never
// popped, a kernel fault that poisons every CUDA context of the process) fail here.
//
// ctest runs it with LD_LIBRARY_PATH set to the fake's folder. By hand, from the build
// folder:
//   LD_LIBRARY_PATH=$PWD/tests/support/fake_cuda tests/fake_cuda_test
// Without the fake on the loader's path (NVIDIA's driver or none), every case skips.
//
// A kernel fault is recorded for the whole process (CudaLibrary::RecordStickyFault), and
// no reset of the fake undoes that: only the FakeCudaFaultTest cases fault, they come
// last in a run, and only the first of them in a process runs. ctest runs each case in a
// process of its own.
#include <dlfcn.h>
#include <gmock/gmock.h>

#include <cstring>
#include <fstream>

#include "drivers/cuda/cuda_driver.h"
#include "drivers/cuda/cuda_library.h"
#include "drivers/cuda/nvrtc.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/support/fake_gpu_executors.h"
#include "tests/support/fake_cuda/fake_cuda.h"
#include "tests/support/add_kernel.h"
#include "tests/support/copy_graphs.h"
#include "tests/support/graph_def.h"
#include "tests/support/pinned_transfers.h"
#include "tests/support/status_macros.h"
#include "tests/support/tenants_file.h"

namespace replayd::client {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// The fake's test hooks, found in the libcuda.so.1 that the driver loaded.
struct FakeCuda {
  decltype(&fake_cuda_reset) reset = nullptr;
  decltype(&fake_cuda_context_stack_depth) stack_depth = nullptr;
  decltype(&fake_cuda_count) count = nullptr;
  decltype(&fake_cuda_set_max_pitch) set_max_pitch = nullptr;
  decltype(&fake_cuda_set_driver_version) set_driver_version = nullptr;
  decltype(&fake_cuda_set_fault_error) set_fault_error = nullptr;
  decltype(&fake_cuda_set_compute_mode) set_compute_mode = nullptr;
  decltype(&cuGetProcAddress_v2) get_proc_address = nullptr;
};

// The hooks; UNAVAILABLE saying why when the library the driver loads is not the fake.
absl::StatusOr<FakeCuda> FindFake() {
  constexpr char kHow[] = "run with LD_LIBRARY_PATH=<build>/tests/support/fake_cuda (ctest does)";
  absl::StatusOr<std::unique_ptr<CudaLibrary>> loaded = CudaLibrary::Load();
  if (!loaded.ok()) return absl::UnavailableError(absl::StrCat(loaded.status().message(), "; ", kHow));
  // The library Load opened stays loaded for the life of the process, as does this handle.
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  FakeCuda fake;
  if (handle) {
    fake.reset = reinterpret_cast<decltype(fake.reset)>(dlsym(handle, "fake_cuda_reset"));
    fake.stack_depth = reinterpret_cast<decltype(fake.stack_depth)>(dlsym(handle, "fake_cuda_context_stack_depth"));
    fake.count = reinterpret_cast<decltype(fake.count)>(dlsym(handle, "fake_cuda_count"));
    fake.set_max_pitch = reinterpret_cast<decltype(fake.set_max_pitch)>(dlsym(handle, "fake_cuda_set_max_pitch"));
    fake.set_driver_version =
        reinterpret_cast<decltype(fake.set_driver_version)>(dlsym(handle, "fake_cuda_set_driver_version"));
    fake.set_fault_error = reinterpret_cast<decltype(fake.set_fault_error)>(dlsym(handle, "fake_cuda_set_fault_error"));
    fake.set_compute_mode =
        reinterpret_cast<decltype(fake.set_compute_mode)>(dlsym(handle, "fake_cuda_set_compute_mode"));
    fake.get_proc_address = reinterpret_cast<decltype(fake.get_proc_address)>(dlsym(handle, "cuGetProcAddress_v2"));
  }
  if (!fake.reset || !fake.stack_depth || !fake.count || !fake.set_max_pitch || !fake.set_driver_version ||
      !fake.set_fault_error || !fake.set_compute_mode || !fake.get_proc_address)
    return absl::UnavailableError(absl::StrCat("the libcuda.so.1 loaded is NVIDIA's driver, not the fake; ", kHow));
  return fake;
}

constexpr int64_t kN = 256;  // floats per buffer

using replayd::testing::copy_graphs::Iota;

std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A 1D device-to-device copy as the driver describes a copy node.
CUDA_MEMCPY3D Copy3D(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  CUDA_MEMCPY3D p;
  std::memset(&p, 0, sizeof p);
  p.srcMemoryType = p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = src;
  p.dstDevice = dst;
  p.srcPitch = p.dstPitch = p.WidthInBytes = bytes;
  p.srcHeight = p.dstHeight = p.Height = p.Depth = 1;
  return p;
}

// The kinds of object the fake counts, each of which its owner must release.
constexpr const char* kObjects[] = {"contexts", "allocations", "host_allocations", "registered", "streams",
                                    "events",   "modules",     "graphs",           "graph_execs"};

class FakeCudaDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<FakeCuda> fake = FindFake();
    if (!fake.ok()) GTEST_SKIP() << fake.status().message();
    fake_ = *fake;
    fake_.reset();
  }

  // The one device the fake serves, through a CudaDriver with `policy`.
  std::unique_ptr<Device> Discover(CudaContextPolicy policy) {
    CudaDriverOptions options;
    options.context = policy;
    CudaDriver driver(options);
    std::vector<std::unique_ptr<Device>> devices = driver.Discover();
    EXPECT_EQ(devices.size(), 1u) << driver.unavailable();
    return devices.empty() ? nullptr : std::move(devices[0]);
  }

  void ExpectNothingLeft() {
    for (const char* what : kObjects) EXPECT_EQ(fake_.count(what), 0) << what;
    EXPECT_EQ(fake_.count("reclaimed"), 0) << "objects freed only because their context ended";
  }

  FakeCuda fake_;
};

TEST_F(FakeCudaDriverTest, DiscoveryFindsTheFakeDeviceWithItsNameMemoryAndLimits) {
  CudaDriver driver({});
  std::vector<std::unique_ptr<Device>> devices = driver.Discover();
  ASSERT_EQ(devices.size(), 1u) << driver.unavailable();
  const DeviceInfo& info = devices[0]->info();
  EXPECT_EQ(info.id, "cuda:0");
  EXPECT_EQ(info.kind, DeviceKind::kCuda);
  EXPECT_EQ(info.name, "Fake H200");
  EXPECT_EQ(info.total_memory, uint64_t{1} << 30);
  EXPECT_EQ(info.architecture, "sm_90");
  EXPECT_EQ(info.driver_version, absl::StrCat("CUDA ", CUDA_VERSION / 1000, ".", CUDA_VERSION % 1000 / 10, " driver"));
  EXPECT_THAT(info.limits.max_global, ElementsAre(2147483647u, 65535u, 65535u));
  EXPECT_EQ(info.limits.max_global_total, uint64_t{2147483647} * 65535 * 65535);
  EXPECT_THAT(info.limits.max_local, ElementsAre(1024u, 1024u, 64u));
  EXPECT_EQ(info.limits.max_local_total, 1024u);
  EXPECT_THAT(info.formats, Contains("cuda-ptx"));
  EXPECT_THAT(info.formats, Contains("cuda-cubin"));
  if (Nvrtc::Load().ok()) {
    EXPECT_THAT(info.formats, Contains("cuda-c"));
    EXPECT_EQ(driver.cuda_c_unavailable(), "");
  } else {
    EXPECT_THAT(info.formats, Not(Contains("cuda-c")));
  }
}

// cuCtxCreate pushes the context it creates on the calling thread's stack; every use then
// binds with cuCtxSetCurrent, which replaces the top (or pushes onto an empty stack). So
// the first context a thread uses leaves it one deep, and no later one may deepen it: a
// push without its pop would leave one more context on the thread per session.
TEST_F(FakeCudaDriverTest, OpeningAndClosingContextsLeavesTheThreadsContextStackAsItWas) {
  for (CudaContextPolicy policy : {CudaContextPolicy::kSession, CudaContextPolicy::kPrimary}) {
    SCOPED_TRACE(policy == CudaContextPolicy::kSession ? "session contexts" : "the primary context");
    fake_.reset();
    std::unique_ptr<Device> device = Discover(policy);
    ASSERT_NE(device, nullptr);
    ASSERT_EQ(fake_.stack_depth(), 0);
    {
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> first, device->OpenContext({"test"}));
      EXPECT_EQ(fake_.stack_depth(), 1);
    }
    const int depth = fake_.stack_depth();
    EXPECT_LE(depth, 1);
    for (int i = 0; i < 3; ++i) {
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device->OpenContext({"test"}));
      ASSERT_OK_AND_ASSIGN(Allocation a, c->Allocate(64));
      c->Free(a);
    }
    EXPECT_EQ(fake_.stack_depth(), depth) << "after opening and closing three contexts one by one";
    std::vector<std::unique_ptr<Context>> open;
    for (int i = 0; i < 3; ++i) {
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device->OpenContext({"test"}));
      open.push_back(std::move(c));
      EXPECT_EQ(fake_.stack_depth(), 1) << "with " << open.size() << " contexts open";
    }
    open.clear();
    EXPECT_EQ(fake_.stack_depth(), depth) << "after closing three contexts open together";
    device.reset();
    ExpectNothingLeft();
  }
}

// Memory starts zeroed (the fake's holds garbage until the driver clears it); writes,
// reads and copies go through the staging buffers; a device graph of copy nodes is
// retargeted by Update and launched.
TEST_F(FakeCudaDriverTest, TransfersCopiesAndCopyNodesMoveTheRightBytes) {
  std::unique_ptr<Device> device = Discover(CudaContextPolicy::kSession);
  ASSERT_NE(device, nullptr);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device->OpenContext({"test"}));
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

    // a -> b -> d, ordered by an edge.
    std::vector<GraphNode> nodes(2);
    nodes[0].args = {ArgValue{.address = b.address}, ArgValue{.address = a.address}};
    nodes[1].args = {ArgValue{.address = d.address}, ArgValue{.address = b.address}};
    nodes[0].copy_bytes = nodes[1].copy_bytes = kBytes;
    const std::pair<size_t, size_t> edges[] = {{0, 1}};
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceGraph> graph, c->Instantiate(nodes, edges));
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

// Memory a context pins (an executor's channel data area) is registered with the driver
// while the context lives; a transfer from or into it is one copy straight to the device,
// and one from elsewhere still goes through the staging buffers.
TEST_F(FakeCudaDriverTest, PinnedHostMemoryIsCopiedStraightAndUnregisteredWithItsContext) {
  for (CudaContextPolicy policy : {CudaContextPolicy::kSession, CudaContextPolicy::kPrimary}) {
    SCOPED_TRACE(policy == CudaContextPolicy::kSession ? "session contexts" : "the primary context");
    fake_.reset();
    std::unique_ptr<Device> device = Discover(policy);
    ASSERT_NE(device, nullptr);
    {
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> c, device->OpenContext({"test"}));
      testing::CheckPinnedTransfers(*c, fake_.count);
    }
    EXPECT_EQ(fake_.count("registered"), 0) << "unregistered when the context closed";
    device.reset();
    ExpectNothingLeft();
  }
}

// The fake itself, through the entry points the driver resolves: cuCtxCreate pushes, and
// a memcpy node must lie in live allocations of its context, at creation and when
// retargeted, as the driver demands.
// The fake reads a kernel's parameters from its PTX as the driver lays them out
// (cuFuncGetParamInfo), and a launch without the arguments they need is refused.
TEST_F(FakeCudaDriverTest, AKernelsParametersAreReadFromItsImage) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaLibrary> cu, CudaLibrary::Load());
  CUcontext ctx = nullptr;
  ASSERT_EQ(cu->cuCtxCreate(&ctx, nullptr, 0, 0), CUDA_SUCCESS);
  const std::string ptx =
      ".version 8.0\n.target sm_90\n.address_size 64\n"
      ".visible .entry k(\n\t.param .u64 .ptr .global .align 1 k_param_0,\n\t.param .u32 k_param_1,\n"
      "\t.param .align 16 .b8 k_param_2[24],\n\t.param .u16 k_param_3\n)\n.maxntid 64, 2, 1\n{\n\tret;\n}\n";
  CUmodule module = nullptr;
  ASSERT_EQ(cu->cuModuleLoadDataEx(&module, ptx.c_str(), 0, nullptr, nullptr), CUDA_SUCCESS);
  CUfunction f = nullptr;
  ASSERT_EQ(cu->cuModuleGetFunction(&f, module, "k"), CUDA_SUCCESS);
  const std::pair<size_t, size_t> expected[] = {{0, 8}, {8, 4}, {16, 24}, {40, 2}};
  for (size_t i = 0; i < 4; ++i) {
    size_t offset = 99, size = 99;
    EXPECT_EQ(cu->cuFuncGetParamInfo(f, i, &offset, &size), CUDA_SUCCESS) << i;
    EXPECT_EQ(std::make_pair(offset, size), expected[i]) << i;
  }
  size_t offset = 0, size = 0;
  EXPECT_EQ(cu->cuFuncGetParamInfo(f, 4, &offset, &size), CUDA_ERROR_INVALID_VALUE) << "past the last";
  int max_threads = 0;
  EXPECT_EQ(cu->cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f), CUDA_SUCCESS);
  EXPECT_EQ(max_threads, 128) << "its .maxntid";
  EXPECT_EQ(cu->cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE)
      << "no arguments for a kernel that takes four";
  uint64_t address = 0;
  uint32_t n = 0;
  uint8_t blob[24] = {};
  uint16_t h = 0;
  void* args[] = {&address, &n, blob, &h};
  EXPECT_EQ(cu->cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), CUDA_ERROR_INVALID_VALUE)
      << "past its launch bounds";
  EXPECT_EQ(cu->cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cu->cuStreamSynchronize(nullptr), CUDA_SUCCESS) << "the kernel runs before its module goes";
  EXPECT_EQ(cu->cuModuleUnload(module), CUDA_SUCCESS);
  EXPECT_EQ(cu->cuCtxDestroy(ctx), CUDA_SUCCESS);
}

TEST_F(FakeCudaDriverTest, TheFakeRefusesAMemcpyNodeOffItsContextsAllocations) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaLibrary> cu, CudaLibrary::Load());
  void* fn = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(fake_.get_proc_address("cuNoSuchEntry", &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found),
            CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(found, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

  CUcontext ctx = nullptr, other = nullptr, popped = nullptr;
  ASSERT_EQ(cu->cuCtxCreate(&ctx, nullptr, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(fake_.stack_depth(), 1) << "cuCtxCreate pushes";
  ASSERT_EQ(cu->cuCtxCreate(&other, nullptr, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(fake_.stack_depth(), 2);
  CUdeviceptr theirs = 0, a = 0, b = 0;
  ASSERT_EQ(cu->cuMemAlloc(&theirs, 256), CUDA_SUCCESS);  // in `other`, current
  ASSERT_EQ(cu->cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, other);
  ASSERT_EQ(cu->cuMemAlloc(&a, 256), CUDA_SUCCESS);
  ASSERT_EQ(cu->cuMemAlloc(&b, 256), CUDA_SUCCESS);
  const std::vector<uint8_t> pattern = Bytes(Iota(64, 7));
  ASSERT_EQ(cu->cuMemcpyHtoDAsync(a, pattern.data(), 256, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cu->cuMemcpyHtoDAsync(a + 8, pattern.data(), 256, nullptr), CUDA_ERROR_INVALID_VALUE)
      << "past the end of its allocation";

  CUgraph graph = nullptr;
  ASSERT_EQ(cu->cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  CUgraphNode node = nullptr;
  struct Refused {
    const char* what;
    CUDA_MEMCPY3D copy;
  };
  const Refused refused[] = {{"destination 0", Copy3D(0, a, 256)},
                             {"source 0", Copy3D(b, 0, 256)},
                             {"past the source", Copy3D(b, a, 257)},
                             {"past the destination", Copy3D(b + 8, a, 256)},
                             {"another context's memory", Copy3D(theirs, a, 256)}};
  for (const Refused& r : refused)
    EXPECT_EQ(cu->cuGraphAddMemcpyNode(&node, graph, nullptr, 0, &r.copy, ctx), CUDA_ERROR_INVALID_VALUE) << r.what;
  const CUDA_MEMCPY3D good = Copy3D(b, a, 256);
  ASSERT_EQ(cu->cuGraphAddMemcpyNode(&node, graph, nullptr, 0, &good, ctx), CUDA_SUCCESS);
  const CUgraphNode twice[] = {node, node};
  CUgraphNode after = nullptr;
  EXPECT_EQ(cu->cuGraphAddMemcpyNode(&after, graph, twice, 2, &good, ctx), CUDA_ERROR_INVALID_VALUE)
      << "a dependency named twice";
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cu->cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  const CUDA_MEMCPY3D to_zero = Copy3D(0, a, 256);
  EXPECT_EQ(cu->cuGraphExecMemcpyNodeSetParams(exec, node, &to_zero, ctx), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu->cuGraphLaunch(exec, nullptr), CUDA_SUCCESS);
  std::vector<uint8_t> got(256);
  ASSERT_EQ(cu->cuMemcpyDtoHAsync(got.data(), b, 256, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(got, pattern);

  EXPECT_EQ(cu->cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cu->cuGraphDestroy(graph), CUDA_SUCCESS);
  for (CUdeviceptr p : {theirs, a, b}) EXPECT_EQ(cu->cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cu->cuCtxDestroy(ctx), CUDA_SUCCESS);
  EXPECT_EQ(fake_.stack_depth(), 0) << "cuCtxDestroy pops the current context";
  EXPECT_EQ(cu->cuCtxDestroy(other), CUDA_SUCCESS);
  ExpectNothingLeft();
}

// A memcpy node's pitches must cover its width and stay within the device's maximum
// (cuMemcpy3D's documentation); a 2D node copies its rows.
TEST_F(FakeCudaDriverTest, TheFakeChecksAMemcpyNodesPitchAndCopiesItsRows) {
  fake_.set_max_pitch(128);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaLibrary> cu, CudaLibrary::Load());
  CUcontext ctx = nullptr;
  ASSERT_EQ(cu->cuCtxCreate(&ctx, nullptr, 0, 0), CUDA_SUCCESS);
  int max_pitch = 0;
  EXPECT_EQ(cu->cuDeviceGetAttribute(&max_pitch, CU_DEVICE_ATTRIBUTE_MAX_PITCH, 0), CUDA_SUCCESS);
  EXPECT_EQ(max_pitch, 128);
  CUdeviceptr a = 0, b = 0;
  ASSERT_EQ(cu->cuMemAlloc(&a, 256), CUDA_SUCCESS);
  ASSERT_EQ(cu->cuMemAlloc(&b, 256), CUDA_SUCCESS);
  const std::vector<uint8_t> pattern = Bytes(Iota(64, 7));
  ASSERT_EQ(cu->cuMemcpyHtoDAsync(a, pattern.data(), 256, nullptr), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  ASSERT_EQ(cu->cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  CUgraphNode node = nullptr;
  const CUDA_MEMCPY3D one_row = Copy3D(b, a, 256);
  EXPECT_EQ(cu->cuGraphAddMemcpyNode(&node, graph, nullptr, 0, &one_row, ctx), CUDA_ERROR_INVALID_VALUE)
      << "a pitch of 256 on a device whose maximum is 128";
  CUDA_MEMCPY3D narrow = Copy3D(b, a, 128);
  narrow.srcPitch = 64;
  EXPECT_EQ(cu->cuGraphAddMemcpyNode(&node, graph, nullptr, 0, &narrow, ctx), CUDA_ERROR_INVALID_VALUE)
      << "a pitch short of the width";
  CUDA_MEMCPY3D rows = Copy3D(b, a, 128);
  rows.Height = rows.srcHeight = rows.dstHeight = 3;
  EXPECT_EQ(cu->cuGraphAddMemcpyNode(&node, graph, nullptr, 0, &rows, ctx), CUDA_ERROR_INVALID_VALUE)
      << "three rows of 128 bytes reach past 256";
  rows.Height = rows.srcHeight = rows.dstHeight = 2;
  ASSERT_EQ(cu->cuGraphAddMemcpyNode(&node, graph, nullptr, 0, &rows, ctx), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cu->cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  EXPECT_EQ(cu->cuGraphExecMemcpyNodeSetParams(exec, node, &one_row, ctx), CUDA_ERROR_INVALID_VALUE)
      << "a node instantiated 2-dimensional cannot be retargeted";
  ASSERT_EQ(cu->cuGraphLaunch(exec, nullptr), CUDA_SUCCESS);
  std::vector<uint8_t> got(256);
  ASSERT_EQ(cu->cuMemcpyDtoHAsync(got.data(), b, 256, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(got, pattern) << "both rows";

  EXPECT_EQ(cu->cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cu->cuGraphDestroy(graph), CUDA_SUCCESS);
  for (CUdeviceptr p : {a, b}) EXPECT_EQ(cu->cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cu->cuCtxDestroy(ctx), CUDA_SUCCESS);
  ExpectNothingLeft();
}

// cuGraphExecMemcpyNodeSetParams as its documentation says: new 1-dimensional operands
// of another size are taken, but not once the operands the node was instantiated with
// have been freed ("the memory operands' mappings changed").
TEST_F(FakeCudaDriverTest, TheFakeRetargetsAMemcpyNodeOnlyWhileItsFirstOperandsLive) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaLibrary> cu, CudaLibrary::Load());
  CUcontext ctx = nullptr;
  ASSERT_EQ(cu->cuCtxCreate(&ctx, nullptr, 0, 0), CUDA_SUCCESS);
  CUdeviceptr a = 0, b = 0, c = 0, d = 0;
  for (CUdeviceptr* p : {&a, &b, &c, &d}) ASSERT_EQ(cu->cuMemAlloc(p, 256), CUDA_SUCCESS);
  const std::vector<uint8_t> pattern = Bytes(Iota(64, 3));
  ASSERT_EQ(cu->cuMemcpyHtoDAsync(c, pattern.data(), 256, nullptr), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  ASSERT_EQ(cu->cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  CUgraphNode node = nullptr;
  const CUDA_MEMCPY3D first = Copy3D(b, a, 256);
  ASSERT_EQ(cu->cuGraphAddMemcpyNode(&node, graph, nullptr, 0, &first, ctx), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cu->cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  const CUDA_MEMCPY3D smaller = Copy3D(d, c, 128);
  ASSERT_EQ(cu->cuGraphExecMemcpyNodeSetParams(exec, node, &smaller, ctx), CUDA_SUCCESS) << "another size";
  ASSERT_EQ(cu->cuGraphLaunch(exec, nullptr), CUDA_SUCCESS);
  std::vector<uint8_t> got(256);
  ASSERT_EQ(cu->cuMemcpyDtoHAsync(got.data(), d, 256, nullptr), CUDA_SUCCESS);
  EXPECT_TRUE(std::equal(pattern.begin(), pattern.begin() + 128, got.begin())) << "its 128 bytes";
  EXPECT_EQ(cu->cuMemFree(a), CUDA_SUCCESS);
  const CUDA_MEMCPY3D whole = Copy3D(d, c, 256);
  EXPECT_EQ(cu->cuGraphExecMemcpyNodeSetParams(exec, node, &whole, ctx), CUDA_ERROR_INVALID_VALUE)
      << "the node's source at its instantiation is gone";

  EXPECT_EQ(cu->cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cu->cuGraphDestroy(graph), CUDA_SUCCESS);
  for (CUdeviceptr p : {b, c, d}) EXPECT_EQ(cu->cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cu->cuCtxDestroy(ctx), CUDA_SUCCESS);
  ExpectNothingLeft();
}

// A driver older than the toolkit replayd is built with refuses entry points asked for
// at the toolkit's version (CUDA_ERROR_INVALID_VALUE, as cuGetProcAddress documents): they
// are asked for at the driver's, down to 12.5; an older driver is refused with its
// version.
TEST_F(FakeCudaDriverTest, ADriverOlderThanTheToolkitServesAtItsOwnVersion) {
  fake_.set_driver_version(12060);
  void* fn = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(fake_.get_proc_address("cuInit", &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaLibrary> cu, CudaLibrary::Load());
  EXPECT_EQ(cu->version(), 12060);
  std::unique_ptr<Device> device = Discover(CudaContextPolicy::kSession);
  ASSERT_NE(device, nullptr);
  EXPECT_EQ(device->info().driver_version, "CUDA 12.6 driver");

  fake_.set_driver_version(12040);
  absl::StatusOr<std::unique_ptr<CudaLibrary>> old = CudaLibrary::Load();
  EXPECT_EQ(old.status().code(), absl::StatusCode::kUnavailable) << old.status();
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("supports CUDA 12.4; replayd needs 12.5 or newer"));
  fake_.reset();  // the next case in this process finds the fake by loading it at the toolkit's version
}

// A device in prohibited compute mode (nvidia-smi --compute-mode), on which no process may
// make a context, is not served, and discovery says why.
TEST_F(FakeCudaDriverTest, ADeviceInProhibitedComputeModeIsNotServedAndSaysWhy) {
  fake_.set_compute_mode(CU_COMPUTEMODE_PROHIBITED, 0);
  CudaDriver driver({});
  EXPECT_TRUE(driver.Discover().empty());
  EXPECT_THAT(driver.unavailable(), HasSubstr("cuda:0: its compute mode is prohibited: no process may use it"));
}

// In exclusive-process compute mode one process at a time may hold contexts on the device
// (without MPS): while another holds it, a session's context, of either policy, is
// UNAVAILABLE with the driver's words and the reason, and once it lets go the next opens.
TEST_F(FakeCudaDriverTest, AContextRefusedInExclusiveProcessModeSaysWhy) {
  for (CudaContextPolicy policy : {CudaContextPolicy::kSession, CudaContextPolicy::kPrimary}) {
    SCOPED_TRACE(policy == CudaContextPolicy::kSession ? "session contexts" : "the primary context");
    fake_.reset();
    fake_.set_compute_mode(CU_COMPUTEMODE_EXCLUSIVE_PROCESS, 1);
    std::unique_ptr<Device> device = Discover(policy);
    ASSERT_NE(device, nullptr) << "served: another process may let go";
    absl::StatusOr<std::unique_ptr<Context>> refused = device->OpenContext({"test"});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()),
                AllOf(HasSubstr("CUDA_ERROR_DEVICE_UNAVAILABLE"),
                      HasSubstr("its compute mode is exclusive-process: one process at a time may use it")));
    fake_.set_compute_mode(CU_COMPUTEMODE_EXCLUSIVE_PROCESS, 0);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context, device->OpenContext({"test"}));
    ASSERT_OK_AND_ASSIGN(Allocation a, context->Allocate(256));
    context->Free(a);
    context.reset();
    device.reset();
    ExpectNothingLeft();
  }
}

// Where the daemon runs a tenant's CUDA work, named for test names: in the daemon's
// process with either CUDA context policy, or in an executor process of the tenant's own
// (whose fake libcuda is its own: this process's fake then sees none of its objects).
struct Policy {
  CudaContextPolicy context;
  Isolation isolation;
  const char* name;
  CUresult fault_error = CUDA_ERROR_ILLEGAL_ADDRESS;  // what the fake's sticky fault answers
};
void PrintTo(const Policy& p, std::ostream* os) { *os << p.name; }
const auto kInDaemon = ::testing::Values(Policy{CudaContextPolicy::kSession, Isolation::kShared, "session"},
                                         Policy{CudaContextPolicy::kPrimary, Isolation::kShared, "primary"});
const auto kPolicies = ::testing::Values(Policy{CudaContextPolicy::kSession, Isolation::kShared, "session"},
                                         Policy{CudaContextPolicy::kPrimary, Isolation::kShared, "primary"},
                                         Policy{CudaContextPolicy::kSession, Isolation::kProcess, "executor"});
std::string PolicyName(const ::testing::TestParamInfo<Policy>& info) { return info.param.name; }

// A daemon on loopback serving cpu:0 and the fake's cuda:0, its CUDA work where the
// parameter says.
class FakeCudaDaemonTest : public DaemonFixture, public ::testing::WithParamInterface<Policy> {
 protected:
  void SetUp() override {
    absl::StatusOr<FakeCuda> fake = FindFake();
    if (!fake.ok()) GTEST_SKIP() << fake.status().message();
    fake_ = *fake;
    if (absl::Status s = CudaLibrary::sticky_fault(); !s.ok())
      GTEST_SKIP() << "an earlier case of this process faulted, which ends CUDA service for the process: " << s;
    fake_.reset();
    fake_.set_fault_error(GetParam().fault_error);
    BeforeStart();
    Options options;
    options.adjust = [this](DaemonOptions& d) {
      d.devices = {"cpu", "cuda"};
      d.cuda.context = GetParam().context;
      d.tenant_defaults.isolation = GetParam().isolation;
    };
    Start(options);
    if (HasFatalFailure()) return;
    auto session = client_->OpenSession("cuda:0");
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = std::make_unique<Session>(std::move(*session));
    if (GetParam().isolation == Isolation::kProcess) {
      EXPECT_EQ(fake_.count("contexts"), 0) << "the session's CUDA context is its executor's, not the daemon's";
    }
  }

  // What a derived fixture sets in the fake before the daemon discovers its device.
  virtual void BeforeStart() {}

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
    EXPECT_EQ(fake_.count("reclaimed"), 0) << "objects freed only because their context ended";
  }

  FakeCuda fake_;
  std::unique_ptr<Session> session_;
};

// Copies on every kind of slot in one device graph (tests/support/copy_graphs.h), whose
// memcpy nodes the fake checks against the live allocations: no node on a placeholder
// address.
TEST_P(FakeCudaDaemonTest, ACopyGraphOnParametersInternalsAndConstantsReplaysOnFreshBuffers) {
  replayd::testing::CheckACopyGraphOnEveryKindOfSlot(*session_, kN);
  ExpectTheDaemonLeftNothing();
}

// The same kind of graph from a capture.
TEST_P(FakeCudaDaemonTest, ACapturedCopyChainReplaysOnFreshBuffers) {
  replayd::testing::CheckACapturedCopyChain(*session_, kN);
  ExpectTheDaemonLeftNothing();
}

// A daemon of FakeCudaDaemonTest whose device copies at most kPitch bytes a row.
class FakeCudaNarrowPitchTest : public FakeCudaDaemonTest {
 protected:
  static constexpr int kPitch = 1000;
  void BeforeStart() override { fake_.set_max_pitch(kPitch); }
};

// A copy larger than the device's pitch (CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2 GiB - 1 on an
// H200) is memcpy nodes of 512 bytes end to end, the last one the rest: 1024 bytes are
// two, 4004 eight (the last of 420 bytes), 4352 nine; 256 bytes stay one node. The fake
// refuses a node whose pitch passes the device's, and retargets only 1-dimensional ones.
TEST_P(FakeCudaNarrowPitchTest, CopiesLargerThanTheDevicesPitchReplayAsPieces) {
  for (int64_t n : {64, 256, 1001, 1088}) {
    SCOPED_TRACE(::testing::Message() << n << " floats");
    replayd::testing::CheckACopyGraphOnEveryKindOfSlot(*session_, n);
    if (n % 64 == 0) replayd::testing::CheckACapturedCopyChain(*session_, n);  // its arena: whole 256 bytes
  }
  ExpectTheDaemonLeftNothing();
}

INSTANTIATE_TEST_SUITE_P(InDaemon, FakeCudaNarrowPitchTest, kInDaemon, PolicyName);

constexpr char kAddSourceCuda[] = R"(
extern "C" __global__ void add(float *out, const float *a, const float *b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
)";

// cuda-c compiled by the daemon, PTX and a cubin compiled by the client, each loaded by
// the fake and launched (the kernel does not run); a cubin for another architecture is
// refused with the loader's log; a captured launch becomes a kernel node retargeted at
// each replay.
TEST_P(FakeCudaDaemonTest, ProgramsInEveryCudaFormatLoadLaunchAndReplay) {
  absl::StatusOr<std::unique_ptr<Nvrtc>> nvrtc = Nvrtc::Load();
  if (!nvrtc.ok()) GTEST_SKIP() << "no NVRTC: " << nvrtc.status();
  {
    const v1::Signature signature = *ParseSignature("out,in,in,int32");
    ASSERT_OK_AND_ASSIGN(NvrtcModule ptx, (*nvrtc)->Compile(kAddSourceCuda, "add", "sm_90", {}, NvrtcOutput::kPtx));
    ASSERT_OK_AND_ASSIGN(NvrtcModule cubin,
                         (*nvrtc)->Compile(kAddSourceCuda, "add", "sm_90", {}, NvrtcOutput::kCubin));
    ASSERT_OK_AND_ASSIGN(NvrtcModule ampere,
                         (*nvrtc)->Compile(kAddSourceCuda, "add", "sm_80", {}, NvrtcOutput::kCubin));
    Buffer a = Alloc(kN * 4), b = Alloc(kN * 4), out = Alloc(kN * 4);
    std::vector<Program> programs;
    for (const ProgramSpec& spec : {ProgramSpec{"cuda-c", kAddSourceCuda, "add", signature, {}},
                                    ProgramSpec{"cuda-ptx", ptx.image, "add", signature, {}},
                                    ProgramSpec{"cuda-cubin", cubin.image, "add", signature, {}}}) {
      SCOPED_TRACE(spec.format);
      ASSERT_OK_AND_ASSIGN(Program p, session_->Load(spec));
      ASSERT_OK_AND_ASSIGN(v1::LaunchReply launched,
                           session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1},
                                            /*wait=*/true));
      EXPECT_GT(launched.device_seconds(), 0);
      programs.push_back(std::move(p));
    }
    auto refused = session_->Load(ProgramSpec{"cuda-cubin", ampere.image, "add", signature, {}});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("sm_80"));

    ASSERT_TRUE(session_->BeginCapture({&a, &b}, {}).ok());
    ASSERT_TRUE(session_->Launch(programs[0], {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1})
                    .ok());
    ASSERT_OK_AND_ASSIGN(Graph graph, session_->EndCapture({&out}));
    for (int i = 0; i < 2; ++i) {
      Buffer fa = Alloc(kN * 4), fb = Alloc(kN * 4), fout = Alloc(kN * 4);
      ASSERT_TRUE(session_->Replay(graph, {&fa, &fb, &fout}, /*wait=*/true).ok());
    }
  }
  ExpectTheDaemonLeftNothing();
}

// A program freed while a launch of it is still queued on the device: its module stays
// loaded until the launch has run (the fake runs queued work only when it is waited for,
// and faults a kernel whose module has gone by then).
TEST_P(FakeCudaDaemonTest, AProgramFreedWithALaunchInFlightOutlivesTheLaunch) {
  const v1::Signature signature = *ParseSignature("out,in,in,int32");
  Buffer a = Alloc(kN * 4), b = Alloc(kN * 4), out = Alloc(kN * 4);
  {
    ASSERT_OK_AND_ASSIGN(Program p, session_->Load(ProgramSpec{"cuda-c", kAddSourceCuda, "add", signature, {}}));
    ASSERT_OK(session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1},
                               /*wait=*/false)
                  .status());
  }  // freed here, the launch not waited for
  ASSERT_OK_AND_ASSIGN(Program again, session_->Load(ProgramSpec{"cuda-c", kAddSourceCuda, "add", signature, {}}));
  EXPECT_OK(session_->Launch(again, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1},
                             /*wait=*/true)
                .status());
}

constexpr char kBoundedSourceCuda[] = R"(
extern "C" __global__ void __launch_bounds__(64) add(float *out, const float *a, const float *b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
)";

// A kernel runs at most as many threads a block as its launch bounds (or registers)
// allow: a launch that asks more, eager or captured, is INVALID_ARGUMENT naming the
// kernel's limit, before the driver is asked; within them it runs and replays. In every
// format.
TEST_P(FakeCudaDaemonTest, ABlockPastTheKernelsLaunchBoundsIsRefused) {
  absl::StatusOr<std::unique_ptr<Nvrtc>> nvrtc = Nvrtc::Load();
  if (!nvrtc.ok()) GTEST_SKIP() << "no NVRTC: " << nvrtc.status();
  ASSERT_OK_AND_ASSIGN(NvrtcModule ptx, (*nvrtc)->Compile(kBoundedSourceCuda, "add", "sm_90", {}, NvrtcOutput::kPtx));
  ASSERT_OK_AND_ASSIGN(NvrtcModule cubin,
                       (*nvrtc)->Compile(kBoundedSourceCuda, "add", "sm_90", {}, NvrtcOutput::kCubin));
  const v1::Signature signature = *ParseSignature("out,in,in,int32");
  Buffer a = Alloc(kN * 4), b = Alloc(kN * 4), out = Alloc(kN * 4);
  for (const auto& [format, code] : std::vector<std::pair<std::string, std::string>>{
           {"cuda-c", kBoundedSourceCuda}, {"cuda-ptx", ptx.image}, {"cuda-cubin", cubin.image}}) {
    SCOPED_TRACE(format);
    ASSERT_OK_AND_ASSIGN(Program p, session_->Load(ProgramSpec{format, code, "add", signature, {}}));
    auto refused = session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {2, 1, 1}, {128, 1, 1},
                                    /*wait=*/true);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("kernel add runs at most 64 threads a block (its launch bounds or registers); "
                          "local 128x1x1 is 128"));
    EXPECT_OK(session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1},
                               /*wait=*/true)
                  .status());
    // A capture runs its launches as it records them: the same launch is refused there,
    // and the capture goes on.
    ASSERT_OK(session_->BeginCapture({&a, &b}, {}));
    auto captured = session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {2, 1, 1}, {128, 1, 1},
                                     /*wait=*/true);
    EXPECT_EQ(captured.status().code(), absl::StatusCode::kInvalidArgument) << captured.status();
    EXPECT_THAT(std::string(captured.status().message()), HasSubstr("runs at most 64 threads a block"));
    ASSERT_OK(session_->Launch(p, {View{&out}, View{&a}, View{&b}, int64_t{kN}}, {4, 1, 1}, {64, 1, 1}).status());
    ASSERT_OK_AND_ASSIGN(Graph graph, session_->EndCapture({&out}));
    EXPECT_OK(session_->Replay(graph, {&a, &b, &out}, /*wait=*/true).status());
  }
}

// A defined graph whose block size is a variable: a replay that asks more threads a
// block than the kernel's launch bounds is refused, at instantiation or at the node's
// update alike, and the next replay within them runs.
TEST_P(FakeCudaDaemonTest, AGraphNodePastTheKernelsLaunchBoundsIsRefusedAtItsReplay) {
  absl::StatusOr<std::unique_ptr<Nvrtc>> nvrtc = Nvrtc::Load();
  if (!nvrtc.ok()) GTEST_SKIP() << "no NVRTC: " << nvrtc.status();
  ASSERT_OK_AND_ASSIGN(Program p, session_->Load(ProgramSpec{"cuda-c", kBoundedSourceCuda, "add",
                                                             *ParseSignature("out,in,in,int32"), {}}));
  ASSERT_OK_AND_ASSIGN(Graph graph, session_->DefineGraph(replayd::testing::OneAddCall(
                                         p.handle(), kN, replayd::testing::VariableDef("t", 32, 128, 32), kN / 32, "t")));
  Buffer a = Alloc(kN * 4), b = Alloc(kN * 4), out = Alloc(kN * 4);
  replayd::testing::ExpectReplaysRefusedAbove(*session_, graph, a, b, out, {128, 64, 128, 32}, 64,
                                              "runs at most 64 threads a block");
}

// The driver reads one argument per parameter the kernel takes, as many bytes as each
// has: a signature that differs from the kernel's own parameters (read from the image
// in every format) is refused at Load, before anything could be launched with it.
TEST_P(FakeCudaDaemonTest, ASignatureThatDiffersFromTheKernelsParametersIsRefused) {
  absl::StatusOr<std::unique_ptr<Nvrtc>> nvrtc = Nvrtc::Load();
  if (!nvrtc.ok()) GTEST_SKIP() << "no NVRTC: " << nvrtc.status();
  ASSERT_OK_AND_ASSIGN(NvrtcModule ptx, (*nvrtc)->Compile(kAddSourceCuda, "add", "sm_90", {}, NvrtcOutput::kPtx));
  ASSERT_OK_AND_ASSIGN(NvrtcModule cubin, (*nvrtc)->Compile(kAddSourceCuda, "add", "sm_90", {}, NvrtcOutput::kCubin));
  for (const auto& [format, code] : std::vector<std::pair<std::string, std::string>>{
           {"cuda-c", kAddSourceCuda}, {"cuda-ptx", ptx.image}, {"cuda-cubin", cubin.image}}) {
    SCOPED_TRACE(format);
    for (const replayd::testing::WrongAddSignature& wrong : replayd::testing::kWrongAddSignatures) {
      ASSERT_OK_AND_ASSIGN(v1::Signature signature, ParseSignature(wrong.signature));
      auto refused = session_->Load(ProgramSpec{format, code, "add", signature, {}});
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << wrong.signature << ": " << refused.status();
      EXPECT_THAT(std::string(refused.status().message()), HasSubstr(format + " kernel add " + wrong.message))
          << wrong.signature;
    }
    ASSERT_OK_AND_ASSIGN(v1::Signature right, ParseSignature("out,in,in,int32"));
    EXPECT_OK(session_->Load(ProgramSpec{format, code, "add", right, {}}).status());
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, FakeCudaDaemonTest, kPolicies, PolicyName);

constexpr char kFaultSource[] = R"(
extern "C" __global__ void fault(float *x) {
  float *volatile nowhere = 0;
  *nowhere = x[0];
}
)";

// In the daemon's process (isolation shared), after a kernel fault every CUDA context of
// the process fails, new ones included, as an H200 showed: the faulting session and the
// others answer FAILED_PRECONDITION, a new CUDA session is UNAVAILABLE until the daemon
// restarts, and the CPU device serves on.
// Declared after the other suites (and value-parameterised like the one before it, so
// that gtest registers it later) so that it runs last.
class FakeCudaFaultTest : public FakeCudaDaemonTest {};

TEST_P(FakeCudaFaultTest, AKernelFaultEndsCudaServiceUntilTheDaemonRestarts) {
  if (!Nvrtc::Load().ok()) GTEST_SKIP() << "no NVRTC to compile the faulting kernel";
  auto other = client_->OpenSession("cuda:0");
  ASSERT_TRUE(other.ok()) << other.status();
  {
    Buffer mine = Alloc(64);
    auto theirs = other->Alloc(64);
    ASSERT_TRUE(theirs.ok()) << theirs.status();
    ASSERT_OK_AND_ASSIGN(Program fault,
                         session_->Load(ProgramSpec{"cuda-c", kFaultSource, "fault", *ParseSignature("inout"), {}}));
    auto launched = session_->Launch(fault, {View{&mine}}, {1, 1, 1}, {1, 1, 1}, /*wait=*/true);
    EXPECT_FALSE(launched.ok());
    EXPECT_EQ(fake_.count("faulted"), 1);

    auto read = session_->ReadVector<float>(mine, 1);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
    EXPECT_THAT(std::string(read.status().message()), HasSubstr("kernel fault"));
    auto their_read = other->ReadVector<float>(*theirs, 1);
    EXPECT_EQ(their_read.status().code(), absl::StatusCode::kFailedPrecondition) << their_read.status();
    EXPECT_THAT(std::string(their_read.status().message()), HasSubstr("kernel fault"));
  }
  auto refused = client_->OpenSession("cuda:0");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("replayd restarts"));

  // The fake answers as the H200 did: no new context of either kind.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaLibrary> cu, CudaLibrary::Load());
  CUcontext ctx = nullptr;
  EXPECT_EQ(cu->cuCtxCreate(&ctx, nullptr, 0, 0), GetParam().fault_error);
  EXPECT_EQ(cu->cuDevicePrimaryCtxRetain(&ctx, 0), GetParam().fault_error);

  // The daemon and its CPU device serve on.
  ASSERT_OK_AND_ASSIGN(std::vector<v1::Device> devices, client_->ListDevices());
  EXPECT_EQ(devices.size(), 2u);
  ASSERT_OK_AND_ASSIGN(Session cpu, client_->OpenSession("cpu:0"));
  const ProgramSpec affine_spec{"cpu-c", kAffineSource, "affine", *ParseSignature("out,in,int32,int32"), {}};
  ASSERT_OK_AND_ASSIGN(Program affine, cpu.Load(affine_spec));
  ASSERT_OK_AND_ASSIGN(Buffer in, cpu.Alloc(kN * 4));
  ASSERT_OK_AND_ASSIGN(Buffer out, cpu.Alloc(kN * 4));
  ASSERT_TRUE(cpu.WriteVector(in, std::vector<float>(kN, 1.5f)).ok());
  ASSERT_TRUE(cpu.Launch(affine, {View{&out}, View{&in}, int64_t{kN}, int64_t{1}}, {1, 1, 1}).ok());
  ASSERT_OK_AND_ASSIGN(std::vector<float> got, cpu.ReadVector<float>(out, kN));
  EXPECT_EQ(got, std::vector<float>(kN, 4.0f));
}

INSTANTIATE_TEST_SUITE_P(Policies, FakeCudaFaultTest, kInDaemon, PolicyName);
// Every other error cuda.h says leaves the process in an inconsistent state, to be
// terminated and relaunched, is a fault as an illegal address is.
INSTANTIATE_TEST_SUITE_P(
    StickyErrors, FakeCudaFaultTest,
    ::testing::Values(
        Policy{CudaContextPolicy::kSession, Isolation::kShared, "contained", CUDA_ERROR_CONTAINED},
        Policy{CudaContextPolicy::kSession, Isolation::kShared, "launch_timeout", CUDA_ERROR_LAUNCH_TIMEOUT},
        Policy{CudaContextPolicy::kSession, Isolation::kShared, "tensor_memory_leak", CUDA_ERROR_TENSOR_MEMORY_LEAK},
        Policy{CudaContextPolicy::kPrimary, Isolation::kShared, "mps_client_terminated",
               CUDA_ERROR_MPS_CLIENT_TERMINATED},
        Policy{CudaContextPolicy::kSession, Isolation::kShared, "external_device", CUDA_ERROR_EXTERNAL_DEVICE}),
    PolicyName);

// In executors (the default), a kernel fault ends only its tenant's executor: the fake in
// that process is poisoned as a GPU's whole process is, while the daemon's process, the
// other tenant's executor and the tenant's next executor each have CUDA state of their own.
class FakeCudaExecutorTest : public FakeGpuExecutorFixture {
 protected:
  void SetUp() override {
    absl::StatusOr<FakeCuda> fake = FindFake();
    if (!fake.ok()) GTEST_SKIP() << fake.status().message();
    fake_ = *fake;
    if (absl::Status s = CudaLibrary::sticky_fault(); !s.ok())
      GTEST_SKIP() << "an earlier case of this process faulted, which ends CUDA service for the process: " << s;
    fake_.reset();
    StartDaemon("cuda:0", [](DaemonOptions& d) {
      d.devices = {"cpu", "cuda"};
      d.cuda_executor_bytes = kExecutorBytes;
    });
  }

  FakeCuda fake_;
};

// A tenant's executor holds a CUDA context of its own, which the device's memory counts
// while it runs (--cuda_executor_bytes): past what the device has, a tenant's first session
// is refused, and an executor that ends gives its share back.
TEST_F(FakeCudaExecutorTest, AnExecutorsOwnContextIsCountedAgainstTheDevice) { CheckAnExecutorsOwnStateIsCounted(); }

TEST_F(FakeCudaExecutorTest, AnIdleExecutorGivesWayToAnotherTenantsExecutor) {
  CheckAnIdleExecutorGivesWayToAnotherTenantsExecutor();
}

// An executor that cannot load the CUDA driver (here: the daemon started without the
// fake on its LD_LIBRARY_PATH, which its CUDA executors inherit) says why: the session
// that started it is UNAVAILABLE naming the driver, and the daemon serves on.
TEST_F(FakeCudaExecutorTest, AnExecutorWithoutTheDriverSaysWhy) {
  const std::string path = std::getenv("LD_LIBRARY_PATH") ? std::getenv("LD_LIBRARY_PATH") : "";
  setenv("LD_LIBRARY_PATH", (cache_.path() / "nothing-here").c_str(), 1);
  SetUp();  // a daemon started now, its executors' environment without the fake
  setenv("LD_LIBRARY_PATH", path.c_str(), 1);
  if (HasFatalFailure() || IsSkipped()) return;
  Client research = As("research-token");
  absl::StatusOr<Session> refused = research.OpenSession("cuda:0");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), AllOf(HasSubstr("cuda:0 not found"), HasSubstr("libcuda")));
  ASSERT_OK_AND_ASSIGN(Session cpu, research.OpenSession("cpu:0"));
  ASSERT_OK_AND_ASSIGN(Buffer b, cpu.Alloc(64));
}

TEST_F(FakeCudaExecutorTest, AKernelFaultEndsOnlyItsTenantsExecutor) {
  if (!Nvrtc::Load().ok()) GTEST_SKIP() << "no NVRTC to compile the faulting kernel";
  Client research = As("research-token"), prod = As("prod-token");
  ASSERT_OK_AND_ASSIGN(Session mine, research.OpenSession("cuda:0"));
  ASSERT_OK_AND_ASSIGN(Session mine_too, research.OpenSession("cuda:0"));
  ASSERT_OK_AND_ASSIGN(Session theirs, prod.OpenSession("cuda:0"));
  ExpectCopiesRight(theirs, 1);
  ExpectCopiesRight(mine_too, 2);
  ASSERT_OK_AND_ASSIGN(Buffer held, mine.Alloc(1 << 20));
  ASSERT_OK_AND_ASSIGN(Buffer also, mine_too.Alloc(64));
  ASSERT_OK_AND_ASSIGN(Program fault,
                       mine.Load(ProgramSpec{"cuda-c", kFaultSource, "fault", *ParseSignature("inout"), {}}));
  absl::StatusOr<v1::LaunchReply> launched = mine.Launch(fault, {View{&held}}, {1, 1, 1}, {1, 1, 1}, /*wait=*/true);
  ASSERT_EQ(launched.status().code(), absl::StatusCode::kFailedPrecondition) << launched.status();
  EXPECT_THAT(std::string(launched.status().message()),
              AllOf(HasSubstr("executor of tenant research on cuda:0 lost its device while running program"),
                    HasSubstr("entry 'fault'"), HasSubstr("kernel fault")));
  // The tenant's other session shared the executor, and says so.
  absl::StatusOr<std::vector<float>> read = mine_too.ReadVector<float>(also, 1);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();

  // The other tenant never noticed; the daemon's own CUDA state was never touched.
  ExpectCopiesRight(theirs, 3);
  EXPECT_TRUE(CudaLibrary::sticky_fault().ok());
  EXPECT_EQ(fake_.count("faulted"), 0);
  EXPECT_EQ(fake_.count("contexts"), 0);

  // The tenant's next session runs in a fresh executor.
  EXPECT_TRUE(mine.Close().ok());
  EXPECT_TRUE(mine_too.Close().ok());
  ASSERT_OK_AND_ASSIGN(Session again, research.OpenSession("cuda:0"));
  ExpectCopiesRight(again, 4);
}


}  // namespace
}  // namespace replayd::client

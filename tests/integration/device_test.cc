// One suite for every kind of device: the same tests over loopback on cpu:0 here, and on
// cuda:0 or hip:0 where the machine has one (skipped with the reason otherwise), with
// the kernels written in each program format the device accepts.
#include <gmock/gmock.h>

#include <cmath>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/support/graph_def.h"
#include "tests/support/status_macros.h"
#include "tests/support/tenants_file.h"
#ifdef REPLAYD_WITH_CUDA
#include "drivers/cuda/cuda_driver.h"
#include "drivers/cuda/nvrtc.h"
#endif
#ifdef REPLAYD_WITH_HIP
#include "drivers/hip/hip_driver.h"
#include "drivers/hip/hip_program.h"
#endif

namespace replayd::client {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kN = 1000;  // not a multiple of any block size
constexpr int64_t kBlock = 64;
const Variable kCount{"n", 1, kN, 1};
const Variable kPos{"pos", 0, 1000, 1};

// The kernels of the suite in one format, and how their launches are shaped there.
struct Kernels {
  ProgramSpec add;            // out[i] = a[i] + b[i], i < n
  ProgramSpec affine;         // out[i] = in[i] * 2 + k, i < n
  ProgramSpec fault;          // stores through a null pointer
  std::string no_fault_test;  // why faults are not tested in this format, if they are not
  std::string broken_code;    // a source that does not compile or load
  std::string diagnostic;     // what its diagnostics say
  // Launch dimensions covering `n` elements: an expression of n's text.
  std::function<std::pair<std::vector<Dim>, std::vector<Dim>>(const std::string& n)> dims;
};

// cpu-c: one invocation per element, its index as the core id.
Kernels CpuKernels() {
  Kernels k;
  k.add = {"cpu-c",
           "void add(float *out, const float *a, const float *b, int n, int i) { if (i < n) out[i] = a[i] + b[i]; }",
           "add",
           *ParseSignature("out,in,in,int32", true),
           {}};
  k.affine = {"cpu-c",
              "void affine(float *out, const float *in, int n, int k, int i) {\n"
              "  if (i < n) out[i] = in[i] * 2.0f + (float)k;\n}",
              "affine",
              *ParseSignature("out,in,int32,int32", true),
              {}};
  k.no_fault_test = "cpu-c kernels run in the daemon's own process";
  k.broken_code = "void add(float *out) {\n  out[0] = undeclared;\n}\n";
  k.diagnostic = "undeclared";
  k.dims = [](const std::string& n) { return std::pair<std::vector<Dim>, std::vector<Dim>>{{Expr{n}}, {}}; };
  return k;
}

// CUDA C and HIP C: the same source, a thread per element in blocks of kBlock.
constexpr char kGpuSource[] = R"(
extern "C" __global__ void add(float *out, const float *a, const float *b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
extern "C" __global__ void affine(float *out, const float *in, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 2.0f + (float)k;
}
extern "C" __global__ void fault(float *out) {
  float *volatile nowhere = 0;
  *nowhere = out[0];
}
)";

Kernels GpuKernels(const std::string& format, const std::string& code) {
  Kernels k;
  k.add = {format, code, "add", *ParseSignature("out,in,in,int32"), {}};
  k.affine = {format, code, "affine", *ParseSignature("out,in,int32,int32"), {}};
  k.fault = {format, code, "fault", *ParseSignature("inout"), {}};
  k.dims = [](const std::string& n) {
    return std::pair<std::vector<Dim>, std::vector<Dim>>{{Expr{"(" + n + " + 63) // 64"}}, {uint64_t{kBlock}}};
  };
  if (format.rfind("hip", 0) == 0) k.no_fault_test = "the ROCm runtime aborts the process on a GPU memory fault";
  return k;
}

struct DeviceCase {
  std::string device;            // "cuda:0"
  std::string format;            // the format its kernels are given in
  bool primary_context = false;  // CUDA: --cuda_context=primary
};

void PrintTo(const DeviceCase& c, std::ostream* os) {
  *os << c.device << " " << c.format << (c.primary_context ? " primary context" : "");
}

std::string CaseName(const ::testing::TestParamInfo<DeviceCase>& info) {
  std::string name = info.param.device + "_" + info.param.format + (info.param.primary_context ? "_primary" : "");
  for (char& c : name)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

// Why the daemon lists no such device.
std::string WhyMissing(const std::string& device) {
  const std::string kind = device.substr(0, device.find(':'));
#ifdef REPLAYD_WITH_CUDA
  if (kind == "cuda") {
    CudaDriver driver({});
    if (driver.Discover().empty()) return driver.unavailable();
    return "the NVIDIA driver reports fewer devices";
  }
#endif
#ifdef REPLAYD_WITH_HIP
  if (kind == "hip") {
    HipDriver driver({});
    if (driver.Discover().empty()) return driver.unavailable();
    return "the HIP runtime reports fewer devices";
  }
#endif
  return "this build has no " + kind + " driver";
}

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-4, 4);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// What a CUDA executor's own context counts against the device in these tests.
constexpr uint64_t kCudaExecutorBytes = uint64_t{512} << 20;

class DeviceTest : public DaemonFixture, public ::testing::WithParamInterface<DeviceCase> {
 protected:
  // Every device kind, the case's CUDA context policy.
  void Adjust(DaemonOptions& d) {
    d.devices = absl::StrSplit(kKnownDeviceKinds, ',');
#ifdef REPLAYD_WITH_CUDA
    if (GetParam().primary_context) d.cuda.context = CudaContextPolicy::kPrimary;
    d.cuda_executor_bytes = kCudaExecutorBytes;
#endif
  }

  void SetUp() override {
    Options options;
    options.adjust = [this](DaemonOptions& d) { Adjust(d); };
    Start(options);
    if (HasFatalFailure()) return;
    auto devices = client_->ListDevices();
    ASSERT_TRUE(devices.ok()) << devices.status();
    for (const v1::Device& device : *devices)
      if (device.id() == GetParam().device) device_ = device;
    if (device_.id().empty())
      GTEST_SKIP() << GetParam().device << " is not on this machine: " << WhyMissing(GetParam().device);
    ASSERT_THAT(device_.formats(), ::testing::Contains(GetParam().format));
    absl::StatusOr<Kernels> kernels = KernelsFor(GetParam().format);
    if (!kernels.ok()) GTEST_SKIP() << kernels.status();
    kernels_ = std::move(*kernels);
    auto session = client_->OpenSession(device_.id());
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = std::make_unique<Session>(std::move(*session));
  }

  absl::StatusOr<Kernels> KernelsFor(const std::string& format) {
    if (format == "cpu-c") return CpuKernels();
    if (format == "cuda-c" || format == "hip-c") {
      Kernels k = GpuKernels(format, kGpuSource);
      k.broken_code = "extern \"C\" __global__ void add(float *out) {\n  out[0] = undeclared;\n}\n";
      k.diagnostic = "undeclared";
      return k;
    }
#ifdef REPLAYD_WITH_HIP
    if (format == "hip-hsaco") {
      // The client compiles the code object itself, for the device's gfx target.
      auto hip = HipLibrary::Load();
      if (!hip.ok()) return hip.status();
      ProgramSource source{"hip-c", kGpuSource, "add", {}, {}};
      auto module = BuildHipModule(source, **hip, device_.architecture());
      if (!module.ok()) return module.status();
      Kernels k = GpuKernels(format, module->image);
      k.broken_code = std::string(
          "\x7f"
          "ELF\x02\x01\x01 truncated",
          17);
      k.diagnostic = "shorter than an ELF64 header";  // refused before the loader reads past its end
      return k;
    }
#endif
#ifdef REPLAYD_WITH_CUDA
    if (format == "cuda-ptx" || format == "cuda-cubin") {
      // The client compiles the code itself for the device's architecture: PTX, or a
      // cubin of machine code.
      const bool ptx = format == "cuda-ptx";
      auto nvrtc = Nvrtc::Load();
      if (!nvrtc.ok()) return nvrtc.status();
      auto module = (*nvrtc)->Compile(kGpuSource, "add", device_.architecture(), {},
                                      ptx ? NvrtcOutput::kPtx : NvrtcOutput::kCubin);
      if (!module.ok()) return module.status();
      Kernels k = GpuKernels(format, module->image);
      k.broken_code =
          ptx ? ".version 8.0\n.target " + device_.architecture() + "\n.address_size 64\n.visible .entry add(\n"
              : module->image.substr(0, module->image.size() / 3);  // an ELF cut short
      // A cubin cut short is refused before the loader, which takes no size, reads past its end.
      k.diagnostic = ptx ? "does not load" : "its end";
      return k;
    }
#endif
    return absl::UnavailableError("the suite has no kernels in " + format + " in this build");
  }

  // A buffer; on failure the failure is recorded and an empty buffer (handle 0) returned,
  // which every later call refuses, so the case fails without ending the binary.
  Buffer Alloc(uint64_t bytes) {
    auto b = session_->Alloc(bytes);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : Buffer();
  }

  // A launch of `program` over n elements with `args`, n bound to the variable n.
  LaunchSpec Over(std::vector<KernelArg> args, int64_t n) {
    LaunchSpec spec;
    spec.args = std::move(args);
    std::tie(spec.global, spec.local) = kernels_.dims("n");
    spec.variables = {{kCount, n}};
    return spec;
  }

  // A captured chain of `calls` affine launches over kN elements, bin -> t -> t' ... ->
  // out, the call c adding `position` (a variable of the graph) + c % 3: each
  // element of out is (...((in * 2 + k0) * 2 + k1)...).
  absl::StatusOr<Graph> CaptureAffineChain(const Program& affine, Buffer& bin, Buffer& out, int calls,
                                           const Variable& position) {
    if (absl::Status s = session_->BeginCapture({&bin}, {kCount, position}); !s.ok()) return s;
    std::vector<Buffer> temps;
    for (int c = 0; c < calls - 1; ++c) temps.push_back(Alloc(kN * 4));
    for (int c = 0; c < calls; ++c) {
      const Buffer* src = c == 0 ? &bin : &temps[c - 1];
      const Buffer* dst = c == calls - 1 ? &out : &temps[c];
      LaunchSpec spec =
          Over({View{dst}, View{src}, Expr{"n"}, Expr{position.name + " + " + std::to_string(c % 3)}}, kN);
      spec.variables.push_back({position, 7});
      if (absl::Status s = session_->Launch(affine, spec).status(); !s.ok()) return s;
    }
    temps.clear();
    return session_->EndCapture({&out});
  }

  // What element i of such a chain's out is, for n elements and position p.
  static float ChainValue(float in, int calls, int64_t p) {
    float v = in;
    for (int c = 0; c < calls; ++c) v = v * 2.0f + static_cast<float>(p + c % 3);
    return v;
  }

  std::vector<float> ReadFloats(const Buffer& b, size_t n) {
    auto v = session_->ReadVector<float>(b, n);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : std::vector<float>();
  }

  v1::Device device_;
  Kernels kernels_;
  std::unique_ptr<Session> session_;
};

TEST_P(DeviceTest, ListsTheDeviceWithWhatItIs) {
  EXPECT_FALSE(device_.name().empty());
  EXPECT_FALSE(device_.architecture().empty());
  EXPECT_GT(device_.total_memory(), 0u);
  EXPECT_LE(device_.free_memory(), device_.total_memory());
  EXPECT_GT(device_.limits().max_global_total(), 0u);
  EXPECT_EQ(device_.kind(), device_.id().substr(0, device_.id().find(':')));
}

TEST_P(DeviceTest, WritesAndReadsBackAcrossStagingChunks) {
  const size_t n = (3 << 20) / 4 + 5;  // more than two 1 MiB staging chunks, not a multiple
  std::vector<float> data = Random(n, 1);
  Buffer b = Alloc(n * 4);
  ASSERT_TRUE(session_->WriteVector(b, data).ok());
  EXPECT_EQ(ReadFloats(b, n), data);
  // A read at an offset inside the second chunk.
  std::vector<uint8_t> part(4096);
  ASSERT_TRUE(session_->Read(b, (1 << 20) + 12, part).ok());
  EXPECT_EQ(0, std::memcmp(part.data(), reinterpret_cast<const uint8_t*>(data.data()) + (1 << 20) + 12, part.size()));
}

TEST_P(DeviceTest, NewBuffersAreZeroed) {
  Buffer b = Alloc(kN * 4);
  EXPECT_EQ(ReadFloats(b, kN), std::vector<float>(kN, 0.0f));
}

TEST_P(DeviceTest, AnEagerLaunchComputes) {
  ASSERT_OK_AND_ASSIGN(Program add, session_->Load(kernels_.add));
  std::vector<float> a = Random(kN, 2), b = Random(kN, 3);
  Buffer ba = Alloc(kN * 4), bb = Alloc(kN * 4), out = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(ba, a).ok());
  ASSERT_TRUE(session_->WriteVector(bb, b).ok());
  LaunchSpec spec = Over({View{&out}, View{&ba}, View{&bb}, Expr{"n"}}, kN);
  spec.wait = true;
  auto launched = session_->Launch(add, spec);
  ASSERT_TRUE(launched.ok()) << launched.status();
  EXPECT_GT(launched->device_seconds(), 0);
  std::vector<float> got = ReadFloats(out, kN);
  ASSERT_EQ(got.size(), static_cast<size_t>(kN));
  for (int64_t i = 0; i < kN; ++i) ASSERT_FLOAT_EQ(got[i], a[i] + b[i]) << i;
}

TEST_P(DeviceTest, ACapturedChainReplaysWithVariablesAsParameters) {
  ASSERT_OK_AND_ASSIGN(Program affine, session_->Load(kernels_.affine));
  std::vector<float> in = Random(kN, 4);
  Buffer bin = Alloc(kN * 4), out = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(bin, in).ok());
  // 40 calls (more than the first batch of 32): in -> t -> t' ... -> out, k = pos + step.
  constexpr int kCalls = 40;
  auto graph = CaptureAffineChain(affine, bin, out, kCalls, kPos);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_GE(graph->info().batches(), 2u);
  auto expect = [&](int64_t n, int64_t p, size_t i) {
    return static_cast<int64_t>(i) >= n ? 0.0f : ChainValue(in[i], kCalls, p);
  };
  for (auto [n, p] : {std::pair<int64_t, int64_t>{kN, 3}, {kN, 11}, {kN / 2 + 1, 5}}) {
    std::vector<float> zero(kN, 0.0f);
    ASSERT_TRUE(session_->WriteVector(out, zero).ok());
    auto r = session_->Replay(*graph, {&bin, &out, n, p}, /*wait=*/true, {View{&out, 0, kN * 4}});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->reads.size(), 1u);
    ASSERT_EQ(r->reads[0].size(), static_cast<size_t>(kN * 4));
    const float* got = reinterpret_cast<const float*>(r->reads[0].data());
    for (size_t i = 0; i < static_cast<size_t>(kN); ++i)
      ASSERT_FLOAT_EQ(got[i], expect(n, p, i)) << n << " " << p << " " << i;
  }
}

// Copies on the device: eager, and as copy nodes of a device graph between kernel nodes
// (in -> affine -> t, t copied into out at an offset, then a kernel reading the copy).
TEST_P(DeviceTest, CopiesRunEagerlyAndAsNodesOfADeviceGraph) {
  ASSERT_OK_AND_ASSIGN(Program affine, session_->Load(kernels_.affine));
  std::vector<float> in = Random(kN, 9);
  Buffer bin = Alloc(kN * 4), out = Alloc(2 * kN * 4), last = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(bin, in).ok());
  auto copied = session_->Copy(View{&out, kN * 4, 0}, View{&bin}, /*wait=*/true);
  ASSERT_TRUE(copied.ok()) << copied.status();
  std::vector<float> got = ReadFloats(out, 2 * kN);
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(got[kN + i], in[i]) << i;

  ASSERT_TRUE(session_->BeginCapture({&bin}, {kCount, kPos}).ok());
  {
    Buffer t = Alloc(kN * 4);
    LaunchSpec first = Over({View{&t}, View{&bin}, Expr{"n"}, Expr{"pos"}}, kN);
    first.variables.push_back({kPos, 1});
    ASSERT_TRUE(session_->Launch(affine, first).ok());
    ASSERT_TRUE(session_->Copy(View{&out, kN * 4, 0}, View{&t}).ok());
    LaunchSpec second = Over({View{&last}, View{&out, kN * 4, 0}, Expr{"n"}, int64_t{0}}, kN);
    ASSERT_TRUE(session_->Launch(affine, second).ok());
  }
  auto graph = session_->EndCapture({&out, &last});
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->info().calls(), 3u);
  EXPECT_EQ(graph->info().batches(), 1u);
  for (int64_t p : {2, 30}) {
    Buffer fresh = Alloc(2 * kN * 4), fresh_last = Alloc(kN * 4);
    auto r = session_->Replay(*graph, {&bin, &fresh, &fresh_last, kN, p}, /*wait=*/true, {View{&fresh_last}});
    ASSERT_TRUE(r.ok()) << r.status();
    const float* values = reinterpret_cast<const float*>(r->reads[0].data());
    for (int64_t i = 0; i < kN; ++i) ASSERT_FLOAT_EQ(values[i], (in[i] * 2.0f + float(p)) * 2.0f) << p << " " << i;
  }
}

// Copy nodes on every kind of slot, defined explicitly: parameter to internal, internal
// to parameter (at an offset), constant to parameter, parameter to parameter, constant to
// internal, with a kernel between. On CUDA a memcpy node must be built on memory the
// context knows (cuGraphAddMemcpyNode refuses a placeholder address), and the CPU device
// refuses a copy node off its allocations the same way, so this fails here too if the
// engine builds one on a parameter's placeholder. Replayed on fresh buffers, twice.
TEST_P(DeviceTest, CopyNodesOnParametersInternalsAndConstants) {
  ASSERT_OK_AND_ASSIGN(Program affine, session_->Load(kernels_.affine));
  const std::vector<float> constant = Random(kN, 21);
  Buffer cbuf = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(cbuf, constant).ok());
  replayd::testing::GraphDefBuilder builder;
  v1::GraphDef& def = builder.def();
  auto* n = def.add_variables();
  n->set_name(kCount.name);
  n->set_min(kCount.min);
  n->set_max(kCount.max);
  const uint32_t kIn = builder.Slot(v1::Slot::PARAMETER, kN * 4), kOut = builder.Slot(v1::Slot::PARAMETER, 2 * kN * 4),
                 kOut2 = builder.Slot(v1::Slot::PARAMETER, 2 * kN * 4), kT = builder.Slot(v1::Slot::INTERNAL, kN * 4),
                 kU = builder.Slot(v1::Slot::INTERNAL, kN * 4),
                 kC = builder.Slot(v1::Slot::CONSTANT, kN * 4, cbuf.handle());
  auto copy = [&](uint32_t dst, uint64_t dst_offset, uint32_t src) { builder.Copy(dst, dst_offset, src, kN * 4); };
  copy(kT, 0, kIn);  // parameter -> internal
  {
    auto* call = def.add_calls();
    call->set_program(affine.handle());
    call->add_args()->mutable_view()->set_slot(kU);
    call->add_args()->mutable_view()->set_slot(kT);
    call->add_args()->mutable_expr()->set_variable(kCount.name);
    call->add_args()->mutable_expr()->set_constant(1);
    auto [global, local] = kernels_.dims(kCount.name);
    for (auto [dims, out] : {std::pair{&global, call->mutable_global()}, {&local, call->mutable_local()}})
      for (const Dim& d : *dims) {
        v1::Expr* e = out->Add();
        if (const Expr* text = std::get_if<Expr>(&d)) e->set_text(text->text);
        else e->set_constant(static_cast<int64_t>(std::get<uint64_t>(d)));
      }
  }
  copy(kOut, 0, kU);       // internal -> parameter
  copy(kOut, kN * 4, kC);  // constant -> parameter, at an offset
  copy(kOut2, 0, kIn);     // parameter -> parameter
  copy(kT, 0, kC);         // constant -> internal
  copy(kOut2, kN * 4, kT);
  auto graph = session_->DefineGraph(def);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->info().calls(), 7u);
  for (uint32_t seed : {31u, 32u}) {
    const std::vector<float> in = Random(kN, seed);
    Buffer bin = Alloc(kN * 4), out = Alloc(2 * kN * 4), out2 = Alloc(2 * kN * 4);
    ASSERT_TRUE(session_->WriteVector(bin, in).ok());
    auto r = session_->Replay(*graph, {&bin, &out, &out2, kN}, /*wait=*/true);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::vector<float> got = ReadFloats(out, 2 * kN), got2 = ReadFloats(out2, 2 * kN);
    ASSERT_EQ(got.size(), size_t{2 * kN});
    ASSERT_EQ(got2.size(), size_t{2 * kN});
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_FLOAT_EQ(got[i], in[i] * 2.0f + 1.0f) << seed << " " << i;
      ASSERT_EQ(got[kN + i], constant[i]) << seed << " " << i;
      ASSERT_EQ(got2[i], in[i]) << seed << " " << i;
      ASSERT_EQ(got2[kN + i], constant[i]) << seed << " " << i;
    }
  }
}

// A copy larger than CUDA's largest pitch (CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2 GiB - 1)
// replays: 2.5 GiB and 4 KiB are memcpy nodes of 1 GiB, 1 GiB and the rest. Marked
// stretches of the source, at its start, across each piece's end and at its end, arrive;
// an unmarked one stays zero.
TEST_P(DeviceTest, ACopyNodeLargerThanCudasLargestPitchReplays) {
  if (device_.kind() != "cuda") GTEST_SKIP() << "only CUDA limits a copy node's pitch";
  constexpr uint64_t kGiB = uint64_t{1} << 30, kBytes = 2 * kGiB + kGiB / 2 + 4096, kMark = 8192;
  replayd::testing::GraphDefBuilder builder;
  const uint32_t kSrc = builder.Slot(v1::Slot::PARAMETER, kBytes), kDst = builder.Slot(v1::Slot::PARAMETER, kBytes);
  builder.Copy(kDst, 0, kSrc, kBytes);
  ASSERT_OK_AND_ASSIGN(Graph graph, session_->DefineGraph(builder.def()));
  Buffer src = Alloc(kBytes), dst = Alloc(kBytes);
  const uint64_t marks[] = {0, kGiB - kMark / 2, 2 * kGiB - kMark / 2, kBytes - kMark};
  std::vector<std::vector<uint8_t>> written;
  for (uint64_t at : marks) {
    const std::vector<float> values = Random(kMark / 4, static_cast<uint32_t>(at / 4096 + 1));
    written.emplace_back(reinterpret_cast<const uint8_t*>(values.data()),
                         reinterpret_cast<const uint8_t*>(values.data()) + kMark);
    ASSERT_OK(session_->Write(src, at, written.back()));
  }
  ASSERT_OK(session_->Replay(graph, {&src, &dst}, /*wait=*/true).status());
  for (size_t i = 0; i < std::size(marks); ++i) {
    std::vector<uint8_t> got(kMark);
    ASSERT_OK(session_->Read(dst, marks[i], got));
    EXPECT_EQ(got, written[i]) << "the stretch at " << marks[i];
  }
  std::vector<uint8_t> unmarked(kMark, 0xff);
  ASSERT_OK(session_->Read(dst, kGiB + kGiB / 2, unmarked));
  EXPECT_EQ(unmarked, std::vector<uint8_t>(kMark, 0));
}

TEST_P(DeviceTest, AReplaySequenceStepsItsVariable) {
  ASSERT_OK_AND_ASSIGN(Program affine, session_->Load(kernels_.affine));
  std::vector<float> in = Random(kN, 5);
  Buffer bin = Alloc(kN * 4), out = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(bin, in).ok());
  ASSERT_TRUE(session_->BeginCapture({&bin}, {kCount, kPos}).ok());
  LaunchSpec spec = Over({View{&out}, View{&bin}, Expr{"n"}, Expr{"pos"}}, kN);
  spec.variables.push_back({kPos, 0});
  ASSERT_TRUE(session_->Launch(affine, spec).ok());
  auto graph = session_->EndCapture({&out});
  ASSERT_TRUE(graph.ok()) << graph.status();
  SequenceSpec seq;
  seq.base = {&bin, &out, kN, int64_t{17}};
  seq.step_param = 3;
  seq.count = 8;
  seq.reads = {View{&out, 0, 4 * 4}};
  seq.stream_reads = true;
  std::vector<std::vector<float>> seen;
  auto r = session_->ReplaySequence(*graph, seq, [&](uint32_t, std::vector<std::string> reads) {
    const float* f = reinterpret_cast<const float*>(reads[0].data());
    seen.emplace_back(f, f + 4);
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->replays, 8u);
  ASSERT_EQ(seen.size(), 8u);
  for (int s = 0; s < 8; ++s)
    for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(seen[s][i], in[i] * 2.0f + static_cast<float>(17 + s)) << s;
}

// A graph whose every node changes at every replay, replayed thousands of times as one
// sequence, each step's result checked: the device graph's node updates run for a long
// time (on HIP, ROCm keeps an argument segment per update until the graph is rebuilt, by
// default past 16 MiB, which this passes a few times over).
TEST_P(DeviceTest, AGraphUpdatedAtEveryReplayComputesThousandsOfTimes) {
  ASSERT_OK_AND_ASSIGN(Program affine, session_->Load(kernels_.affine));
  std::vector<float> in = Random(kN, 6);
  Buffer bin = Alloc(kN * 4), out = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(bin, in).ok());
  constexpr int kCalls = 32;
  constexpr uint32_t kSteps = 6000;
  const Variable step{"step", 0, 1 << 20, 1};
  ASSERT_OK_AND_ASSIGN(Graph graph, CaptureAffineChain(affine, bin, out, kCalls, step));
  SequenceSpec seq;
  seq.base = {&bin, &out, kN, int64_t{0}};
  seq.step_param = 3;
  seq.count = kSteps;
  seq.reads = {View{&out, 0, 2 * 4}};
  seq.stream_reads = true;
  uint32_t seen = 0, wrong = 0;
  auto r = session_->ReplaySequence(graph, seq, [&](uint32_t s, std::vector<std::string> reads) {
    ++seen;
    const float* f = reinterpret_cast<const float*>(reads[0].data());
    for (int i = 0; i < 2; ++i) {
      const float want = ChainValue(in[i], kCalls, s);
      if (std::abs(f[i] - want) > 1e-6f * std::abs(want) && wrong++ < 5)
        ADD_FAILURE() << "step " << s << " element " << i << ": " << f[i] << ", not " << want;
    }
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->replays, kSteps);
  EXPECT_EQ(seen, kSteps);
  EXPECT_EQ(wrong, 0u);
}

TEST_P(DeviceTest, ABrokenProgramReturnsItsDiagnostics) {
  ProgramSpec broken = kernels_.add;
  broken.code = kernels_.broken_code;
  auto p = session_->Load(broken);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_THAT(std::string(p.status().message()), HasSubstr(kernels_.diagnostic));
  // The session goes on.
  ASSERT_OK_AND_ASSIGN(Program add, session_->Load(kernels_.add));
  EXPECT_NE(add.handle(), 0u);
}

// A signature that leaves out a parameter the kernel takes is refused at Load, before
// anything is launched with too few arguments: on CUDA the driver's own list of the
// kernel's parameters (cuFuncGetParamInfo) says so, on HIP the code object's metadata
// the runtime reads them from; cpu-c's entry trampoline does not compile.
TEST_P(DeviceTest, ASignatureShortOfTheKernelsParametersIsRefused) {
  ProgramSpec short_of_one = kernels_.add;
  short_of_one.signature.mutable_params()->RemoveLast();
  auto p = session_->Load(short_of_one);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  if (!absl::StartsWith(GetParam().format, "cpu")) {
    EXPECT_THAT(std::string(p.status().message()),
                HasSubstr("takes more than 3 parameters; its signature declares 3 parameters (8, 8, 8 bytes)"));
  }
  // The session goes on.
  ASSERT_OK_AND_ASSIGN(Program add, session_->Load(kernels_.add));
  EXPECT_NE(add.handle(), 0u);
}

// A kernel fault on CUDA is sticky for the whole process: every CUDA context, other
// sessions' and ones created later alike, answers it from then on (seen on an H200:
// another session's cuModuleLoadDataEx and every later cuCtxCreate returned
// CUDA_ERROR_ILLEGAL_ADDRESS, with both context policies).
// Two tenants, research (whose kernel faults, in one of its two sessions) and prod:
// - In an executor (isolation process, the default on cuda), that process is research's
//   alone: both its sessions answer FAILED_PRECONDITION naming the lost device, prod's
//   session computes right before and after, and research's next session runs in a
//   fresh executor and computes right.
// - In the daemon's process (isolation shared, and every HIP device), the faulting session
//   says it faulted, the device's other sessions (prod's too) fail, new sessions are
//   UNAVAILABLE until the daemon restarts, even once every session has closed.
// Either way the daemon and its other devices serve on. In the daemon's process every
// later CUDA case of the same process fails after this one: ctest runs each case in a
// process of its own, and tests/gpu/run.sh runs the fault cases apart.
TEST_P(DeviceTest, AKernelFaultIsContainedToItsExecutorOrEndsTheDaemonsDeviceService) {
  if (!kernels_.no_fault_test.empty()) GTEST_SKIP() << kernels_.no_fault_test;
  // Two tenants, both trusted so that either isolation applies to both.
  session_.reset();
  const std::filesystem::path file = cache_.path() / "tenants.textproto";
  std::ofstream(file) << TenantText("research", "research-token", "  trusted: true\n")
                      << TenantText("prod", "prod-token", "  trusted: true\n");
  Options options;
  options.tenants_file = file;
  options.adjust = [this](DaemonOptions& d) { Adjust(d); };
  Start(options);
  if (HasFatalFailure()) return;
  auto as = [this](const std::string& token) {
    ClientOptions o;
    o.token = token;
    return Client::Connect(daemon_->address(), o);
  };
  Client research = as("research-token"), prod = as("prod-token");
  const bool executor = isolation_ == Isolation::kProcess && device_.id().starts_with("cuda:");
  // out = a + a over kN elements in `s`, read back: what a session whose device works sees.
  auto expect_add_right = [&](Session& s, float x) {
    ASSERT_OK_AND_ASSIGN(Program add, s.Load(kernels_.add));
    ASSERT_OK_AND_ASSIGN(Buffer a, s.Alloc(kN * 4));
    ASSERT_OK_AND_ASSIGN(Buffer out, s.Alloc(kN * 4));
    ASSERT_TRUE(s.WriteVector(a, std::vector<float>(kN, x)).ok());
    ASSERT_TRUE(s.Launch(add, Over({View{&out}, View{&a}, View{&a}, Expr{"n"}}, kN)).ok());
    ASSERT_OK_AND_ASSIGN(std::vector<float> sum, s.ReadVector<float>(out, kN));
    EXPECT_EQ(sum, std::vector<float>(kN, 2 * x));
  };
  {
    ASSERT_OK_AND_ASSIGN(Session mine, research.OpenSession(device_.id()));
    ASSERT_OK_AND_ASSIGN(Session mine_too, research.OpenSession(device_.id()));
    ASSERT_OK_AND_ASSIGN(Session theirs, prod.OpenSession(device_.id()));
    expect_add_right(theirs, 1.5f);
    ASSERT_OK_AND_ASSIGN(Buffer held, mine.Alloc(64));
    ASSERT_OK_AND_ASSIGN(Buffer also, mine_too.Alloc(64));
    ASSERT_OK_AND_ASSIGN(Buffer their_buffer, theirs.Alloc(64));
    ASSERT_OK_AND_ASSIGN(Program fault, mine.Load(kernels_.fault));
    LaunchSpec spec;
    spec.args = {View{&held}};
    spec.wait = true;
    EXPECT_FALSE(mine.Launch(fault, spec).ok());
    const std::string lost = executor ? "lost its device" : "kernel fault";
    auto read = mine.ReadVector<float>(held, 1);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(lost));
    // The tenant's other session shares its executor, or the daemon's CUDA state.
    auto read_too = mine_too.ReadVector<float>(also, 1);
    EXPECT_EQ(read_too.status().code(), absl::StatusCode::kFailedPrecondition) << read_too.status();
    EXPECT_THAT(std::string(read_too.status().message()), HasSubstr(lost));
    if (executor) {
      // The other tenant never noticed.
      expect_add_right(theirs, 2.5f);
    } else {
      auto their_read = theirs.ReadVector<float>(their_buffer, 1);
      EXPECT_EQ(their_read.status().code(), absl::StatusCode::kFailedPrecondition) << their_read.status();
      EXPECT_THAT(std::string(their_read.status().message()), HasSubstr("kernel fault"));
      auto refused = prod.OpenSession(device_.id());
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  if (executor) {
    // The tenant's next session: a fresh executor, a fresh CUDA context, right results.
    ASSERT_OK_AND_ASSIGN(Session again, research.OpenSession(device_.id()));
    expect_add_right(again, 3.5f);
  } else {
    // Every session closed: still refused, saying why and what brings the device back.
    auto refused = research.OpenSession(device_.id());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("replayd restarts"));
  }
  // The daemon and its CPU device serve on.
  ASSERT_OK_AND_ASSIGN(Session cpu, prod.OpenSession("cpu:0"));
  ASSERT_OK_AND_ASSIGN(Program add, cpu.Load(CpuKernels().add));
  ASSERT_OK_AND_ASSIGN(Buffer a, cpu.Alloc(kN * 4));
  ASSERT_OK_AND_ASSIGN(Buffer out, cpu.Alloc(kN * 4));
  ASSERT_TRUE(cpu.WriteVector(a, std::vector<float>(kN, 1.5f)).ok());
  LaunchSpec spec;
  spec.args = {View{&out}, View{&a}, View{&a}, Expr{"n"}};
  std::tie(spec.global, spec.local) = CpuKernels().dims("n");
  spec.variables = {{kCount, kN}};
  ASSERT_TRUE(cpu.Launch(add, spec).ok());
  ASSERT_OK_AND_ASSIGN(std::vector<float> sum, cpu.ReadVector<float>(out, kN));
  EXPECT_EQ(sum, std::vector<float>(kN, 3.0f));
}

// Its buffers, and on cuda with executors its executor's own context (the tenant's last
// session closed, so its executor ended).
TEST_P(DeviceTest, ClosingTheSessionGivesBackItsMemory) {
  const uint64_t before = FreeMemory(device_.id());
  {
    Buffer b = Alloc(8 << 20);
    EXPECT_LE(FreeMemory(device_.id()), before - (8 << 20));
  }
  ASSERT_TRUE(session_->Close().ok());
  const bool executor = isolation_ == Isolation::kProcess && device_.id().starts_with("cuda:");
  EXPECT_EQ(FreeMemory(device_.id()), before + (executor ? kCudaExecutorBytes : 0));
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceTest,
                         ::testing::Values(DeviceCase{"cpu:0", "cpu-c"}, DeviceCase{"cuda:0", "cuda-c"},
                                           DeviceCase{"cuda:0", "cuda-ptx"}, DeviceCase{"cuda:0", "cuda-cubin"},
                                           DeviceCase{"cuda:0", "cuda-c", true}, DeviceCase{"hip:0", "hip-c"},
                                           DeviceCase{"hip:0", "hip-hsaco"}),
                         CaseName);

}  // namespace
}  // namespace replayd::client

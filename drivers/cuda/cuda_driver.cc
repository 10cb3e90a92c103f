#include "drivers/cuda/cuda_driver.h"

#include <elf.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "drivers/cuda/cuda_library.h"
#include "drivers/cuda/cuda_program.h"
#include "drivers/cuda/nvrtc.h"
#include "drivers/device_error.h"
#include "drivers/device_memory.h"
#include "drivers/elf_image.h"
#include "drivers/kernel_params.h"
#include "drivers/module_artifact.h"
#include "drivers/shared_fault.h"
#include "drivers/staging.h"

namespace replayd {

absl::StatusOr<CudaContextPolicy> ParseCudaContextPolicy(absl::string_view name) {
  if (name == "session") return CudaContextPolicy::kSession;
  if (name == "primary") return CudaContextPolicy::kPrimary;
  return absl::InvalidArgumentError(absl::StrCat("CUDA context policy \"", name, "\" is not session or primary"));
}

namespace {

// A fault is an error after which the context cannot be used again: among them every
// error cuda.h says leaves the process in an inconsistent state, to be terminated and
// relaunched.
DeviceErrorKind Classify(CUresult r) {
  switch (r) {
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_MPS_CLIENT_TERMINATED:
    case CUDA_ERROR_EXTERNAL_DEVICE:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      return DeviceErrorKind::kFault;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return DeviceErrorKind::kOutOfMemory;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
      return DeviceErrorKind::kBadRequest;
    default:
      return DeviceErrorKind::kOther;
  }
}

// Why a device in compute mode `mode` refuses a context, for a message; "" in the default
// mode. (nvidia-smi --compute-mode sets the mode.)
std::string ComputeModeText(int mode) {
  switch (mode) {
    case CU_COMPUTEMODE_PROHIBITED:
      return "its compute mode is prohibited: no process may use it (nvidia-smi --compute-mode=DEFAULT, then "
             "restart replayd)";
    case CU_COMPUTEMODE_EXCLUSIVE_PROCESS:
      return "its compute mode is exclusive-process: one process at a time may use it, and another does (each "
             "tenant's executor is a process of its own: give the tenants isolation shared, run an MPS server, or "
             "set the compute mode to default)";
    default:
      return "";
  }
}

// What a device is, read once from the driver at discovery.
struct CudaDescription {
  DeviceInfo info;
  std::string arch;  // "sm_90"
  // The largest pitch a copy may have (CU_DEVICE_ATTRIBUTE_MAX_PITCH): CopyPieces.
  uint64_t max_pitch = 0;
};

absl::StatusOr<CudaDescription> Describe(const CudaLibrary& cu, const Nvrtc* nvrtc, CUdevice dev, int ordinal) {
  CudaDescription d;
  DeviceInfo& info = d.info;
  info.id = absl::StrCat("cuda:", ordinal);
  info.kind = DeviceKind::kCuda;
  char name[256] = {};
  size_t total = 0;
  if (CUresult r = cu.cuDeviceGetName(name, sizeof name - 1, dev); r != CUDA_SUCCESS)
    return absl::UnavailableError(absl::StrCat(info.id, ": cuDeviceGetName: ", cu.ErrorText(r)));
  if (CUresult r = cu.cuDeviceTotalMem(&total, dev); r != CUDA_SUCCESS)
    return absl::UnavailableError(absl::StrCat(info.id, ": cuDeviceTotalMem: ", cu.ErrorText(r)));
  auto attribute = [&](CUdevice_attribute a) {
    int v = 0;
    cu.cuDeviceGetAttribute(&v, a, dev);
    return static_cast<uint64_t>(std::max(v, 0));
  };
  info.name = name;
  info.total_memory = total;
  LaunchLimits& l = info.limits;
  l.max_global = {attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X), attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y),
                  attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)};
  l.max_global_total = l.max_global[0] * l.max_global[1] * l.max_global[2];
  l.max_local = {attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X), attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
                 attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)};
  l.max_local_total = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  l.max_args = 64;
  // 2 GiB - 1 on every device so far; where the driver does not say, a pitch no device
  // refuses.
  d.max_pitch = attribute(CU_DEVICE_ATTRIBUTE_MAX_PITCH);
  if (d.max_pitch == 0) d.max_pitch = uint64_t{1} << 20;
  if (attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE) == CU_COMPUTEMODE_PROHIBITED)
    return absl::UnavailableError(absl::StrCat(info.id, ": ", ComputeModeText(CU_COMPUTEMODE_PROHIBITED)));
  info.architecture = d.arch = absl::StrCat("sm_", attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                                            attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
  info.formats = {"cuda-ptx", "cuda-cubin"};
  if (nvrtc) info.formats.push_back("cuda-c");
  info.driver_version = absl::StrCat("CUDA ", cu.version() / 1000, ".", cu.version() % 1000 / 10, " driver");
  info.target = absl::StrCat(d.arch, nvrtc ? absl::StrCat("-nvrtc-", nvrtc->version()) : "");
  return d;
}

class CudaDevice;

// One session's context. Every call that reaches the device goes through Check, which
// turns a sticky error into the context's fault: from then on every method answers it.
class CudaContext : public Context {
 public:
  CudaContext(CudaDevice* device, CUcontext ctx, bool owns_ctx, uint64_t id);
  ~CudaContext() override;
  absl::Status Open();

  absl::StatusOr<Allocation> Allocate(uint64_t bytes) override;
  void Free(const Allocation& allocation) override;
  absl::Status PinHost(std::span<uint8_t> host) override;
  absl::Status Write(const Allocation& dst, uint64_t offset, std::span<const uint8_t> bytes) override;
  absl::Status Read(const Allocation& src, uint64_t offset, std::span<uint8_t> bytes) override;
  absl::Status Copy(const Allocation& dst, uint64_t dst_offset, const Allocation& src, uint64_t src_offset,
                    uint64_t bytes) override;
  absl::StatusOr<std::unique_ptr<Kernel>> Load(const ProgramSource& source,
                                               const std::filesystem::path& artifact) override;
  absl::StatusOr<std::optional<absl::Duration>> Launch(const Kernel& kernel, std::span<const ArgValue> args,
                                                       const Dim3& global, const Dim3& local, bool wait) override;
  absl::Status Synchronize() override;
  absl::StatusOr<std::unique_ptr<DeviceGraph>> Instantiate(std::span<const GraphNode> nodes,
                                                           std::span<const std::pair<size_t, size_t>> edges) override;
  bool wants_edges() const override { return true; }
  uint64_t address_space() const override { return id_; }

  const CudaLibrary& cu() const;
  // Makes this context current on the calling thread; the context's fault if it has one.
  absl::Status Bind();
  // OK for success; otherwise the error as a status naming `what`, recorded as the
  // context's fault when it is sticky.
  absl::Status Check(CUresult r, absl::string_view what);
  CUstream stream() const { return stream_; }
  CUcontext ctx() const { return ctx_; }
  uint64_t max_pitch() const;
  // Two stretches of kCopyScratchBytes of device memory that live as long as the context:
  // what a memcpy node is instantiated on (CudaGraph::Build), allocated at the first call.
  absl::StatusOr<CUdeviceptr> CopyScratch();
  static constexpr uint64_t kCopyScratchBytes = 256;
  // Records the start event, runs `submit`, and with `wait` waits and returns the time
  // between the events.
  template <typename Submit>
  absl::StatusOr<std::optional<absl::Duration>> Timed(bool wait, Submit submit);

 private:
  absl::Status Fault() const;
  // The staging schedule for a transfer at device address `address`.
  Staging StagingFor(uint64_t address, bool to_device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(staging_mu_);

  CudaDevice* const device_;
  CUcontext ctx_;
  const bool owns_ctx_;
  const uint64_t id_;
  CUstream stream_ = nullptr;
  CUevent start_ = nullptr, stop_ = nullptr;

  absl::Mutex scratch_mu_;
  CUdeviceptr copy_scratch_ ABSL_GUARDED_BY(scratch_mu_) = 0;
  mutable absl::Mutex fault_mu_;
  absl::Status fault_ ABSL_GUARDED_BY(fault_mu_);

  // Two pinned staging buffers, each with the event of the last copy that used it.
  absl::Mutex staging_mu_;
  std::array<void*, 2> staging_ ABSL_GUARDED_BY(staging_mu_) = {nullptr, nullptr};
  std::array<CUevent, 2> staged_ ABSL_GUARDED_BY(staging_mu_) = {nullptr, nullptr};
  // PinHost's ranges, registered with cuMemHostRegister until the context ends.
  PinnedRanges pinned_ ABSL_GUARDED_BY(staging_mu_);
};

class CudaDevice : public Device {
 public:
  CudaDevice(std::shared_ptr<CudaLibrary> cu, std::shared_ptr<Nvrtc> nvrtc, CUdevice dev, CudaDescription description,
             const CudaDriverOptions& options);
  ~CudaDevice() override;

  const DeviceInfo& info() const override { return info_; }
  uint64_t memory_in_use() const override { return memory_.in_use(); }
  absl::Status Compile(const ProgramSource& source, const std::filesystem::path& output) override;
  absl::StatusOr<std::unique_ptr<Context>> OpenContext(const ContextOptions& options) override;

  const CudaLibrary& cu() const { return *cu_; }
  DeviceMemory& memory() override { return memory_; }
  // The sticky fault that ended this process's use of CUDA, if any.
  absl::Status health() const override { return cu_->sticky_fault(); }
  const CudaDriverOptions& options() const { return options_; }
  uint64_t max_pitch() const { return max_pitch_; }
  // The primary context's fault: every session in it shares it.
  SharedFault& primary_fault() { return primary_fault_; }
  // A session in the primary context has closed: the last one out of a faulted primary
  // context releases it, so the next session gets a new one.
  void LeavePrimary();

 private:
  const std::shared_ptr<CudaLibrary> cu_;
  const std::shared_ptr<Nvrtc> nvrtc_;  // null: no cuda-c
  const CUdevice dev_;
  const CudaDriverOptions options_;
  const DeviceInfo info_;
  const std::string arch_;
  const uint64_t max_pitch_;
  DeviceMemory memory_;
  absl::Mutex mu_;
  CUcontext primary_ ABSL_GUARDED_BY(mu_) = nullptr;
  SharedFault primary_fault_;
  uint64_t next_context_ ABSL_GUARDED_BY(mu_) = 1;
};

class CudaKernel : public Kernel {
 public:
  CudaKernel(CudaContext* context, CUmodule module, CUfunction function, Signature signature, std::string entry,
             uint64_t max_threads)
      : context_(context),
        module_(module),
        function_(function),
        signature_(std::move(signature)),
        entry_(std::move(entry)),
        max_threads_(max_threads) {}
  // A launch of the kernel may still be queued on the session's stream (a launch without
  // wait, then the program freed; a graph of it replayed, then dropped): the module goes
  // only once that has run, as unloading code a kernel still runs is undefined. (Kernels
  // run on their own context's stream: a graph is launched on its instantiating context's.)
  ~CudaKernel() override {
    if (!context_->Bind().ok()) return;
    context_->cu().cuStreamSynchronize(context_->stream());
    context_->cu().cuModuleUnload(module_);
  }
  const Signature& signature() const override { return signature_; }
  CUfunction function() const { return function_; }

  // INVALID_ARGUMENT when a block of `local` has more threads than the kernel runs in one
  // (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: its launch bounds, or what its registers
  // allow, within the device's limit).
  absl::Status CheckBlock(const Dim3& local) const {
    return CheckBlockThreads(entry_, max_threads_, "its launch bounds or registers", local);
  }

 private:
  CudaContext* const context_;
  const CUmodule module_;
  const CUfunction function_;
  const Signature signature_;
  const std::string entry_;
  const uint64_t max_threads_;
};

// The sizes of the first `limit` parameters of `f` as its image lays them out
// (cuFuncGetParamInfo), fewer when it has fewer.
CUresult ParamSizes(const CudaLibrary& cu, CUfunction f, size_t limit, std::vector<size_t>* sizes) {
  for (size_t i = 0; i < limit; ++i) {
    size_t offset = 0, size = 0;
    const CUresult r = cu.cuFuncGetParamInfo(f, i, &offset, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last
    if (r != CUDA_SUCCESS) return r;
    sizes->push_back(size);
  }
  return CUDA_SUCCESS;
}

// Fills the launch fields of a kernel node from a node's function, dimensions and packed
// arguments.
CUDA_KERNEL_NODE_PARAMS NodeParams(CUfunction f, const Dim3& global, const Dim3& local, KernelParams& params) {
  CUDA_KERNEL_NODE_PARAMS p;
  std::memset(&p, 0, sizeof p);
  p.func = f;
  p.gridDimX = static_cast<unsigned>(global[0]);
  p.gridDimY = static_cast<unsigned>(global[1]);
  p.gridDimZ = static_cast<unsigned>(global[2]);
  p.blockDimX = static_cast<unsigned>(local[0]);
  p.blockDimY = static_cast<unsigned>(local[1]);
  p.blockDimZ = static_cast<unsigned>(local[2]);
  p.kernelParams = params.pointers();
  return p;
}

// A 1-dimensional device-to-device copy of `bytes` (pitch = width), as a memcpy node
// describes it.
CUDA_MEMCPY3D CopyParams(uint64_t dst, uint64_t src, uint64_t bytes) {
  CUDA_MEMCPY3D p;
  std::memset(&p, 0, sizeof p);
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = static_cast<CUdeviceptr>(src);
  p.srcPitch = bytes;
  p.srcHeight = 1;
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = static_cast<CUdeviceptr>(dst);
  p.dstPitch = bytes;
  p.dstHeight = 1;
  p.WidthInBytes = bytes;
  p.Height = 1;
  p.Depth = 1;
  return p;
}

// The memcpy nodes of a copy of `bytes`. A node's pitch may not pass the device's
// CU_DEVICE_ATTRIBUTE_MAX_PITCH (2 GiB - 1 on an H200), a 1-dimensional copy's pitch is
// its width, and only 1-dimensional nodes can be retargeted
// (cuGraphExecMemcpyNodeSetParams): so a copy larger than that is pieces of the largest
// power of two within it, end to end, the last one the rest.
absl::InlinedVector<CUDA_MEMCPY3D, 2> CopyPieces(uint64_t dst, uint64_t src, uint64_t bytes, uint64_t max_pitch) {
  if (bytes <= max_pitch) return {CopyParams(dst, src, bytes)};
  const uint64_t piece = std::bit_floor(max_pitch);
  absl::InlinedVector<CUDA_MEMCPY3D, 2> pieces;
  for (uint64_t at = 0; at < bytes; at += piece)
    pieces.push_back(CopyParams(dst + at, src + at, std::min(piece, bytes - at)));
  return pieces;
}

// A batch as one CUDA graph. The kernel nodes keep their packed arguments, so an update
// repacks one node's block and hands it to cuGraphExecKernelNodeSetParams; a copy is a
// memcpy node (more than one past the device's pitch: CopyPieces), updated with
// cuGraphExecMemcpyNodeSetParams. That call refuses a node whose operands at the
// instantiation have since been unmapped ("the memory operands' mappings changed"), so
// memcpy nodes are instantiated on the context's scratch, which outlives the graph, and
// retargeted to their operands at once, at any size: the engine's placeholder for a
// parameter, freed after the build, is never a node's instantiation-time operand.
class CudaGraph : public DeviceGraph {
 public:
  explicit CudaGraph(CudaContext* context) : context_(context) {}
  ~CudaGraph() override {
    if (!context_->Bind().ok()) return;
    if (exec_) context_->cu().cuGraphExecDestroy(exec_);
    if (graph_) context_->cu().cuGraphDestroy(graph_);
  }

  absl::Status Build(std::span<const GraphNode> nodes, std::span<const std::pair<size_t, size_t>> edges) {
    const CudaLibrary& cu = context_->cu();
    if (absl::Status s = context_->Check(cu.cuGraphCreate(&graph_, 0), "cuGraphCreate"); !s.ok()) return s;
    std::vector<std::vector<CUgraphNode>> after(nodes.size());
    nodes_.resize(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      Node& n = nodes_[i];
      for (auto [from, to] : edges)
        if (to == i) after[i].insert(after[i].end(), nodes_[from].handles.begin(), nodes_[from].handles.end());
      if (nodes[i].is_copy()) {
        // Instantiated on the context's scratch, then retargeted below to its operands.
        absl::StatusOr<CUdeviceptr> scratch = context_->CopyScratch();
        if (!scratch.ok()) return scratch.status();
        const uint64_t bytes = nodes[i].copy_bytes;
        for (const CUDA_MEMCPY3D& piece : CopyPieces(0, 0, bytes, context_->max_pitch())) {
          const CUDA_MEMCPY3D p = CopyParams(*scratch, *scratch + CudaContext::kCopyScratchBytes,
                                             std::min<uint64_t>(piece.WidthInBytes, CudaContext::kCopyScratchBytes));
          if (absl::Status s = context_->Check(cu.cuGraphAddMemcpyNode(&n.handles.emplace_back(), graph_,
                                                                       after[i].data(), after[i].size(), &p,
                                                                       context_->ctx()),
                                               "cuGraphAddMemcpyNode");
              !s.ok())
            return s;
        }
        n.copy = {0, 0, bytes};  // retargeted once instantiated
        continue;
      }
      const auto* kernel = static_cast<const CudaKernel*>(nodes[i].kernel);
      if (absl::Status s = kernel->CheckBlock(nodes[i].local); !s.ok()) return s;
      n.kernel = kernel;
      n.params = std::make_unique<KernelParams>(nodes[i].kernel->signature());
      n.params->Pack(nodes[i].args);
      n.global = nodes[i].global;
      n.local = nodes[i].local;
      CUDA_KERNEL_NODE_PARAMS p = NodeParams(kernel->function(), nodes[i].global, nodes[i].local, *n.params);
      if (absl::Status s = context_->Check(
              cu.cuGraphAddKernelNode(&n.handles.emplace_back(), graph_, after[i].data(), after[i].size(), &p),
              "cuGraphAddKernelNode");
          !s.ok())
        return s;
    }
    if (absl::Status s = context_->Check(cu.cuGraphInstantiateWithFlags(&exec_, graph_, 0), "cuGraphInstantiate");
        !s.ok())
      return s;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].is_copy())
        if (absl::Status s = Update(i, nodes[i].args, {}, {}); !s.ok()) return s;
    return absl::OkStatus();
  }

  absl::Status Update(size_t node, std::span<const ArgValue> args, const Dim3& global, const Dim3& local) override {
    Node& n = nodes_[node];
    // What the node holds is recorded only once the driver has taken it: after a failed
    // update the next one is sent again, not skipped as unchanged.
    if (!n.params) {
      if (n.copy[0] == args[0].address && n.copy[1] == args[1].address) return absl::OkStatus();
      if (absl::Status s = context_->Bind(); !s.ok()) return s;
      const auto pieces = CopyPieces(args[0].address, args[1].address, n.copy[2], context_->max_pitch());
      for (size_t k = 0; k < pieces.size(); ++k)
        if (absl::Status s = context_->Check(
                context_->cu().cuGraphExecMemcpyNodeSetParams(exec_, n.handles[k], &pieces[k], context_->ctx()),
                "cuGraphExecMemcpyNodeSetParams");
            !s.ok())
          return s;
      n.copy = {args[0].address, args[1].address, n.copy[2]};
      return absl::OkStatus();
    }
    if (absl::Status s = n.kernel->CheckBlock(local); !s.ok()) return s;  // before anything changes
    const bool changed = n.params->Pack(args) || n.stale || n.global != global || n.local != local;
    if (!changed) return absl::OkStatus();  // the instantiated node already has these values
    n.stale = true;  // the packed block now differs from the node until the driver takes it
    if (absl::Status s = context_->Bind(); !s.ok()) return s;
    CUDA_KERNEL_NODE_PARAMS p = NodeParams(n.kernel->function(), global, local, *n.params);
    absl::Status s = context_->Check(context_->cu().cuGraphExecKernelNodeSetParams(exec_, n.handles[0], &p),
                                     "cuGraphExecKernelNodeSetParams");
    if (s.ok()) {
      n.global = global;
      n.local = local;
      n.stale = false;
    }
    return s;
  }

  absl::StatusOr<std::optional<absl::Duration>> Launch(bool wait) override {
    return context_->Timed(wait, [&] { return context_->cu().cuGraphLaunch(exec_, context_->stream()); });
  }

 private:
  struct Node {
    const CudaKernel* kernel = nullptr;  // null: a copy
    // The kernel's node, or the copy's: one per piece of it (CopyPieces).
    absl::InlinedVector<CUgraphNode, 2> handles;
    std::unique_ptr<KernelParams> params;  // heap: the node's kernelParams point into it; null: a copy
    Dim3 global, local;                    // as the instantiated node has them
    bool stale = false;                    // params packed that the node has not taken
    std::array<uint64_t, 3> copy{};        // a copy's destination, source and bytes
  };
  CudaContext* const context_;
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  std::vector<Node> nodes_;
};

CudaContext::CudaContext(CudaDevice* device, CUcontext ctx, bool owns_ctx, uint64_t id)
    : device_(device), ctx_(ctx), owns_ctx_(owns_ctx), id_(id) {}

const CudaLibrary& CudaContext::cu() const { return device_->cu(); }
uint64_t CudaContext::max_pitch() const { return device_->max_pitch(); }

absl::Status CudaContext::Open() {
  const CudaLibrary& cu = device_->cu();
  if (absl::Status s = Bind(); !s.ok()) return s;
  if (absl::Status s = Check(cu.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate"); !s.ok()) return s;
  for (CUevent* e : {&start_, &stop_})
    if (absl::Status s = Check(cu.cuEventCreate(e, CU_EVENT_DEFAULT), "cuEventCreate"); !s.ok()) return s;
  absl::MutexLock lock(&staging_mu_);
  for (int i = 0; i < 2; ++i) {
    if (absl::Status s = Check(cu.cuMemHostAlloc(&staging_[i], device_->options().staging_bytes, 0), "cuMemHostAlloc");
        !s.ok())
      return s;
    if (absl::Status s = Check(cu.cuEventCreate(&staged_[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate"); !s.ok())
      return s;
    // Recorded once, so that the first wait on a buffer has something to wait for.
    if (absl::Status s = Check(cu.cuEventRecord(staged_[i], stream_), "cuEventRecord"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<CUdeviceptr> CudaContext::CopyScratch() {
  absl::MutexLock lock(&scratch_mu_);
  if (copy_scratch_ == 0)
    if (absl::Status s = Check(cu().cuMemAlloc(&copy_scratch_, 2 * kCopyScratchBytes), "cuMemAlloc"); !s.ok())
      return s;
  return copy_scratch_;
}

CudaContext::~CudaContext() {
  const CudaLibrary& cu = device_->cu();
  if (cu.cuCtxSetCurrent(ctx_) == CUDA_SUCCESS) {
    if (stream_) cu.cuStreamSynchronize(stream_);
    {
      absl::MutexLock lock(&scratch_mu_);
      if (copy_scratch_) cu.cuMemFree(copy_scratch_);
    }
    absl::MutexLock lock(&staging_mu_);
    for (std::span<uint8_t> host : pinned_.ranges()) cu.cuMemHostUnregister(host.data());
    for (int i = 0; i < 2; ++i) {
      if (staging_[i]) cu.cuMemFreeHost(staging_[i]);
      if (staged_[i]) cu.cuEventDestroy(staged_[i]);
    }
    for (CUevent e : {start_, stop_})
      if (e) cu.cuEventDestroy(e);
    if (stream_) cu.cuStreamDestroy(stream_);
  }
  if (owns_ctx_) {
    cu.cuCtxDestroy(ctx_);
  } else {
    device_->LeavePrimary();
  }
}

absl::Status CudaContext::Fault() const {
  if (!owns_ctx_)
    if (absl::Status s = device_->primary_fault().fault(); !s.ok()) return s;
  {
    absl::MutexLock lock(&fault_mu_);
    if (!fault_.ok()) return fault_;
  }
  return device_->cu().sticky_fault();  // another session's kernel fault
}

absl::Status CudaContext::Bind() {
  if (absl::Status s = Fault(); !s.ok()) return s;
  return Check(device_->cu().cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
}

absl::Status CudaContext::Check(CUresult r, absl::string_view what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  const std::string text = device_->cu().ErrorText(r);
  const std::string& id = device_->info().id;
  const DeviceErrorKind kind = Classify(r);
  if (kind != DeviceErrorKind::kFault) return DeviceError(kind, id, what, text);
  // A sticky error is not the context's alone: every CUDA context of the process, new
  // ones too, answers it from now on (as seen on an H200: another session's module load
  // and every later cuCtxCreate returned CUDA_ERROR_ILLEGAL_ADDRESS).
  if (r != CUDA_ERROR_CONTEXT_IS_DESTROYED)  // the one fault that is this context's alone
    CudaLibrary::RecordStickyFault(absl::FailedPreconditionError(absl::StrCat(
      "cuda: a kernel fault on ", id, " (", what, ": ", text,
      ") left every CUDA context of this process unusable, as CUDA's sticky errors do; CUDA devices serve "
      "again once replayd restarts")));
  if (!owns_ctx_)
    return device_->primary_fault().Fail(absl::FailedPreconditionError(
        absl::StrCat(id, ": a kernel fault lost the primary context, which every session on the device shares (", what,
                     ": ", text, "); close the session")));
  absl::MutexLock lock(&fault_mu_);
  if (fault_.ok())
    fault_ = absl::FailedPreconditionError(
        absl::StrCat(id, ": a kernel fault lost this session's context (", what, ": ", text, "); close the session"));
  return fault_;
}

template <typename Submit>
absl::StatusOr<std::optional<absl::Duration>> CudaContext::Timed(bool wait, Submit submit) {
  const CudaLibrary& cu = device_->cu();
  if (absl::Status s = Bind(); !s.ok()) return s;
  if (wait)
    if (absl::Status s = Check(cu.cuEventRecord(start_, stream_), "cuEventRecord"); !s.ok()) return s;
  if (absl::Status s = Check(submit(), "launch"); !s.ok()) return s;
  if (!wait) return std::optional<absl::Duration>();
  if (absl::Status s = Check(cu.cuEventRecord(stop_, stream_), "cuEventRecord"); !s.ok()) return s;
  if (absl::Status s = Check(cu.cuEventSynchronize(stop_), "kernel"); !s.ok()) return s;
  float ms = 0;
  if (absl::Status s = Check(cu.cuEventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime"); !s.ok()) return s;
  return std::optional<absl::Duration>(absl::Microseconds(static_cast<double>(ms) * 1000.0));
}

absl::StatusOr<Allocation> CudaContext::Allocate(uint64_t bytes) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  if (absl::Status s = device_->memory().Reserve(device_->info().id, bytes); !s.ok()) return s;
  const CudaLibrary& cu = device_->cu();
  CUdeviceptr p = 0;
  absl::Status s = Check(cu.cuMemAlloc(&p, bytes), absl::StrCat("cuMemAlloc of ", bytes, " bytes"));
  if (s.ok()) s = Check(cu.cuMemsetD8Async(p, 0, bytes, stream_), "cuMemsetD8Async");
  if (!s.ok()) {
    if (p) cu.cuMemFree(p);
    device_->memory().Release(bytes);
    return s;
  }
  return Allocation{static_cast<uint64_t>(p), bytes};
}

void CudaContext::Free(const Allocation& a) {
  const CudaLibrary& cu = device_->cu();
  // Pending work may still use the memory; a faulted context frees nothing it could wait for.
  if (Bind().ok()) {
    cu.cuStreamSynchronize(stream_);
    cu.cuMemFree(static_cast<CUdeviceptr>(a.address));
  }
  device_->memory().Release(a.bytes);
}

Staging CudaContext::StagingFor(uint64_t address, bool to_device) {
  const CudaLibrary& cu = device_->cu();
  Staging s;
  s.buffers = staging_;
  s.chunk = device_->options().staging_bytes;
  s.wait = [this, &cu](int i) { return Check(cu.cuEventSynchronize(staged_[i]), "transfer"); };
  s.copy = [this, &cu, address, to_device](int i, uint64_t offset, uint64_t n) {
    CUresult r = to_device ? cu.cuMemcpyHtoDAsync(address + offset, staging_[i], n, stream_)
                           : cu.cuMemcpyDtoHAsync(staging_[i], address + offset, n, stream_);
    if (absl::Status st = Check(r, to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync"); !st.ok()) return st;
    return Check(cu.cuEventRecord(staged_[i], stream_), "cuEventRecord");
  };
  return s;
}

absl::Status CudaContext::PinHost(std::span<uint8_t> host) {
  if (host.empty()) return absl::OkStatus();
  if (absl::Status s = Bind(); !s.ok()) return s;
  absl::MutexLock lock(&staging_mu_);
  if (absl::Status s = Check(device_->cu().cuMemHostRegister(host.data(), host.size(), 0), "cuMemHostRegister");
      !s.ok())
    return s;
  pinned_.Add(host);
  return absl::OkStatus();
}

// From pinned memory the copy is one DMA, waited for: the caller may reuse the bytes once
// Write returns.
absl::Status CudaContext::Write(const Allocation& dst, uint64_t offset, std::span<const uint8_t> bytes) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  absl::MutexLock lock(&staging_mu_);
  if (pinned_.Hold(bytes.data(), bytes.size())) {
    const CUresult r = device_->cu().cuMemcpyHtoDAsync(dst.address + offset, bytes.data(), bytes.size(), stream_);
    if (absl::Status s = Check(r, "cuMemcpyHtoDAsync"); !s.ok()) return s;
    return Check(device_->cu().cuStreamSynchronize(stream_), "transfer");
  }
  return StagedWrite(StagingFor(dst.address + offset, true), bytes);
}

absl::Status CudaContext::Read(const Allocation& src, uint64_t offset, std::span<uint8_t> bytes) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  absl::MutexLock lock(&staging_mu_);
  if (pinned_.Hold(bytes.data(), bytes.size())) {
    const CUresult r = device_->cu().cuMemcpyDtoHAsync(bytes.data(), src.address + offset, bytes.size(), stream_);
    if (absl::Status s = Check(r, "cuMemcpyDtoHAsync"); !s.ok()) return s;
    return Check(device_->cu().cuStreamSynchronize(stream_), "transfer");
  }
  return StagedRead(StagingFor(src.address + offset, false), bytes);
}

absl::Status CudaContext::Copy(const Allocation& dst, uint64_t dst_offset, const Allocation& src, uint64_t src_offset,
                               uint64_t bytes) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  return Check(device_->cu().cuMemcpyDtoDAsync(dst.address + dst_offset, src.address + src_offset, bytes, stream_),
               "cuMemcpyDtoDAsync");
}

absl::StatusOr<std::unique_ptr<Kernel>> CudaContext::Load(const ProgramSource& source,
                                                          const std::filesystem::path& artifact) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  absl::StatusOr<ModuleArtifact> module_artifact = ReadModuleArtifact(artifact);
  if (!module_artifact.ok()) return module_artifact.status();
  // The loader takes no size: an ELF image (a cubin) is checked to lie within its bytes,
  // PTX is text that c_str() ends.
  if (absl::StartsWith(module_artifact->image, ELFMAG))
    if (absl::Status s = CheckElfImage(module_artifact->image, kElfMachineCuda, source.format); !s.ok()) return s;
  const CudaLibrary& cu = device_->cu();
  std::string error_log(16 << 10, '\0'), info_log(16 << 10, '\0');
  CUjit_option keys[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER,
                         CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log.data(), reinterpret_cast<void*>(error_log.size()), info_log.data(),
                    reinterpret_cast<void*>(info_log.size())};
  CUmodule module = nullptr;
  CUresult r = cu.cuModuleLoadDataEx(&module, module_artifact->image.c_str(), 4, keys, values);
  if (r != CUDA_SUCCESS) {
    error_log.resize(std::strlen(error_log.c_str()));
    if (r == CUDA_ERROR_INVALID_PTX || r == CUDA_ERROR_INVALID_IMAGE || r == CUDA_ERROR_NO_BINARY_FOR_GPU ||
        r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION || r == CUDA_ERROR_JIT_COMPILATION_DISABLED)
      return absl::InvalidArgumentError(absl::StrCat(source.format, " program ", source.entry, " does not load on ",
                                                     device_->info().id, " (", cu.ErrorText(r), "):\n", error_log));
    return Check(r, "cuModuleLoadDataEx");
  }
  CUfunction function = nullptr;
  r = cu.cuModuleGetFunction(&function, module, module_artifact->entry.c_str());
  if (r != CUDA_SUCCESS) {
    cu.cuModuleUnload(module);
    if (r == CUDA_ERROR_NOT_FOUND)
      return absl::InvalidArgumentError(
          absl::StrCat(source.format, " program has no kernel named ", module_artifact->entry));
    return Check(r, "cuModuleGetFunction");
  }
  // The kernel's parameters as its image lays them out, one more than the signature's
  // when it takes more.
  std::vector<size_t> taken;
  r = ParamSizes(cu, function, source.signature.params.size() + 1, &taken);
  const absl::Status params = r == CUDA_SUCCESS
                                  ? CheckParamSizes(source.format, module_artifact->entry, source.signature, taken)
                                  : absl::OkStatus();
  if (r != CUDA_SUCCESS || !params.ok()) {
    cu.cuModuleUnload(module);
    return r != CUDA_SUCCESS ? Check(r, "cuFuncGetParamInfo") : params;
  }
  int max_threads = 0;
  r = cu.cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function);
  if (r != CUDA_SUCCESS || max_threads <= 0) {
    cu.cuModuleUnload(module);
    return Check(r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : r, "cuFuncGetAttribute");
  }
  return std::make_unique<CudaKernel>(this, module, function, source.signature, module_artifact->entry,
                                      static_cast<uint64_t>(max_threads));
}

absl::StatusOr<std::optional<absl::Duration>> CudaContext::Launch(const Kernel& kernel, std::span<const ArgValue> args,
                                                                  const Dim3& global, const Dim3& local, bool wait) {
  // The driver copies the arguments at the launch call, so one block per thread serves.
  thread_local KernelParams params;
  params.Layout(kernel.signature());
  params.Pack(args);
  const auto& cuda_kernel = static_cast<const CudaKernel&>(kernel);
  if (absl::Status s = cuda_kernel.CheckBlock(local); !s.ok()) return s;
  const CUfunction f = cuda_kernel.function();
  return Timed(wait, [&] {
    return device_->cu().cuLaunchKernel(f, static_cast<unsigned>(global[0]), static_cast<unsigned>(global[1]),
                                        static_cast<unsigned>(global[2]), static_cast<unsigned>(local[0]),
                                        static_cast<unsigned>(local[1]), static_cast<unsigned>(local[2]), 0, stream_,
                                        params.pointers(), nullptr);
  });
}

absl::Status CudaContext::Synchronize() {
  if (absl::Status s = Bind(); !s.ok()) return s;
  return Check(device_->cu().cuStreamSynchronize(stream_), "kernel");
}

absl::StatusOr<std::unique_ptr<DeviceGraph>> CudaContext::Instantiate(
    std::span<const GraphNode> nodes, std::span<const std::pair<size_t, size_t>> edges) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  auto graph = std::make_unique<CudaGraph>(this);
  if (absl::Status s = graph->Build(nodes, edges); !s.ok()) return s;
  return graph;
}

CudaDevice::CudaDevice(std::shared_ptr<CudaLibrary> cu, std::shared_ptr<Nvrtc> nvrtc, CUdevice dev,
                       CudaDescription description, const CudaDriverOptions& options)
    : cu_(std::move(cu)),
      nvrtc_(std::move(nvrtc)),
      dev_(dev),
      options_(options),
      info_(std::move(description.info)),
      arch_(std::move(description.arch)),
      max_pitch_(description.max_pitch),
      memory_(info_.total_memory) {}

CudaDevice::~CudaDevice() {
  absl::MutexLock lock(&mu_);
  if (primary_) cu_->cuDevicePrimaryCtxRelease(dev_);
}

absl::Status CudaDevice::Compile(const ProgramSource& source, const std::filesystem::path& output) {
  absl::StatusOr<ModuleArtifact> artifact = BuildCudaModule(source, nvrtc_.get(), arch_);
  if (!artifact.ok()) return artifact.status();
  return WriteModuleArtifact(*artifact, output);
}

void CudaDevice::LeavePrimary() {
  primary_fault_.Leave([this] {
    absl::MutexLock lock(&mu_);
    if (primary_) cu_->cuDevicePrimaryCtxRelease(dev_);  // its last use: destroyed
    primary_ = nullptr;
  });
}

absl::StatusOr<std::unique_ptr<Context>> CudaDevice::OpenContext(const ContextOptions&) {
  const bool primary = options_.context == CudaContextPolicy::kPrimary;
  CUcontext ctx = nullptr;
  uint64_t id = 0;
  CUresult r = CUDA_SUCCESS;
  if (absl::Status s = cu_->sticky_fault(); !s.ok()) return absl::UnavailableError(s.message());
  if (primary)
    if (absl::Status s = primary_fault_.Join(); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    id = next_context_++;
    if (!primary) {
      r = cu_->cuCtxCreate(&ctx, nullptr, CU_CTX_SCHED_AUTO, dev_);
      // cuCtxCreate pushes the new context on this thread's stack; every use binds it with
      // cuCtxSetCurrent, so it comes off again and the stack stays as the thread had it.
      CUcontext popped = nullptr;
      if (r == CUDA_SUCCESS && (r = cu_->cuCtxPopCurrent(&popped)) != CUDA_SUCCESS) cu_->cuCtxDestroy(ctx);
    } else if (!primary_ && (r = cu_->cuDevicePrimaryCtxRetain(&primary_, dev_)) != CUDA_SUCCESS) {
      primary_ = nullptr;
    }
    if (primary) ctx = primary_;
  }
  if (r != CUDA_SUCCESS) {
    if (primary) LeavePrimary();
    std::string why =
        absl::StrCat(info_.id, primary ? ": cuDevicePrimaryCtxRetain: " : ": cuCtxCreate: ", cu_->ErrorText(r));
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return absl::ResourceExhaustedError(why);
    // The mode now: nvidia-smi may have changed it since discovery.
    int mode = CU_COMPUTEMODE_DEFAULT;
    if ((r == CUDA_ERROR_DEVICE_UNAVAILABLE || r == CUDA_ERROR_UNKNOWN) &&
        cu_->cuDeviceGetAttribute(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev_) == CUDA_SUCCESS &&
        mode != CU_COMPUTEMODE_DEFAULT)
      absl::StrAppend(&why, "; ", ComputeModeText(mode));
    return absl::UnavailableError(why);
  }
  // From here the context's destructor leaves the primary context.
  auto context = std::make_unique<CudaContext>(this, ctx, !primary, id);
  if (absl::Status s = context->Open(); !s.ok()) return s;
  return context;
}

}  // namespace

std::vector<std::unique_ptr<Device>> CudaDriver::Discover() {
  std::vector<std::unique_ptr<Device>> devices;
  unavailable_.clear();
  absl::StatusOr<std::unique_ptr<CudaLibrary>> loaded = CudaLibrary::Load();
  if (!loaded.ok()) {
    unavailable_ = std::string(loaded.status().message());
    return devices;
  }
  std::shared_ptr<CudaLibrary> cu = std::move(*loaded);
  std::shared_ptr<Nvrtc> nvrtc;
  cuda_c_unavailable_.clear();
  if (!options_.compile) {
    cuda_c_unavailable_ = "not asked to compile";
  } else if (absl::StatusOr<std::unique_ptr<Nvrtc>> n = Nvrtc::Load(); n.ok()) {
    nvrtc = std::move(*n);
  } else {
    cuda_c_unavailable_ = std::string(n.status().message());
  }
  int count = 0;
  if (CUresult r = cu->cuDeviceGetCount(&count); r != CUDA_SUCCESS) {
    unavailable_ = absl::StrCat("cuDeviceGetCount: ", cu->ErrorText(r));
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    if (CUresult r = cu->cuDeviceGet(&dev, i); r != CUDA_SUCCESS) {
      absl::StrAppend(&unavailable_, unavailable_.empty() ? "" : "; ", "cuDeviceGet(", i, "): ", cu->ErrorText(r));
      continue;
    }
    absl::StatusOr<CudaDescription> description = Describe(*cu, nvrtc.get(), dev, i);
    if (!description.ok()) {
      absl::StrAppend(&unavailable_, unavailable_.empty() ? "" : "; ", description.status().message());
      continue;
    }
    devices.push_back(std::make_unique<CudaDevice>(cu, nvrtc, dev, std::move(*description), options_));
  }
  if (count == 0) unavailable_ = "the NVIDIA driver reports no devices";
  if (!devices.empty()) unavailable_.clear();
  if (devices.empty()) cuda_c_unavailable_.clear();
  return devices;
}

}  // namespace replayd

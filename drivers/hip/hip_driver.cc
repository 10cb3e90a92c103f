#include "drivers/hip/hip_driver.h"

#include <elf.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "drivers/amdgpu_metadata.h"
#include "drivers/device_error.h"
#include "drivers/device_memory.h"
#include "drivers/elf_image.h"
#include "drivers/hip/hip_library.h"
#include "drivers/hip/hip_program.h"
#include "drivers/kernel_params.h"
#include "drivers/module_artifact.h"
#include "drivers/shared_fault.h"
#include "drivers/staging.h"

namespace replayd {

absl::StatusOr<HipDeviceGraph> ParseHipDeviceGraph(absl::string_view name) {
  if (name == "auto") return HipDeviceGraph::kAuto;
  if (name == "graph") return HipDeviceGraph::kGraph;
  if (name == "stream") return HipDeviceGraph::kStream;
  return absl::InvalidArgumentError(absl::StrCat("HIP device graph \"", name, "\" is not auto, graph or stream"));
}

absl::string_view HipDeviceGraphName(HipDeviceGraph graph) {
  switch (graph) {
    case HipDeviceGraph::kGraph:
      return "graph";
    case HipDeviceGraph::kStream:
      return "stream";
    case HipDeviceGraph::kAuto:
      break;
  }
  return "auto";
}

namespace {

// A fault loses the device's state, for every session: they share one address space.
// (ROCm itself aborts the process on a GPU memory fault; these are the codes HIP defines
// for one, which other runtimes or versions may return.) hipErrorLaunchFailure is not
// one: ROCm returns it only when it refuses a launch (a block past the kernel's launch
// bounds, in ihipLaunchKernel_validate), before anything runs.
DeviceErrorKind Classify(hipError_t e) {
  switch (e) {
    case hipErrorIllegalAddress:
    case hipErrorAssert:
    case hipErrorECCNotCorrectable:
      return DeviceErrorKind::kFault;
    case hipErrorOutOfMemory:
      return DeviceErrorKind::kOutOfMemory;
    case hipErrorInvalidValue:
    case hipErrorLaunchOutOfResources:
    case hipErrorInvalidConfiguration:
    case hipErrorLaunchFailure:
      return DeviceErrorKind::kBadRequest;
    default:
      return DeviceErrorKind::kOther;
  }
}

struct HipDescription {
  DeviceInfo info;
  int ordinal = 0;
  std::string target;   // the full gfx target for hiprtc, "gfx90a:sramecc+:xnack-"
  bool graphs = false;  // device graphs as hipGraphs
};

absl::StatusOr<HipDescription> Describe(const HipLibrary& hip, int ordinal, const HipDriverOptions& options) {
  HipDescription d;
  d.ordinal = ordinal;
  DeviceInfo& info = d.info;
  info.id = absl::StrCat("hip:", ordinal);
  info.kind = DeviceKind::kHip;
  hipDeviceProp_t props{};
  if (hipError_t e = hip.hipGetDeviceProperties(&props, ordinal); e != hipSuccess)
    return absl::UnavailableError(absl::StrCat(info.id, ": hipGetDeviceProperties: ", hip.ErrorText(e)));
  props.name[sizeof props.name - 1] = '\0';
  props.gcnArchName[sizeof props.gcnArchName - 1] = '\0';
  info.name = props.name;
  info.total_memory = props.totalGlobalMem;
  auto positive = [](int v) { return static_cast<uint64_t>(std::max(v, 0)); };
  LaunchLimits& l = info.limits;
  l.max_global = {positive(props.maxGridSize[0]), positive(props.maxGridSize[1]), positive(props.maxGridSize[2])};
  l.max_global_total = l.max_global[0] * l.max_global[1] * l.max_global[2];
  l.max_local = {positive(props.maxThreadsDim[0]), positive(props.maxThreadsDim[1]), positive(props.maxThreadsDim[2])};
  l.max_local_total = positive(props.maxThreadsPerBlock);
  l.max_args = 64;
  d.target = props.gcnArchName;
  info.architecture = d.target.substr(0, d.target.find(':'));
  info.formats = {"hip-hsaco"};
  if (hip.has_hiprtc()) info.formats.push_back("hip-c");
  int runtime = 0;
  (void)hip.hipRuntimeGetVersion(&runtime);
  info.driver_version = absl::StrCat("HIP ", runtime / 10000000, ".", runtime / 100000 % 100, " runtime");
  int rtc_major = 0, rtc_minor = 0;
  if (hip.has_hiprtc()) hip.hiprtcVersion(&rtc_major, &rtc_minor);
  info.target = absl::StrCat(d.target, "-hiprtc-", rtc_major, ".", rtc_minor);
  d.graphs = options.device_graph == HipDeviceGraph::kGraph ||
             (options.device_graph == HipDeviceGraph::kAuto && runtime / 10000000 >= 6);
  return d;
}

class HipDevice;

// One session's stream on the device, with its events and staging buffers.
class HipContext : public Context {
 public:
  HipContext(HipDevice* device, uint64_t id) : device_(device), id_(id) {}
  ~HipContext() override;
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
  bool wants_edges() const override;
  uint64_t address_space() const override { return id_; }

  const HipLibrary& hip() const;
  const HipDriverOptions& options() const;
  // The device's memory as the daemon accounts it, and the device's id for its messages.
  DeviceMemory& device_memory();
  const std::string& device_id() const;
  absl::Status Bind();
  absl::Status Check(hipError_t e, absl::string_view what);
  hipStream_t stream() const { return stream_; }
  template <typename Submit>
  absl::StatusOr<std::optional<absl::Duration>> Timed(bool wait, Submit submit);
  // The staging schedule for a transfer at device address `address`.
  Staging StagingFor(uint64_t address, bool to_device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(staging_mu_);
  // Launches one prepared node on the stream.
  hipError_t LaunchNode(hipFunction_t f, const Dim3& global, const Dim3& local, KernelParams& params);

 private:
  HipDevice* const device_;
  const uint64_t id_;
  hipStream_t stream_ = nullptr;
  hipEvent_t start_ = nullptr, stop_ = nullptr;
  absl::Mutex staging_mu_;
  std::array<void*, 2> staging_ ABSL_GUARDED_BY(staging_mu_) = {nullptr, nullptr};
  std::array<hipEvent_t, 2> staged_ ABSL_GUARDED_BY(staging_mu_) = {nullptr, nullptr};
  // PinHost's ranges, registered with hipHostRegister until the context ends.
  PinnedRanges pinned_ ABSL_GUARDED_BY(staging_mu_);
};

class HipDevice : public Device {
 public:
  HipDevice(std::shared_ptr<HipLibrary> hip, HipDescription description, const HipDriverOptions& options)
      : hip_(std::move(hip)), d_(std::move(description)), options_(options), memory_(d_.info.total_memory) {}

  const DeviceInfo& info() const override { return d_.info; }
  uint64_t memory_in_use() const override { return memory_.in_use(); }
  // A fault loses the device's state for every session until the last one leaves and
  // resets it; an executor hosting the device (its sessions all one tenant's) ends instead.
  absl::Status health() const override { return fault_.fault(); }
  absl::Status Compile(const ProgramSource& source, const std::filesystem::path& output) override {
    absl::StatusOr<ModuleArtifact> artifact = BuildHipModule(source, *hip_, d_.target);
    if (!artifact.ok()) return artifact.status();
    return WriteModuleArtifact(*artifact, output);
  }
  absl::StatusOr<std::unique_ptr<Context>> OpenContext(const ContextOptions&) override {
    if (absl::Status s = fault_.Join(); !s.ok()) return s;
    uint64_t id;
    {
      absl::MutexLock lock(&mu_);
      id = next_context_++;
    }
    // From here the context's destructor leaves the device.
    auto context = std::make_unique<HipContext>(this, id);
    if (absl::Status s = context->Open(); !s.ok()) return s;
    return context;
  }

  const HipLibrary& hip() const { return *hip_; }
  int ordinal() const { return d_.ordinal; }
  bool graphs() const { return d_.graphs; }
  DeviceMemory& memory() override { return memory_; }
  const HipDriverOptions& options() const { return options_; }

  // The device's fault: sessions share its address space, so one fault is every session's.
  absl::Status fault() const { return fault_.fault(); }
  absl::Status Fail(absl::string_view what, const std::string& text) {
    return fault_.Fail(absl::FailedPreconditionError(absl::StrCat(
        d_.info.id, ": a kernel fault lost the device's state (", what, ": ", text, "); close the session")));
  }
  // A session has closed: the last one out of a faulted device resets it.
  void Leave() {
    fault_.Leave([this] {
      if (hip_->hipSetDevice(d_.ordinal) == hipSuccess) (void)hip_->hipDeviceReset();
    });
  }

 private:
  const std::shared_ptr<HipLibrary> hip_;
  const HipDescription d_;
  const HipDriverOptions options_;
  DeviceMemory memory_;
  mutable absl::Mutex mu_;
  uint64_t next_context_ ABSL_GUARDED_BY(mu_) = 1;
  SharedFault fault_;
};

class HipKernel : public Kernel {
 public:
  HipKernel(HipContext* context, std::unique_ptr<const std::string> image, hipModule_t module,
            hipFunction_t function, Signature signature, std::string entry, uint64_t max_threads,
            uint64_t kernarg_bytes)
      : context_(context),
        image_(std::move(image)),
        module_(module),
        function_(function),
        signature_(std::move(signature)),
        entry_(std::move(entry)),
        max_threads_(max_threads),
        kernarg_bytes_(kernarg_bytes) {}
  // As a CUDA kernel's (cuda_driver.cc): the module goes only once a launch of it still
  // queued on the session's stream has run.
  ~HipKernel() override {
    if (!context_->Bind().ok()) return;
    (void)context_->hip().hipStreamSynchronize(context_->stream());
    (void)context_->hip().hipModuleUnload(module_);
  }
  const Signature& signature() const override { return signature_; }
  hipFunction_t function() const { return function_; }
  // The bytes of argument segment the runtime allocates for a launch of the kernel, and
  // for each update of a graph's node of it.
  uint64_t kernarg_bytes() const { return kernarg_bytes_; }

  // INVALID_ARGUMENT when a block of `local` has more work-items than the kernel's code
  // object allows (its metadata's .max_flat_workgroup_size: its launch bounds), or when
  // a dimension's work-items (blocks times the block's) reach 2^32, which HIP does not
  // launch: ROCm refuses that at a launch but truncates it at a graph node's update.
  absl::Status CheckLaunch(const Dim3& global, const Dim3& local) const {
    if (absl::Status s = CheckBlockThreads(entry_, max_threads_, "its launch bounds", local); !s.ok()) return s;
    for (int d = 0; d < 3; ++d)
      if (global[d] * local[d] >= (uint64_t{1} << 32))
        return absl::InvalidArgumentError(absl::StrCat("kernel ", entry_, ": global ", global[d], " x local ",
                                                       local[d], " in dimension ", d,
                                                       " is 2^32 work-items or more, which HIP does not launch"));
    return absl::OkStatus();
  }

 private:
  HipContext* const context_;
  // The code object the module was loaded from: the runtime keeps a pointer to it (for
  // debuggers and profilers) until the module is unloaded.
  const std::unique_ptr<const std::string> image_;
  const hipModule_t module_;
  const hipFunction_t function_;
  const Signature signature_;
  const std::string entry_;
  const uint64_t max_threads_;
  const uint64_t kernarg_bytes_;
};

// A batch's nodes with their packed arguments, patched in place: the stream replay runs
// them in order; the hipGraph form hands each update to hipGraphExecKernelNodeSetParams
// (a copy node to hipGraphExecMemcpyNodeSetParams1D).
//
// ROCm's graph exec takes a new argument segment (the kernel's .kernarg_segment_size, at
// an alignment of 128 bytes at least) for each kernel node update, and one for each copy
// node update (its copy runs as a blit kernel whose packets are captured again), and
// gives none back before the exec is destroyed (rocm-systems#10713): a graph replayed
// with a new variable value at every decode step would grow into the device's memory
// until the runtime fails (ROCm 7.2 writes through a null pointer then,
// rocm-systems#10021). So once the updates of an exec have taken more
// than --hip_graph_kernarg_bytes, the next launch first replaces the graph and its exec by
// new ones built from every node's current values. (Not an instantiation of the same
// graph given the values again: its copy nodes are on the engine's placeholder, freed
// once the batch was built, and hipGraphKernelNodeSetParams kept the caller's pointer on
// ROCm 6.3, ROCm/clr#138.)
class HipBatch : public DeviceGraph {
 public:
  HipBatch(HipContext* context, std::span<const GraphNode> nodes) : context_(context) {
    nodes_.resize(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      Node& n = nodes_[i];
      if (nodes[i].is_copy()) {
        n.copy = {nodes[i].args[0].address, nodes[i].args[1].address, nodes[i].copy_bytes};
        continue;
      }
      n.kernel = static_cast<const HipKernel*>(nodes[i].kernel);
      n.function = n.kernel->function();
      n.params = std::make_unique<KernelParams>(nodes[i].kernel->signature());
      n.params->Pack(nodes[i].args);
      n.global = nodes[i].global;
      n.local = nodes[i].local;
    }
    for (const Node& n : nodes_) segments_ += n.params ? n.kernel->kernarg_bytes() : kCopyKernargBytes;
  }
  ~HipBatch() override {
    if (context_->Bind().ok()) {
      // ROCm 6.0 and 6.1 delete an exec at once, a launch of it still queued or not.
      if (exec_) (void)context_->hip().hipStreamSynchronize(context_->stream());
      if (exec_) (void)context_->hip().hipGraphExecDestroy(exec_);
      if (graph_) (void)context_->hip().hipGraphDestroy(graph_);
    }
    if (reserved_) context_->device_memory().Release(reserved_);
  }

  // Builds the hipGraph form.
  absl::Status BuildGraph(std::span<const std::pair<size_t, size_t>> edges) {
    edges_.assign(edges.begin(), edges.end());
    return Build();
  }

  absl::Status Update(size_t node, std::span<const ArgValue> args, const Dim3& global, const Dim3& local) override {
    Node& n = nodes_[node];
    // In graph form a node the driver has not taken stays stale: the next update sends it
    // again instead of skipping it as unchanged.
    bool changed;
    if (!n.params) {
      changed = n.copy[0] != args[0].address || n.copy[1] != args[1].address || n.stale;
      n.copy[0] = args[0].address;
      n.copy[1] = args[1].address;
    } else {
      if (absl::Status s = n.kernel->CheckLaunch(global, local); !s.ok()) return s;  // before anything changes
      changed = n.params->Pack(args) || n.stale || n.global != global || n.local != local;
      n.global = global;
      n.local = local;
    }
    if (!exec_ || !changed) return absl::OkStatus();
    n.stale = true;
    if (absl::Status s = context_->Bind(); !s.ok()) return s;
    // The segments updates may take before the next rebuild, reserved at the first.
    if (!updates_reserved_) {
      const uint64_t updates = context_->options().graph_kernarg_bytes + segments_;
      if (absl::Status s = context_->device_memory().Reserve(context_->device_id(), updates); !s.ok()) return s;
      reserved_ += updates;
      updates_reserved_ = true;
    }
    const HipLibrary& hip = context_->hip();
    absl::Status s;
    if (!n.params) {
      s = context_->Check(hip.hipGraphExecMemcpyNodeSetParams1D(exec_, n.node, Address(n.copy[0]),
                                                                Address(n.copy[1]), n.copy[2],
                                                                hipMemcpyDeviceToDevice),
                          "hipGraphExecMemcpyNodeSetParams1D");
      update_kernargs_ += kCopyKernargBytes;
    } else {
      hipKernelNodeParams p = Params(n);
      s = context_->Check(hip.hipGraphExecKernelNodeSetParams(exec_, n.node, &p), "hipGraphExecKernelNodeSetParams");
      update_kernargs_ += n.kernel->kernarg_bytes();
    }
    n.stale = !s.ok();
    return s;
  }

  absl::StatusOr<std::optional<absl::Duration>> Launch(bool wait) override {
    if (exec_ && update_kernargs_ > context_->options().graph_kernarg_bytes)
      if (absl::Status s = Build(); !s.ok()) return s;
    return context_->Timed(wait, [&] {
      if (exec_) return context_->hip().hipGraphLaunch(exec_, context_->stream());
      for (Node& n : nodes_) {
        hipError_t e = n.params ? context_->LaunchNode(n.function, n.global, n.local, *n.params)
                                : context_->hip().hipMemcpyDtoDAsync(Address(n.copy[0]), Address(n.copy[1]), n.copy[2],
                                                                     context_->stream());
        if (e != hipSuccess) return e;
      }
      return hipSuccess;
    });
  }

 private:
  struct Node {
    const HipKernel* kernel = nullptr;  // null: a copy
    hipFunction_t function = nullptr;
    std::unique_ptr<KernelParams> params;  // null: a copy
    Dim3 global, local;
    bool stale = false;  // graph form: values the instantiated node has not taken
    hipGraphNode_t node = nullptr;
    std::array<uint64_t, 3> copy{};  // a copy's destination, source and bytes
  };
  static void* Address(uint64_t a) { return reinterpret_cast<void*>(a); }
  // What a copy node's update is counted as taking: an estimate of the segments of the
  // runtime's blit kernels (up to two dispatches a copy), which no metadata here gives.
  static constexpr uint64_t kCopyKernargBytes = 1024;
  // What ROCm's kernarg pool of an exec holds besides its nodes' segments (kKernArgChunkSize).
  static constexpr uint64_t kKernargPoolBytes = 128 << 10;

  // A hipGraph of the nodes as they are now, with edges_, and its exec, in place of the
  // ones there were (destroyed once their launches queued on the stream have run). On an
  // error the batch stays as it was.
  //
  // The exec's argument segments are device memory the runtime takes: its pool (the
  // nodes' segments and kKernargPoolBytes) is reserved from the device's memory here,
  // and the segments its updates may take before the next rebuild at the first update.
  absl::Status Build() {
    const HipLibrary& hip = context_->hip();
    if (absl::Status s = context_->Bind(); !s.ok()) return s;
    const uint64_t pool = kKernargPoolBytes + segments_;
    if (absl::Status s = context_->device_memory().Reserve(context_->device_id(), pool); !s.ok()) return s;
    hipGraph_t graph = nullptr;
    hipGraphExec_t exec = nullptr;
    std::vector<hipGraphNode_t> handles(nodes_.size());
    absl::Status s = context_->Check(hip.hipGraphCreate(&graph, 0), "hipGraphCreate");
    for (size_t i = 0; i < nodes_.size() && s.ok(); ++i) {
      std::vector<hipGraphNode_t> after;
      for (auto [from, to] : edges_)
        if (to == i) after.push_back(handles[from]);
      Node& n = nodes_[i];
      if (!n.params) {
        s = context_->Check(hip.hipGraphAddMemcpyNode1D(&handles[i], graph, after.data(), after.size(),
                                                        Address(n.copy[0]), Address(n.copy[1]), n.copy[2],
                                                        hipMemcpyDeviceToDevice),
                            "hipGraphAddMemcpyNode1D");
      } else {
        hipKernelNodeParams p = Params(n);
        s = context_->Check(hip.hipGraphAddKernelNode(&handles[i], graph, after.data(), after.size(), &p),
                            "hipGraphAddKernelNode");
      }
    }
    if (s.ok()) s = context_->Check(hip.hipGraphInstantiateWithFlags(&exec, graph, 0), "hipGraphInstantiate");
    // ROCm 6.0 and 6.1 delete an exec at once, a launch of it still queued or not.
    if (s.ok() && exec_) s = context_->Check(hip.hipStreamSynchronize(context_->stream()), "kernel");
    if (!s.ok()) {
      if (exec) (void)hip.hipGraphExecDestroy(exec);
      if (graph) (void)hip.hipGraphDestroy(graph);
      context_->device_memory().Release(pool);
      return s;
    }
    if (exec_) (void)hip.hipGraphExecDestroy(exec_);
    if (graph_) (void)hip.hipGraphDestroy(graph_);
    if (reserved_) context_->device_memory().Release(reserved_);
    reserved_ = pool;
    updates_reserved_ = false;
    graph_ = graph;
    exec_ = exec;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      nodes_[i].node = handles[i];
      nodes_[i].stale = false;
    }
    update_kernargs_ = 0;
    return absl::OkStatus();
  }
  static hipKernelNodeParams Params(Node& n) {
    hipKernelNodeParams p{};
    p.func = reinterpret_cast<void*>(n.function);
    p.gridDim = dim3(static_cast<uint32_t>(n.global[0]), static_cast<uint32_t>(n.global[1]),
                     static_cast<uint32_t>(n.global[2]));
    p.blockDim =
        dim3(static_cast<uint32_t>(n.local[0]), static_cast<uint32_t>(n.local[1]), static_cast<uint32_t>(n.local[2]));
    p.kernelParams = n.params->pointers();
    return p;
  }

  HipContext* const context_;
  std::vector<Node> nodes_;
  hipGraph_t graph_ = nullptr;
  hipGraphExec_t exec_ = nullptr;
  std::vector<std::pair<size_t, size_t>> edges_;
  // Bytes of argument segments exec_ has taken for node updates since it was instantiated.
  uint64_t update_kernargs_ = 0;
  // The segments of one instantiation of the nodes; the device memory reserved for
  // exec_'s pool, and whether that includes what its updates may take.
  uint64_t segments_ = 0;  // set once: the nodes' kinds never change
  uint64_t reserved_ = 0;
  bool updates_reserved_ = false;
};

const HipLibrary& HipContext::hip() const { return device_->hip(); }

const HipDriverOptions& HipContext::options() const { return device_->options(); }

DeviceMemory& HipContext::device_memory() { return device_->memory(); }

const std::string& HipContext::device_id() const { return device_->info().id; }

bool HipContext::wants_edges() const { return device_->graphs(); }

absl::Status HipContext::Open() {
  const HipLibrary& hip = device_->hip();
  if (absl::Status s = Bind(); !s.ok()) return s;
  if (absl::Status s = Check(hip.hipStreamCreateWithFlags(&stream_, hipStreamNonBlocking), "hipStreamCreate"); !s.ok())
    return s;
  for (hipEvent_t* e : {&start_, &stop_})
    if (absl::Status s = Check(hip.hipEventCreateWithFlags(e, hipEventDefault), "hipEventCreate"); !s.ok()) return s;
  absl::MutexLock lock(&staging_mu_);
  for (int i = 0; i < 2; ++i) {
    if (absl::Status s = Check(hip.hipHostMalloc(&staging_[i], device_->options().staging_bytes, hipHostMallocDefault),
                               "hipHostMalloc");
        !s.ok())
      return s;
    if (absl::Status s = Check(hip.hipEventCreateWithFlags(&staged_[i], hipEventDisableTiming), "hipEventCreate");
        !s.ok())
      return s;
    // Recorded once, so that the first wait on a buffer has something to wait for.
    if (absl::Status s = Check(hip.hipEventRecord(staged_[i], stream_), "hipEventRecord"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

HipContext::~HipContext() {
  const HipLibrary& hip = device_->hip();
  if (hip.hipSetDevice(device_->ordinal()) == hipSuccess) {
    if (stream_) (void)hip.hipStreamSynchronize(stream_);
    absl::MutexLock lock(&staging_mu_);
    for (std::span<uint8_t> host : pinned_.ranges()) (void)hip.hipHostUnregister(host.data());
    for (int i = 0; i < 2; ++i) {
      if (staging_[i]) (void)hip.hipHostFree(staging_[i]);
      if (staged_[i]) (void)hip.hipEventDestroy(staged_[i]);
    }
    for (hipEvent_t e : {start_, stop_})
      if (e) (void)hip.hipEventDestroy(e);
    if (stream_) (void)hip.hipStreamDestroy(stream_);
  }
  device_->Leave();
}

absl::Status HipContext::Bind() {
  if (absl::Status s = device_->fault(); !s.ok()) return s;
  return Check(device_->hip().hipSetDevice(device_->ordinal()), "hipSetDevice");
}

absl::Status HipContext::Check(hipError_t e, absl::string_view what) {
  if (e == hipSuccess) return absl::OkStatus();
  const std::string text = device_->hip().ErrorText(e);
  const std::string& id = device_->info().id;
  const DeviceErrorKind kind = Classify(e);
  return kind == DeviceErrorKind::kFault ? device_->Fail(what, text) : DeviceError(kind, id, what, text);
}

template <typename Submit>
absl::StatusOr<std::optional<absl::Duration>> HipContext::Timed(bool wait, Submit submit) {
  const HipLibrary& hip = device_->hip();
  if (absl::Status s = Bind(); !s.ok()) return s;
  if (wait)
    if (absl::Status s = Check(hip.hipEventRecord(start_, stream_), "hipEventRecord"); !s.ok()) return s;
  if (absl::Status s = Check(submit(), "launch"); !s.ok()) return s;
  if (!wait) return std::optional<absl::Duration>();
  if (absl::Status s = Check(hip.hipEventRecord(stop_, stream_), "hipEventRecord"); !s.ok()) return s;
  if (absl::Status s = Check(hip.hipEventSynchronize(stop_), "kernel"); !s.ok()) return s;
  float ms = 0;
  if (absl::Status s = Check(hip.hipEventElapsedTime(&ms, start_, stop_), "hipEventElapsedTime"); !s.ok()) return s;
  return std::optional<absl::Duration>(absl::Microseconds(static_cast<double>(ms) * 1000.0));
}

hipError_t HipContext::LaunchNode(hipFunction_t f, const Dim3& global, const Dim3& local, KernelParams& params) {
  return device_->hip().hipModuleLaunchKernel(f, static_cast<unsigned>(global[0]), static_cast<unsigned>(global[1]),
                                              static_cast<unsigned>(global[2]), static_cast<unsigned>(local[0]),
                                              static_cast<unsigned>(local[1]), static_cast<unsigned>(local[2]), 0,
                                              stream_, params.pointers(), nullptr);
}

absl::StatusOr<Allocation> HipContext::Allocate(uint64_t bytes) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  if (absl::Status s = device_->memory().Reserve(device_->info().id, bytes); !s.ok()) return s;
  const HipLibrary& hip = device_->hip();
  void* p = nullptr;
  absl::Status s = Check(hip.hipMalloc(&p, bytes), absl::StrCat("hipMalloc of ", bytes, " bytes"));
  if (s.ok()) s = Check(hip.hipMemsetAsync(p, 0, bytes, stream_), "hipMemsetAsync");
  if (!s.ok()) {
    if (p) (void)hip.hipFree(p);
    device_->memory().Release(bytes);
    return s;
  }
  return Allocation{reinterpret_cast<uint64_t>(p), bytes};
}

void HipContext::Free(const Allocation& a) {
  const HipLibrary& hip = device_->hip();
  if (Bind().ok()) {
    (void)hip.hipStreamSynchronize(stream_);
    (void)hip.hipFree(reinterpret_cast<void*>(a.address));
  }
  device_->memory().Release(a.bytes);
}

Staging HipContext::StagingFor(uint64_t address, bool to_device) {
  const HipLibrary& hip = device_->hip();
  Staging s;
  s.buffers = staging_;
  s.chunk = device_->options().staging_bytes;
  s.wait = [this, &hip](int i) { return Check(hip.hipEventSynchronize(staged_[i]), "transfer"); };
  s.copy = [this, &hip, address, to_device](int i, uint64_t offset, uint64_t n) {
    auto at = reinterpret_cast<hipDeviceptr_t>(address + offset);
    hipError_t e = to_device ? hip.hipMemcpyHtoDAsync(at, staging_[i], n, stream_)
                             : hip.hipMemcpyDtoHAsync(staging_[i], at, n, stream_);
    if (absl::Status st = Check(e, to_device ? "hipMemcpyHtoDAsync" : "hipMemcpyDtoHAsync"); !st.ok()) return st;
    return Check(hip.hipEventRecord(staged_[i], stream_), "hipEventRecord");
  };
  return s;
}

absl::Status HipContext::PinHost(std::span<uint8_t> host) {
  if (host.empty()) return absl::OkStatus();
  if (absl::Status s = Bind(); !s.ok()) return s;
  absl::MutexLock lock(&staging_mu_);
  if (absl::Status s = Check(device_->hip().hipHostRegister(host.data(), host.size(), hipHostRegisterDefault),
                             "hipHostRegister");
      !s.ok())
    return s;
  pinned_.Add(host);
  return absl::OkStatus();
}

// From pinned memory the copy is one DMA, waited for: the caller may reuse the bytes once
// Write returns.
absl::Status HipContext::Write(const Allocation& dst, uint64_t offset, std::span<const uint8_t> bytes) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  absl::MutexLock lock(&staging_mu_);
  if (pinned_.Hold(bytes.data(), bytes.size())) {
    auto at = reinterpret_cast<hipDeviceptr_t>(dst.address + offset);
    const hipError_t e =
        device_->hip().hipMemcpyHtoDAsync(at, const_cast<uint8_t*>(bytes.data()), bytes.size(), stream_);
    if (absl::Status s = Check(e, "hipMemcpyHtoDAsync"); !s.ok()) return s;
    return Check(device_->hip().hipStreamSynchronize(stream_), "transfer");
  }
  return StagedWrite(StagingFor(dst.address + offset, true), bytes);
}

absl::Status HipContext::Read(const Allocation& src, uint64_t offset, std::span<uint8_t> bytes) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  absl::MutexLock lock(&staging_mu_);
  if (pinned_.Hold(bytes.data(), bytes.size())) {
    auto at = reinterpret_cast<hipDeviceptr_t>(src.address + offset);
    const hipError_t e = device_->hip().hipMemcpyDtoHAsync(bytes.data(), at, bytes.size(), stream_);
    if (absl::Status s = Check(e, "hipMemcpyDtoHAsync"); !s.ok()) return s;
    return Check(device_->hip().hipStreamSynchronize(stream_), "transfer");
  }
  return StagedRead(StagingFor(src.address + offset, false), bytes);
}

absl::Status HipContext::Copy(const Allocation& dst, uint64_t dst_offset, const Allocation& src, uint64_t src_offset,
                              uint64_t bytes) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  return Check(
      device_->hip().hipMemcpyDtoDAsync(reinterpret_cast<hipDeviceptr_t>(dst.address + dst_offset),
                                        reinterpret_cast<hipDeviceptr_t>(src.address + src_offset), bytes, stream_),
      "hipMemcpyDtoDAsync");
}

absl::StatusOr<std::unique_ptr<Kernel>> HipContext::Load(const ProgramSource& source,
                                                         const std::filesystem::path& artifact) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  absl::StatusOr<ModuleArtifact> module_artifact = ReadModuleArtifact(artifact);
  if (!module_artifact.ok()) return module_artifact.status();
  // The loader takes no size: a code object is checked to lie within its bytes first.
  if (absl::StartsWith(module_artifact->image, ELFMAG))
    if (absl::Status s = CheckElfImage(module_artifact->image, kElfMachineAmdgpu, source.format); !s.ok()) return s;
  // The runtime reads one argument per explicit parameter of the kernel's metadata, each
  // one's bytes, whatever the signature says; HIP has no query of them, so they are read
  // from the same metadata here.
  absl::StatusOr<AmdgpuKernelInfo> metadata =
      ReadAmdgpuKernelInfo(module_artifact->image, module_artifact->entry, source.format);
  if (!metadata.ok()) return metadata.status();
  if (absl::Status s = CheckParamSizes(source.format, module_artifact->entry, source.signature, metadata->arg_sizes);
      !s.ok())
    return s;
  // Without launch bounds in the metadata, the device's limit, which the engine checks.
  const uint64_t max_threads =
      metadata->max_flat_workgroup_size ? metadata->max_flat_workgroup_size : device_->info().limits.max_local_total;
  const HipLibrary& hip = device_->hip();
  auto image = std::make_unique<const std::string>(std::move(module_artifact->image));
  hipModule_t module = nullptr;
  if (hipError_t e = hip.hipModuleLoadData(&module, image->data()); e != hipSuccess) {
    if (e == hipErrorInvalidImage || e == hipErrorNoBinaryForGpu || e == hipErrorInvalidKernelFile ||
        e == hipErrorSharedObjectInitFailed)
      return absl::InvalidArgumentError(absl::StrCat(source.format, " program ", source.entry, " does not load on ",
                                                     device_->info().id, ": ", hip.ErrorText(e)));
    return Check(e, "hipModuleLoadData");
  }
  hipFunction_t function = nullptr;
  if (hipError_t e = hip.hipModuleGetFunction(&function, module, module_artifact->entry.c_str()); e != hipSuccess) {
    (void)hip.hipModuleUnload(module);
    if (e == hipErrorNotFound || e == hipErrorInvalidDeviceFunction)
      return absl::InvalidArgumentError(
          absl::StrCat(source.format, " program has no kernel named ", module_artifact->entry));
    return Check(e, "hipModuleGetFunction");
  }
  // The runtime aligns each segment to 128 bytes at least (LightningKernel::postLoad).
  // Where the metadata gives no segment, the explicit arguments and 256 bytes of hidden
  // ones (code object version 5's).
  const uint64_t align = std::max<uint64_t>(metadata->kernarg_segment_align, 128);
  const uint64_t segment = metadata->kernarg_segment_size ? metadata->kernarg_segment_size
                                                          : 256 + KernelParams(source.signature).size();
  const uint64_t kernarg_bytes = (segment + align - 1) / align * align;
  return std::make_unique<HipKernel>(this, std::move(image), module, function, source.signature,
                                     module_artifact->entry, max_threads, kernarg_bytes);
}

absl::StatusOr<std::optional<absl::Duration>> HipContext::Launch(const Kernel& kernel, std::span<const ArgValue> args,
                                                                 const Dim3& global, const Dim3& local, bool wait) {
  // The driver copies the arguments at the launch call, so one block per thread serves.
  thread_local KernelParams params;
  params.Layout(kernel.signature());
  params.Pack(args);
  const auto& hip_kernel = static_cast<const HipKernel&>(kernel);
  if (absl::Status s = hip_kernel.CheckLaunch(global, local); !s.ok()) return s;
  const hipFunction_t f = hip_kernel.function();
  return Timed(wait, [&] { return LaunchNode(f, global, local, params); });
}

absl::Status HipContext::Synchronize() {
  if (absl::Status s = Bind(); !s.ok()) return s;
  return Check(device_->hip().hipStreamSynchronize(stream_), "kernel");
}

absl::StatusOr<std::unique_ptr<DeviceGraph>> HipContext::Instantiate(std::span<const GraphNode> nodes,
                                                                     std::span<const std::pair<size_t, size_t>> edges) {
  if (absl::Status s = Bind(); !s.ok()) return s;
  for (const GraphNode& node : nodes)
    if (!node.is_copy())
      if (absl::Status s = static_cast<const HipKernel*>(node.kernel)->CheckLaunch(node.global, node.local);
          !s.ok())
        return s;
  auto batch = std::make_unique<HipBatch>(this, nodes);
  if (device_->graphs())
    if (absl::Status s = batch->BuildGraph(edges); !s.ok()) return s;
  return batch;
}

}  // namespace

std::vector<std::unique_ptr<Device>> HipDriver::Discover() {
  std::vector<std::unique_ptr<Device>> devices;
  unavailable_.clear();
  absl::StatusOr<std::unique_ptr<HipLibrary>> loaded = HipLibrary::Load();
  if (!loaded.ok()) {
    unavailable_ = std::string(loaded.status().message());
    return devices;
  }
  std::shared_ptr<HipLibrary> hip = std::move(*loaded);
  if (hipError_t e = hip->hipInit(0); e != hipSuccess) {
    unavailable_ = absl::StrCat("hipInit: ", hip->ErrorText(e), " (no usable AMD GPU)");
    return devices;
  }
  int count = 0;
  if (hipError_t e = hip->hipGetDeviceCount(&count); e != hipSuccess || count == 0) {
    unavailable_ =
        e != hipSuccess ? absl::StrCat("hipGetDeviceCount: ", hip->ErrorText(e)) : "the HIP runtime reports no devices";
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<HipDescription> description = Describe(*hip, i, options_);
    if (!description.ok()) {
      absl::StrAppend(&unavailable_, unavailable_.empty() ? "" : "; ", description.status().message());
      continue;
    }
    devices.push_back(std::make_unique<HipDevice>(hip, std::move(*description), options_));
  }
  if (!devices.empty()) unavailable_.clear();
  return devices;
}

}  // namespace replayd

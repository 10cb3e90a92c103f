// The fake HIP runtime; what it promises is in fake_hip.h.
//
// Its state is the process's, as the runtime's is: one State behind one lock, and a
// current device per thread. Each entry point is defined in an extern "C" block under
// the name hip_runtime_api.h or hiprtc.h declares, so a prototype that differs from the
// header's fails to compile ("conflicting declaration of C function"); kChecked below
// also takes each one's address as the exact type HipLibrary stores it as. The library
// exports those functions and the test hooks, nothing else.
//
// Where the fake is stricter or narrower than the runtime, it says so at the function:
// the runtime must be initialised first (hipInit), handles are checked, fresh device
// memory holds garbage, and memcpy nodes are device-to-device copies.
#include "tests/support/fake_hip/fake_hip.h"
#include "drivers/amdgpu_metadata.h"
#include "tests/support/device_queues.h"
#include "tests/support/graph_order.h"

#include <elf.h>
#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>
#include <hip/hiprtc.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#define FAKE_HIP_EXPORT __attribute__((visibility("default")))

// The runtime's opaque handle types, completed here.
struct ihipStream_t {
  int device;
};
struct ihipEvent_t {
  int device;
  unsigned flags;
  bool recorded = false;
  std::chrono::steady_clock::time_point at;
  hipStream_t stream = nullptr;  // the stream it was recorded on (its work queue)
  uint64_t after = 0;            // the last work submitted before it was recorded
};
struct ihipModuleSymbol_t {
  hipModule_t module;
  std::string name;
  // From the code object's metadata, as the runtime reads them: each explicit argument's
  // bytes and whether it points to global memory, and the bytes the runtime allocates
  // for the argument segment of each launch and each update of a graph's node (0 for a
  // kernel the metadata does not describe).
  std::vector<size_t> arg_sizes;
  std::vector<bool> arg_is_buffer;
  uint64_t kernarg_bytes = 0;
  uint64_t max_threads = 0;  // its launch bounds (.max_flat_workgroup_size); 0: none given
};
struct ihipModule_t {
  int device;
  std::string image;
  std::vector<std::unique_ptr<ihipModuleSymbol_t>> functions;
};
// A node as a graph holds it, and as an instantiated graph copies it.
struct hipGraphNode {
  hipFunction_t function = nullptr;  // a kernel node's; null for a memcpy node
  std::string name;                  // the kernel's, kept for launches after an unload
  int device = 0;                    // the kernel's module's
  std::vector<const void*> buffers;  // a kernel node's pointer arguments, as they were set
  std::vector<hipGraphNode_t> deps;  // the nodes it depends on (its edges)
  void* dst = nullptr;               // a memcpy node's
  const void* src = nullptr;
  size_t bytes = 0;
};
struct ihipGraph {
  std::vector<std::unique_ptr<hipGraphNode>> nodes;  // in creation order, which is a topological one
};
struct hipGraphExec {
  int device;  // current at instantiation
  // The argument segments it holds: one per kernel node at instantiation, and one more at
  // each update of a kernel node, never given back before the exec is destroyed (ROCm's
  // graph kernarg pool; see fake_hip_set_kernarg_limit).
  uint64_t kernarg_bytes = 0;
  // Each node's handle in the graph and a copy of the node, in the graph's order.
  std::vector<std::pair<hipGraphNode_t, hipGraphNode>> nodes;
};
struct _hiprtcProgram {
  std::string log;
};

namespace {

constexpr int kVersion = HIP_VERSION;  // of the headers the fake is built with
constexpr char kName[] = "Fake MI210";
// The target; with HSA_XNACK=1 in the process's environment its XNACK mode is on
// (xnack+), as ROCr sets the mode from that variable.
constexpr char kArch[] = "gfx90a:sramecc+:xnack-", kArchXnack[] = "gfx90a:sramecc+:xnack+";
constexpr int kGcnArch = 910;
constexpr unsigned kMach = 0x3f;  // EF_AMDGPU_MACH_AMDGCN_GFX90A
constexpr size_t kTotalMemory = size_t{1} << 30;
constexpr int kMaxGrid[3] = {2147483647, 65536, 65536};
constexpr int kMaxBlock[3] = {1024, 1024, 1024};
constexpr int kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxSharedPerBlock = 64 << 10;
constexpr int kDevices = 1;
constexpr size_t kAlignment = 256;
// The argument segment of the blit kernel a device-to-device memcpy node runs as.
constexpr uint64_t kCopyKernargBytes = 512;

struct State {
  std::mutex mu;
  bool initialized = false;
  bool faulted = false;
  std::map<uintptr_t, size_t> allocations;  // device 0's, by base address
  size_t allocated = 0;
  std::unordered_map<void*, size_t> host_allocations;  // hipHostMalloc's, by start
  std::map<const uint8_t*, size_t> registered;  // hipHostRegister's ranges, by start
  int registered_copies = 0;  // host <-> device copies from or into registered memory
  std::unordered_map<hipStream_t, std::unique_ptr<ihipStream_t>> streams;
  std::unordered_map<hipEvent_t, std::unique_ptr<ihipEvent_t>> events;
  std::unordered_map<hipModule_t, std::unique_ptr<ihipModule_t>> modules;
  std::unordered_set<hipFunction_t> functions;
  std::unordered_map<hipGraph_t, std::unique_ptr<ihipGraph>> graphs;
  std::unordered_map<hipGraphExec_t, std::unique_ptr<hipGraphExec>> execs;
  int reclaimed = 0;
  int resets = 0;
  uint64_t kernarg_limit = UINT64_MAX;  // of all execs' argument segments together
  int instantiations = 0;               // since the reset
  // Work submitted to a stream and not yet run, by stream (null: the null stream).
  replayd::testing::DeviceQueues<State> work;
};

// Never destroyed: the daemon's threads may call the library until the process exits.
State& S() {
  static State* state = new State();
  return *state;
}

// The calling thread's current device, as hipSetDevice left it.
thread_local int t_device = 0;

// One call of the library, holding its lock throughout.
struct Call {
  std::lock_guard<std::mutex> lock{S().mu};
  State& s = S();

  // Why a call that uses the device cannot start: the runtime is not initialised, or the
  // sticky fault. hipSuccess when it can.
  hipError_t blocked() const {
    if (!s.initialized) return hipErrorNotInitialized;
    if (s.faulted) return hipErrorIllegalAddress;
    return hipSuccess;
  }
  // What a release answers once it has released: it still releases after the sticky
  // fault, but says the device is lost.
  hipError_t released() const { return s.faulted ? hipErrorIllegalAddress : hipSuccess; }
};

// A stream the calling thread may use: the null stream (the current device's), or a live
// stream of the current device. (Stricter than the runtime, which switches to a stream's
// device: replayd sets the device before every use.)
hipError_t UsableStream(const State& s, hipStream_t stream) {
  if (!stream) return hipSuccess;
  if (!s.streams.count(stream)) return hipErrorInvalidHandle;
  return stream->device == t_device ? hipSuccess : hipErrorInvalidHandle;
}

// Whether host range [p, p + n) is page-locked (hipHostRegister's or hipHostMalloc's): the
// runtime copies from and into such memory by DMA, when the copy's turn comes, where it
// takes pageable memory at the call.
bool Pinned(const State& s, const void* p, size_t n);

// Whether [address, address + bytes) lies in one live allocation. Address 0 never does.
bool Inside(const State& s, const void* p, size_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  if (address == 0) return false;
  auto it = s.allocations.upper_bound(address);
  if (it == s.allocations.begin()) return false;
  --it;
  const size_t offset = address - it->first;
  return offset <= it->second && bytes <= it->second - offset;
}

// Launch dimensions within the device's limits, a live function of the current device,
// and the argument forms the runtime accepts.
hipError_t CheckLaunch(const State& s, hipFunction_t f, const unsigned grid[3], const unsigned block[3],
                       unsigned shared_bytes, void** params, void** extra) {
  if (!f || !s.functions.count(f)) return hipErrorInvalidResourceHandle;
  if (f->module->device != t_device) return hipErrorInvalidDevice;
  uint64_t threads = 1;
  for (int d = 0; d < 3; ++d) {
    if (grid[d] == 0 || grid[d] > static_cast<unsigned>(kMaxGrid[d]) || block[d] == 0 ||
        block[d] > static_cast<unsigned>(kMaxBlock[d]))
      return hipErrorInvalidConfiguration;
    // "HIP does not support kernel launch with gridDim x blockDim >= 2^32" in a dimension
    // (hip_runtime_api.h): ROCm refuses it at a launch and a node's creation, and at a
    // node's update truncates it silently, which the fake refuses instead.
    if (uint64_t{grid[d]} * block[d] >= (uint64_t{1} << 32)) return hipErrorInvalidConfiguration;
    threads *= block[d];
  }
  if (threads > kMaxThreadsPerBlock || shared_bytes > kMaxSharedPerBlock) return hipErrorInvalidConfiguration;
  // Past the kernel's launch bounds ROCm refuses the launch with hipErrorLaunchFailure
  // (ihipLaunchKernel_validate), a refusal and not a fault.
  if (f->max_threads && threads > f->max_threads) return hipErrorLaunchFailure;
  if (params && extra) return hipErrorInvalidValue;
  return hipSuccess;
}

// The pointer arguments of a launch of `f` with `params` (kernelParams: one pointer to
// each explicit argument's bytes), which a kernel reads and writes; none for a kernel the
// metadata does not describe or arguments passed as `extra`.
std::vector<const void*> Buffers(hipFunction_t f, void** params) {
  std::vector<const void*> buffers;
  if (!params) return buffers;
  for (size_t i = 0; i < f->arg_is_buffer.size(); ++i)
    if (f->arg_is_buffer[i] && f->arg_sizes[i] == sizeof(void*)) {
      const void* p;
      std::memcpy(&p, params[i], sizeof p);
      buffers.push_back(p);
    }
  return buffers;
}

// A kernel faults when a pointer argument is off the live allocations (0 included): the
// fake does not know which bytes it would touch, so it asks for the pointer itself to lie
// in one, as every buffer replayd passes does.
bool BuffersLive(const State& s, const std::vector<const void*>& buffers) {
  return std::all_of(buffers.begin(), buffers.end(), [&](const void* p) { return Inside(s, p, 0); });
}

// Takes `bytes` more of argument segments for `exec`: hipErrorOutOfMemory past the limit.
hipError_t TakeKernargs(State& s, hipGraphExec* exec, uint64_t bytes) {
  uint64_t held = 0;
  for (const auto& [handle, e] : s.execs) held += e->kernarg_bytes;
  if (held > s.kernarg_limit || bytes > s.kernarg_limit - held) return hipErrorOutOfMemory;
  exec->kernarg_bytes += bytes;
  return hipSuccess;
}

// A memcpy node's copy, as replayd makes them: device to device, between ranges that lie
// in live allocations (the runtime refuses a memcpy node on memory it does not know, 0
// included). Other kinds, which the runtime supports, the fake does not.
hipError_t CheckCopy(const State& s, void* dst, const void* src, size_t bytes, hipMemcpyKind kind) {
  if (kind != hipMemcpyDeviceToDevice && kind != hipMemcpyDefault) return hipErrorNotSupported;
  if (bytes == 0 || !Inside(s, dst, bytes) || !Inside(s, src, bytes)) return hipErrorInvalidValue;
  return hipSuccess;
}

// Dependencies must be nodes of `graph`.
hipError_t CheckDependencies(const ihipGraph& graph, const hipGraphNode_t* deps, size_t n) {
  if (n > 0 && !deps) return hipErrorInvalidValue;
  for (size_t i = 0; i < n; ++i) {
    auto same = [&](const std::unique_ptr<hipGraphNode>& node) { return node.get() == deps[i]; };
    if (std::none_of(graph.nodes.begin(), graph.nodes.end(), same)) return hipErrorInvalidValue;
  }
  return hipSuccess;
}

void* AlignedAlloc(size_t alignment, size_t bytes) {
  return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
}

// The bytes of a 64-bit ELF image: as far as its headers and sections reach.
size_t ElfExtent(const unsigned char* image) {
  Elf64_Ehdr h;
  std::memcpy(&h, image, sizeof h);
  size_t end = sizeof h;
  end = std::max<size_t>(end, h.e_phoff + size_t{h.e_phnum} * h.e_phentsize);
  end = std::max<size_t>(end, h.e_shoff + size_t{h.e_shnum} * h.e_shentsize);
  for (unsigned i = 0; i < h.e_shnum && h.e_shentsize >= sizeof(Elf64_Shdr); ++i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, image + h.e_shoff + size_t{i} * h.e_shentsize, sizeof sh);
    if (sh.sh_type != SHT_NOBITS) end = std::max<size_t>(end, sh.sh_offset + sh.sh_size);
  }
  return end;
}

// Whether a code object's target-ID settings run on the device (sramecc+, xnack-). In a
// code object of version 4 or later, each is 0 (not supported), "any", "off" or "on".
bool XnackOn() {
  const char* mode = std::getenv("HSA_XNACK");
  return mode && std::string_view(mode) == "1";
}

bool FeaturesRun(const Elf64_Ehdr& h) {
  if (h.e_ident[EI_ABIVERSION] < 2) return true;  // version 3: no settings
  const unsigned xnack = h.e_flags & 0x300, sramecc = h.e_flags & 0xc00;
  return xnack != (XnackOn() ? 0x200 : 0x300) && sramecc != 0x800;
}

// Takes a code object as the runtime would: an AMDGPU ELF image for this device's target,
// or a clang offload bundle holding one. Its bytes into *bytes.
hipError_t ReadImage(const unsigned char* p, std::string* bytes) {
  constexpr std::string_view kBundle = "__CLANG_OFFLOAD_BUNDLE__";
  if (std::memcmp(p, kBundle.data(), kBundle.size()) == 0) {
    // The header: the magic, a count, then per entry offset, size, triple length, triple.
    uint64_t count = 0;
    std::memcpy(&count, p + kBundle.size(), 8);
    size_t at = kBundle.size() + 8;
    for (uint64_t i = 0; i < count && i < 64; ++i) {
      uint64_t offset = 0, size = 0, length = 0;
      std::memcpy(&offset, p + at, 8);
      std::memcpy(&size, p + at + 8, 8);
      std::memcpy(&length, p + at + 16, 8);
      const std::string triple(reinterpret_cast<const char*>(p + at + 24), std::min<uint64_t>(length, 256));
      at += 24 + length;
      const size_t gfx = triple.find("gfx90a");
      if (triple.rfind("hip", 0) != 0 || gfx == std::string::npos || size < sizeof(Elf64_Ehdr)) continue;
      std::string inner;
      if (ReadImage(p + offset, &inner) == hipSuccess) {
        *bytes = std::move(inner);
        return hipSuccess;
      }
    }
    return hipErrorNoBinaryForGpu;
  }
  if (std::memcmp(p, ELFMAG, SELFMAG) != 0 || p[EI_CLASS] != ELFCLASS64) return hipErrorInvalidImage;
  Elf64_Ehdr h;
  std::memcpy(&h, p, sizeof h);
  if (h.e_machine != EM_AMDGPU) return hipErrorInvalidImage;
  if ((h.e_flags & 0xff) != kMach || !FeaturesRun(h)) return hipErrorNoBinaryForGpu;
  bytes->assign(reinterpret_cast<const char*>(p), ElfExtent(p));
  return hipSuccess;
}

// Whether a code object has the kernel descriptor of a kernel named `name`.
bool DefinesKernel(const std::string& image, const std::string& name) {
  return image.find('\0' + name + ".kd" + '\0') != std::string::npos;
}

// Frees everything of `device` as hipDeviceReset does, counting each object.
void Reclaim(State& s, int device) {
  if (device != 0) return;
  for (const auto& [address, bytes] : s.allocations) std::free(reinterpret_cast<void*>(address));
  for (const auto& [p, bytes] : s.host_allocations) std::free(p);
  s.work.Clear();  // a reset abandons the device's work
  s.reclaimed += static_cast<int>(s.allocations.size() + s.host_allocations.size());
  s.allocations.clear();
  s.allocated = 0;
  s.host_allocations.clear();
  s.reclaimed += static_cast<int>(s.registered.size());
  s.registered.clear();
  auto drop = [&](auto& objects) {
    for (auto it = objects.begin(); it != objects.end();) {
      if (it->second->device != device) {
        ++it;
        continue;
      }
      it = objects.erase(it);
      ++s.reclaimed;
    }
  };
  drop(s.streams);
  drop(s.events);
  for (const auto& [handle, m] : s.modules)
    for (const auto& f : m->functions) s.functions.erase(f.get());
  drop(s.modules);
  drop(s.execs);
  s.reclaimed += static_cast<int>(s.graphs.size());
  s.graphs.clear();
}

struct ErrorText {
  hipError_t code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {hipSuccess, "hipSuccess", "no error"},
    {hipErrorInvalidValue, "hipErrorInvalidValue", "invalid argument"},
    {hipErrorOutOfMemory, "hipErrorOutOfMemory", "out of memory"},
    {hipErrorNotInitialized, "hipErrorNotInitialized", "initialization error"},
    {hipErrorInvalidConfiguration, "hipErrorInvalidConfiguration", "invalid configuration argument"},
    {hipErrorInvalidDevice, "hipErrorInvalidDevice", "invalid device ordinal"},
    {hipErrorInvalidImage, "hipErrorInvalidImage", "device kernel image is invalid"},
    {hipErrorNoBinaryForGpu, "hipErrorNoBinaryForGpu", "no kernel image is available for execution on the device"},
    {hipErrorInvalidHandle, "hipErrorInvalidHandle", "invalid resource handle"},
    {hipErrorNotFound, "hipErrorNotFound", "named symbol not found"},
    {hipErrorIllegalAddress, "hipErrorIllegalAddress", "an illegal memory access was encountered"},
    {hipErrorNotSupported, "hipErrorNotSupported", "operation not supported"},
};

const char* LookUpError(hipError_t error, bool name) {
  for (const ErrorText& e : kErrors)
    if (e.code == error) return name ? e.name : e.text;
  return name ? "hipErrorUnknown" : "unknown error";
}

}  // namespace

extern "C" {

// Initialisation, versions, errors and the device: none of these needs the device's
// state, so the sticky fault does not stop them.

// The runtime initialises itself at its first call; the fake wants hipInit first, as
// replayd calls it.
FAKE_HIP_EXPORT hipError_t hipInit(unsigned int flags) {
  Call call;
  if (flags != 0) return hipErrorInvalidValue;
  call.s.initialized = true;
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipDriverGetVersion(int* version) {
  if (!version) return hipErrorInvalidValue;
  *version = kVersion;
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipRuntimeGetVersion(int* version) {
  if (!version) return hipErrorInvalidValue;
  *version = kVersion;
  return hipSuccess;
}

FAKE_HIP_EXPORT const char* hipGetErrorName(hipError_t error) { return LookUpError(error, true); }
FAKE_HIP_EXPORT const char* hipGetErrorString(hipError_t error) { return LookUpError(error, false); }

FAKE_HIP_EXPORT hipError_t hipGetDeviceCount(int* count) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (!count) return hipErrorInvalidValue;
  *count = kDevices;
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipGetDeviceProperties(hipDeviceProp_t* prop, int device) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (!prop) return hipErrorInvalidValue;
  if (device < 0 || device >= kDevices) return hipErrorInvalidDevice;
  std::memset(prop, 0, sizeof *prop);
  std::strncpy(prop->name, kName, sizeof prop->name - 1);
  std::strncpy(prop->gcnArchName, XnackOn() ? kArchXnack : kArch, sizeof prop->gcnArchName - 1);
  prop->gcnArch = kGcnArch;
  prop->totalGlobalMem = kTotalMemory;
  prop->sharedMemPerBlock = kMaxSharedPerBlock;
  prop->warpSize = 64;
  prop->maxThreadsPerBlock = kMaxThreadsPerBlock;
  for (int d = 0; d < 3; ++d) {
    prop->maxThreadsDim[d] = kMaxBlock[d];
    prop->maxGridSize[d] = kMaxGrid[d];
  }
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 104;
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attribute, int device) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (!value) return hipErrorInvalidValue;
  if (device < 0 || device >= kDevices) return hipErrorInvalidDevice;
  switch (attribute) {
    case hipDeviceAttributeMaxThreadsPerBlock: *value = kMaxThreadsPerBlock; break;
    case hipDeviceAttributeMaxBlockDimX: *value = kMaxBlock[0]; break;
    case hipDeviceAttributeMaxBlockDimY: *value = kMaxBlock[1]; break;
    case hipDeviceAttributeMaxBlockDimZ: *value = kMaxBlock[2]; break;
    case hipDeviceAttributeMaxGridDimX: *value = kMaxGrid[0]; break;
    case hipDeviceAttributeMaxGridDimY: *value = kMaxGrid[1]; break;
    case hipDeviceAttributeMaxGridDimZ: *value = kMaxGrid[2]; break;
    case hipDeviceAttributeWarpSize: *value = 64; break;
    case hipDeviceAttributeMultiprocessorCount: *value = 104; break;
    default: return hipErrorInvalidValue;
  }
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipDeviceTotalMem(size_t* bytes, hipDevice_t device) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (!bytes) return hipErrorInvalidValue;
  if (device < 0 || device >= kDevices) return hipErrorInvalidDevice;
  *bytes = kTotalMemory;
  return hipSuccess;
}

// Selects the calling thread's device; uses nothing of it, so the fault does not stop it.
FAKE_HIP_EXPORT hipError_t hipSetDevice(int device) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (device < 0 || device >= kDevices) return hipErrorInvalidDevice;
  t_device = device;
  return hipSuccess;
}

// Frees everything of the current device, what it owned counted as reclaimed, and
// clears the sticky fault: the device serves again.
FAKE_HIP_EXPORT hipError_t hipDeviceReset(void) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  Reclaim(call.s, t_device);
  call.s.faulted = false;
  ++call.s.resets;
  return hipSuccess;
}

// Streams and events.

FAKE_HIP_EXPORT hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int flags) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (!stream || (flags & ~unsigned{hipStreamNonBlocking})) return hipErrorInvalidValue;
  auto st = std::make_unique<ihipStream_t>(ihipStream_t{t_device});
  *stream = st.get();
  call.s.streams.emplace(*stream, std::move(st));
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipStreamDestroy(hipStream_t stream) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (!call.s.streams.count(stream)) return hipErrorInvalidHandle;
  call.s.work.RunQueue(call.s, stream);  // what it holds still runs, as on a GPU
  call.s.streams.erase(stream);
  return call.released();
}

// Runs the stream's work; the null stream's waits for every stream (blocking streams, as
// replayd's are). A fault in that work is reported here.
FAKE_HIP_EXPORT hipError_t hipStreamSynchronize(hipStream_t stream) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (hipError_t r = UsableStream(call.s, stream); r != hipSuccess) return r;
  if (stream) {
    call.s.work.RunQueue(call.s, stream);
  } else {
    call.s.work.RunAll(call.s);
  }
  return call.blocked();
}

FAKE_HIP_EXPORT hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned flags) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  const unsigned known = hipEventBlockingSync | hipEventDisableTiming | hipEventInterprocess;
  if (!event || (flags & ~known) || ((flags & hipEventInterprocess) && !(flags & hipEventDisableTiming)))
    return hipErrorInvalidValue;
  auto e = std::make_unique<ihipEvent_t>(ihipEvent_t{t_device, flags, false, {}});
  *event = e.get();
  call.s.events.emplace(*event, std::move(e));
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipEventDestroy(hipEvent_t event) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (!call.s.events.erase(event)) return hipErrorInvalidHandle;
  return call.released();
}

// The event and the stream must be of the current device.
FAKE_HIP_EXPORT hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (hipError_t r = UsableStream(call.s, stream); r != hipSuccess) return r;
  if (!call.s.events.count(event) || event->device != t_device) return hipErrorInvalidHandle;
  event->recorded = true;
  event->at = std::chrono::steady_clock::now();
  event->stream = stream;
  event->after = call.s.work.submitted();
  return hipSuccess;
}

// Runs the work its stream held when it was recorded; an event never recorded is
// complete.
FAKE_HIP_EXPORT hipError_t hipEventSynchronize(hipEvent_t event) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (!call.s.events.count(event)) return hipErrorInvalidHandle;
  if (event->recorded) call.s.work.RunQueue(call.s, event->stream, event->after);
  return call.blocked();
}

// The host time between the two records, at least a microsecond. Both events must have
// been recorded, with timing.
FAKE_HIP_EXPORT hipError_t hipEventElapsedTime(float* ms, hipEvent_t start, hipEvent_t stop) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (!ms) return hipErrorInvalidValue;
  for (hipEvent_t e : {start, stop})
    if (!call.s.events.count(e) || !e->recorded || (e->flags & hipEventDisableTiming)) return hipErrorInvalidHandle;
  const std::chrono::duration<float, std::milli> between = stop->at - start->at;
  *ms = std::max(between.count(), 0.001f);
  return hipSuccess;
}

// Memory. Device memory is host memory; an address is the host pointer.

// Fresh memory holds garbage, as on a GPU: nothing may count on its being zero. Zero
// bytes is success with a null pointer, as the runtime answers.
FAKE_HIP_EXPORT hipError_t hipMalloc(void** ptr, size_t bytes) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (!ptr) return hipErrorInvalidValue;
  *ptr = nullptr;
  if (bytes == 0) return hipSuccess;
  State& s = call.s;
  if (t_device != 0 || bytes > kTotalMemory - s.allocated) return hipErrorOutOfMemory;
  void* p = AlignedAlloc(kAlignment, bytes);
  if (!p) return hipErrorOutOfMemory;
  std::memset(p, 0xcd, bytes);
  *ptr = p;
  s.allocations.emplace(reinterpret_cast<uintptr_t>(p), bytes);
  s.allocated += bytes;
  return hipSuccess;
}

// An allocation by its base address; null is success. It waits for the device's work
// first, as the runtime does.
FAKE_HIP_EXPORT hipError_t hipFree(void* ptr) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (!ptr) return hipSuccess;
  auto it = call.s.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == call.s.allocations.end()) return hipErrorInvalidValue;
  call.s.work.RunAll(call.s);
  call.s.allocated -= it->second;
  std::free(ptr);
  call.s.allocations.erase(it);
  return call.released();
}

FAKE_HIP_EXPORT hipError_t hipMemsetAsync(void* dst, int value, size_t n, hipStream_t stream) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (hipError_t r = UsableStream(call.s, stream); r != hipSuccess) return r;
  if (!Inside(call.s, dst, n)) return hipErrorInvalidValue;
  call.s.work.Submit(stream, nullptr, [=](State&) { std::memset(dst, value, n); });
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipHostMalloc(void** ptr, size_t bytes, unsigned int flags) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  const unsigned known = hipHostMallocPortable | hipHostMallocMapped | hipHostMallocWriteCombined |
                         hipHostMallocCoherent | hipHostMallocNonCoherent;
  if (!ptr || bytes == 0 || (flags & ~known)) return hipErrorInvalidValue;
  void* p = AlignedAlloc(4096, bytes);
  if (!p) return hipErrorOutOfMemory;
  call.s.host_allocations.emplace(p, bytes);
  *ptr = p;
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipHostFree(void* p) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (!p) return hipSuccess;
  if (!call.s.host_allocations.count(p)) return hipErrorInvalidValue;
  call.s.work.RunAll(call.s);  // as the runtime, it waits for the device first
  call.s.host_allocations.erase(p);
  std::free(p);
  return call.released();
}

}  // extern "C"

namespace {

// True when [p, p + n) lies inside one registered range.
bool Registered(const State& s, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  auto it = s.registered.upper_bound(b);
  if (it == s.registered.begin()) return false;
  --it;
  const size_t into = static_cast<size_t>(b - it->first);
  return into <= it->second && n <= it->second - into;
}

bool Pinned(const State& s, const void* p, size_t n) {
  if (Registered(s, p, n)) return true;
  const auto* b = static_cast<const uint8_t*>(p);
  for (const auto& [start, bytes] : s.host_allocations) {
    const auto* base = static_cast<const uint8_t*>(start);
    if (b >= base && static_cast<size_t>(b - base) <= bytes && n <= bytes - static_cast<size_t>(b - base)) return true;
  }
  return false;
}

}  // namespace

extern "C" {

// Page-locks host memory; a range that overlaps one registered, or hipHostMalloc's
// memory, is refused as the runtime refuses it.
FAKE_HIP_EXPORT hipError_t hipHostRegister(void* p, size_t bytes, unsigned int flags) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  const unsigned known = hipHostRegisterPortable | hipHostRegisterMapped | hipHostRegisterIoMemory |
                         hipExtHostRegisterCoarseGrained;
  if (!p || bytes == 0 || (flags & ~known)) return hipErrorInvalidValue;
  const auto* b = static_cast<const uint8_t*>(p);
  auto next = call.s.registered.lower_bound(b);
  if (next != call.s.registered.end() && next->first < b + bytes) return hipErrorHostMemoryAlreadyRegistered;
  if (Registered(call.s, p, 1) || call.s.host_allocations.count(p)) return hipErrorHostMemoryAlreadyRegistered;
  call.s.registered.emplace(b, bytes);
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipHostUnregister(void* p) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (!call.s.registered.count(static_cast<const uint8_t*>(p))) return hipErrorHostMemoryNotRegistered;
  call.s.work.RunAll(call.s);  // as the runtime, it waits for the device first
  call.s.registered.erase(static_cast<const uint8_t*>(p));
  return hipSuccess;
}

// A device range of a copy must lie in one live allocation. Copies run in their stream's
// turn; pageable host memory is taken at the call (read into a staging copy, or, into
// it, after the stream's earlier work).
FAKE_HIP_EXPORT hipError_t hipMemcpyHtoDAsync(hipDeviceptr_t dst, void* src, size_t n, hipStream_t stream) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (hipError_t r = UsableStream(call.s, stream); r != hipSuccess) return r;
  if (!src || !Inside(call.s, dst, n)) return hipErrorInvalidValue;
  if (Registered(call.s, src, n)) ++call.s.registered_copies;
  if (Pinned(call.s, src, n)) {
    call.s.work.Submit(stream, nullptr, [=](State&) { std::memcpy(dst, src, n); });
  } else {
    auto staged = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                         static_cast<const uint8_t*>(src) + n);
    call.s.work.Submit(stream, nullptr, [=](State&) { std::memcpy(dst, staged->data(), n); });
  }
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipMemcpyDtoHAsync(void* dst, hipDeviceptr_t src, size_t n, hipStream_t stream) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (hipError_t r = UsableStream(call.s, stream); r != hipSuccess) return r;
  if (!dst || !Inside(call.s, src, n)) return hipErrorInvalidValue;
  if (Registered(call.s, dst, n)) ++call.s.registered_copies;
  call.s.work.Submit(stream, nullptr, [=](State&) { std::memcpy(dst, src, n); });
  if (!Pinned(call.s, dst, n)) call.s.work.RunQueue(call.s, stream);  // into pageable memory the call waits
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipMemcpyDtoDAsync(hipDeviceptr_t dst, hipDeviceptr_t src, size_t n, hipStream_t stream) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (hipError_t r = UsableStream(call.s, stream); r != hipSuccess) return r;
  if (!Inside(call.s, dst, n) || !Inside(call.s, src, n)) return hipErrorInvalidValue;
  call.s.work.Submit(stream, nullptr, [=](State&) { std::memmove(dst, src, n); });
  return hipSuccess;
}

// Modules and launches.

// For the current device. The image is read as far as its headers say: the runtime takes
// no size.
FAKE_HIP_EXPORT hipError_t hipModuleLoadData(hipModule_t* module, const void* image) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (!module || !image) return hipErrorInvalidValue;
  std::string bytes;
  if (hipError_t r = ReadImage(static_cast<const unsigned char*>(image), &bytes); r != hipSuccess) return r;
  auto m = std::make_unique<ihipModule_t>();
  m->device = t_device;
  m->image = std::move(bytes);
  *module = m.get();
  call.s.modules.emplace(*module, std::move(m));
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipModuleUnload(hipModule_t module) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  auto it = call.s.modules.find(module);
  if (it == call.s.modules.end()) return hipErrorInvalidResourceHandle;
  for (const auto& f : it->second->functions) call.s.functions.erase(f.get());
  call.s.modules.erase(it);
  return call.released();
}

// hipErrorNotFound unless the code object defines the kernel; one handle per name.
FAKE_HIP_EXPORT hipError_t hipModuleGetFunction(hipFunction_t* function, hipModule_t module, const char* name) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (!function || !name) return hipErrorInvalidValue;
  if (!call.s.modules.count(module)) return hipErrorInvalidResourceHandle;
  for (const auto& f : module->functions)
    if (f->name == name) {
      *function = f.get();
      return hipSuccess;
    }
  if (!DefinesKernel(module->image, name)) return hipErrorNotFound;
  auto f = std::make_unique<ihipModuleSymbol_t>(ihipModuleSymbol_t{module, name, {}, {}, 0, 0});
  if (absl::StatusOr<replayd::AmdgpuKernelInfo> info = replayd::ReadAmdgpuKernelInfo(module->image, name, "fake");
      info.ok()) {
    f->arg_sizes = info->arg_sizes;
    f->max_threads = info->max_flat_workgroup_size;
    for (const std::string& kind : info->arg_kinds) f->arg_is_buffer.push_back(kind == "global_buffer");
    // As ROCm's LightningKernel::postLoad aligns a segment: to at least 128 bytes, and to
    // whole cache lines of 64.
    uint64_t align = std::max<uint64_t>(info->kernarg_segment_align, 128);
    align = (align + 63) / 64 * 64;
    f->kernarg_bytes = (info->kernarg_segment_size + align - 1) / align * align;
  }
  module->functions.push_back(std::move(f));
  *function = module->functions.back().get();
  call.s.functions.insert(*function);
  return hipSuccess;
}

// Checks the launch and, in its turn, runs nothing, except that a kernel named "fault",
// one whose module has been unloaded by then, or one with a pointer argument off the
// live allocations by then, faults the device. Like a real launch it
// returns before the kernel runs: the calls that follow report the fault.
FAKE_HIP_EXPORT hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                 unsigned int bx, unsigned int by, unsigned int bz,
                                                 unsigned int shared_bytes, hipStream_t stream, void** params,
                                                 void** extra) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (hipError_t r = UsableStream(call.s, stream); r != hipSuccess) return r;
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  if (hipError_t r = CheckLaunch(call.s, f, grid, block, shared_bytes, params, extra); r != hipSuccess) return r;
  const std::string name = f->name;
  call.s.work.Submit(stream, nullptr, [=, buffers = Buffers(f, params)](State& s) {
    if (name == "fault" || !s.functions.count(f) || !BuffersLive(s, buffers)) s.faulted = true;
  });
  return hipSuccess;
}

// Graphs.

FAKE_HIP_EXPORT hipError_t hipGraphCreate(hipGraph_t* graph, unsigned int flags) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (!graph || flags != 0) return hipErrorInvalidValue;
  auto g = std::make_unique<ihipGraph>();
  *graph = g.get();
  call.s.graphs.emplace(*graph, std::move(g));
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipGraphDestroy(hipGraph_t graph) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (!call.s.graphs.erase(graph)) return hipErrorInvalidValue;
  return call.released();
}

// The kernel's parameters are not read: kernels do not run. func is a hipFunction_t from
// hipModuleGetFunction, which the runtime takes where no host function is registered
// under that pointer.
FAKE_HIP_EXPORT hipError_t hipGraphAddKernelNode(hipGraphNode_t* node, hipGraph_t graph, const hipGraphNode_t* deps,
                                                 size_t n, const hipKernelNodeParams* p) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (!node || !p || !call.s.graphs.count(graph)) return hipErrorInvalidValue;
  if (hipError_t r = CheckDependencies(*graph, deps, n); r != hipSuccess) return r;
  const auto f = static_cast<hipFunction_t>(p->func);
  const unsigned grid[3] = {p->gridDim.x, p->gridDim.y, p->gridDim.z};
  const unsigned block[3] = {p->blockDim.x, p->blockDim.y, p->blockDim.z};
  if (hipError_t r = CheckLaunch(call.s, f, grid, block, p->sharedMemBytes, p->kernelParams, p->extra);
      r != hipSuccess)
    return r;
  auto k = std::make_unique<hipGraphNode>();
  k->function = f;
  k->name = f->name;
  k->device = f->module->device;
  k->buffers = Buffers(f, p->kernelParams);
  k->deps.assign(deps, deps + n);
  *node = k.get();
  graph->nodes.push_back(std::move(k));
  return hipSuccess;
}

// Refuses a copy off the live allocations, address 0 included, as the runtime does.
FAKE_HIP_EXPORT hipError_t hipGraphAddMemcpyNode1D(hipGraphNode_t* node, hipGraph_t graph, const hipGraphNode_t* deps,
                                                   size_t n, void* dst, const void* src, size_t count,
                                                   hipMemcpyKind kind) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (!node || !call.s.graphs.count(graph)) return hipErrorInvalidValue;
  if (hipError_t r = CheckDependencies(*graph, deps, n); r != hipSuccess) return r;
  if (hipError_t r = CheckCopy(call.s, dst, src, count, kind); r != hipSuccess) return r;
  auto c = std::make_unique<hipGraphNode>();
  c->device = t_device;
  c->dst = dst;
  c->src = src;
  c->bytes = count;
  c->deps.assign(deps, deps + n);
  *node = c.get();
  graph->nodes.push_back(std::move(c));
  return hipSuccess;
}

// For the current device; its kernels must still be loaded. Takes an argument segment for
// each kernel node.
FAKE_HIP_EXPORT hipError_t hipGraphInstantiateWithFlags(hipGraphExec_t* exec, hipGraph_t graph,
                                                        unsigned long long flags) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (!exec || !call.s.graphs.count(graph) || (flags & ~0x1ull)) return hipErrorInvalidValue;
  auto e = std::make_unique<hipGraphExec>();
  e->device = t_device;
  uint64_t kernargs = 0;
  for (const auto& node : graph->nodes) {
    if (node->function && !call.s.functions.count(node->function)) return hipErrorInvalidResourceHandle;
    if (node->device != t_device) return hipErrorInvalidDevice;
    kernargs += node->function ? node->function->kernarg_bytes : kCopyKernargBytes;
    e->nodes.emplace_back(node.get(), *node);
  }
  if (hipError_t r = TakeKernargs(call.s, e.get(), kernargs); r != hipSuccess) return r;
  ++call.s.instantiations;
  *exec = e.get();
  call.s.execs.emplace(*exec, std::move(e));
  return hipSuccess;
}

FAKE_HIP_EXPORT hipError_t hipGraphExecDestroy(hipGraphExec_t exec) {
  Call call;
  if (!call.s.initialized) return hipErrorNotInitialized;
  if (!call.s.execs.erase(exec)) return hipErrorInvalidValue;
  return call.released();
}

}  // extern "C"

namespace {

// The instantiated copy of `node` in `exec`, if it has one of the kind asked for.
hipGraphNode* ExecNode(const State& s, hipGraphExec_t exec, hipGraphNode_t node, bool kernel) {
  if (!s.execs.count(exec)) return nullptr;
  for (auto& [handle, n] : exec->nodes)
    if (handle == node) return (n.function != nullptr) == kernel ? &n : nullptr;
  return nullptr;
}

}  // namespace

extern "C" {

// The new function must be of the node's device. Each update takes a new argument
// segment of the exec's, as ROCm's does (rocm-systems#10713): hipErrorOutOfMemory past
// the limit.
FAKE_HIP_EXPORT hipError_t hipGraphExecKernelNodeSetParams(hipGraphExec_t exec, hipGraphNode_t node,
                                                           const hipKernelNodeParams* p) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  hipGraphNode* n = ExecNode(call.s, exec, node, /*kernel=*/true);
  if (!n || !p) return hipErrorInvalidValue;
  const auto f = static_cast<hipFunction_t>(p->func);
  const unsigned grid[3] = {p->gridDim.x, p->gridDim.y, p->gridDim.z};
  const unsigned block[3] = {p->blockDim.x, p->blockDim.y, p->blockDim.z};
  if (hipError_t r = CheckLaunch(call.s, f, grid, block, p->sharedMemBytes, p->kernelParams, p->extra);
      r != hipSuccess)
    return r;
  if (f->module->device != n->device) return hipErrorInvalidValue;
  if (hipError_t r = TakeKernargs(call.s, exec, f->kernarg_bytes); r != hipSuccess) return r;
  n->function = f;
  n->name = f->name;
  n->buffers = Buffers(f, p->kernelParams);
  return hipSuccess;
}

// The new ranges are checked as a new node's are. Like a kernel node's update, each takes
// a new argument segment (the runtime captures the copy's blit kernel again).
FAKE_HIP_EXPORT hipError_t hipGraphExecMemcpyNodeSetParams1D(hipGraphExec_t exec, hipGraphNode_t node, void* dst,
                                                             const void* src, size_t count, hipMemcpyKind kind) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  hipGraphNode* n = ExecNode(call.s, exec, node, /*kernel=*/false);
  if (!n) return hipErrorInvalidValue;
  if (hipError_t r = CheckCopy(call.s, dst, src, count, kind); r != hipSuccess) return r;
  if (hipError_t r = TakeKernargs(call.s, exec, kCopyKernargBytes); r != hipSuccess) return r;
  n->dst = dst;
  n->src = src;
  n->bytes = count;
  return hipSuccess;
}

// Runs the nodes in an order their edges allow (LatestReadyFirst): a memcpy node copies,
// a kernel node does nothing. The device faults, as a GPU would, at a kernel named
// "fault", at a kernel since unloaded or with a pointer argument off the live
// allocations, and at a copy whose memory has been freed since its node was set; the
// launch itself succeeds, and the calls that follow report the fault.
FAKE_HIP_EXPORT hipError_t hipGraphLaunch(hipGraphExec_t exec, hipStream_t stream) {
  Call call;
  if (hipError_t r = call.blocked(); r != hipSuccess) return r;
  if (hipError_t r = UsableStream(call.s, stream); r != hipSuccess) return r;
  if (!call.s.execs.count(exec)) return hipErrorInvalidValue;
  if (exec->device != t_device) return hipErrorInvalidDevice;
  // The nodes as they are now (an update after the launch changes later launches only),
  // in the order a GPU might run them (tests/support/graph_order.h).
  std::vector<hipGraphNode_t> handles;
  for (const auto& [handle, n] : exec->nodes) handles.push_back(handle);
  auto nodes = std::make_shared<std::vector<hipGraphNode>>();
  for (size_t i : replayd::testing::LatestReadyFirst(
           handles, [&](size_t i) -> const std::vector<hipGraphNode_t>& { return exec->nodes[i].second.deps; }))
    nodes->push_back(exec->nodes[i].second);
  call.s.work.Submit(stream, nullptr, [nodes](State& s) {
    for (const hipGraphNode& n : *nodes) {
      if (n.function) {
        if (!s.functions.count(n.function) || n.name == "fault" || !BuffersLive(s, n.buffers)) {
          s.faulted = true;
          return;
        }
        continue;
      }
      if (!Inside(s, n.src, n.bytes) || !Inside(s, n.dst, n.bytes)) {
        s.faulted = true;
        return;
      }
      std::memmove(n.dst, n.src, n.bytes);
    }
  });
  return hipSuccess;
}

// hiprtc: programs that compile nothing (see fake_hip.h).

FAKE_HIP_EXPORT const char* hiprtcGetErrorString(hiprtcResult result) {
  switch (result) {
    case HIPRTC_SUCCESS: return "HIPRTC_SUCCESS";
    case HIPRTC_ERROR_INVALID_INPUT: return "HIPRTC_ERROR_INVALID_INPUT";
    case HIPRTC_ERROR_INVALID_PROGRAM: return "HIPRTC_ERROR_INVALID_PROGRAM";
    case HIPRTC_ERROR_COMPILATION: return "HIPRTC_ERROR_COMPILATION";
    case HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION: return "HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION";
    default: return "HIPRTC_ERROR_INTERNAL_ERROR";
  }
}

FAKE_HIP_EXPORT hiprtcResult hiprtcVersion(int* major, int* minor) {
  if (!major || !minor) return HIPRTC_ERROR_INVALID_INPUT;
  *major = HIP_VERSION_MAJOR;
  *minor = HIP_VERSION_MINOR;
  return HIPRTC_SUCCESS;
}

FAKE_HIP_EXPORT hiprtcResult hiprtcCreateProgram(hiprtcProgram* prog, const char* src, const char* name,
                                                 int num_headers, const char** headers, const char** header_names) {
  if (!prog || !src || num_headers < 0 || (num_headers > 0 && (!headers || !header_names)))
    return HIPRTC_ERROR_INVALID_INPUT;
  (void)name;
  *prog = new _hiprtcProgram();
  return HIPRTC_SUCCESS;
}

FAKE_HIP_EXPORT hiprtcResult hiprtcDestroyProgram(hiprtcProgram* prog) {
  if (!prog || !*prog) return HIPRTC_ERROR_INVALID_INPUT;
  delete *prog;
  *prog = nullptr;
  return HIPRTC_SUCCESS;
}

FAKE_HIP_EXPORT hiprtcResult hiprtcAddNameExpression(hiprtcProgram prog, const char* name_expression) {
  return prog && name_expression ? HIPRTC_SUCCESS : HIPRTC_ERROR_INVALID_INPUT;
}

// Fails, with a log in the form comgr writes (the source named after comgr's scratch file).
FAKE_HIP_EXPORT hiprtcResult hiprtcCompileProgram(hiprtcProgram prog, int num_options, const char** options) {
  if (!prog || num_options < 0 || (num_options > 0 && !options)) return HIPRTC_ERROR_INVALID_INPUT;
  prog->log =
      "/tmp/comgr-fake/input/CompileSource:1:1: error: the fake HIP runtime compiles no hip-c; load a hip-hsaco "
      "code object\n";
  return HIPRTC_ERROR_COMPILATION;
}

FAKE_HIP_EXPORT hiprtcResult hiprtcGetProgramLogSize(hiprtcProgram prog, size_t* size) {
  if (!prog || !size) return HIPRTC_ERROR_INVALID_INPUT;
  *size = prog->log.size() + 1;
  return HIPRTC_SUCCESS;
}

FAKE_HIP_EXPORT hiprtcResult hiprtcGetProgramLog(hiprtcProgram prog, char* log) {
  if (!prog || !log) return HIPRTC_ERROR_INVALID_INPUT;
  std::memcpy(log, prog->log.c_str(), prog->log.size() + 1);
  return HIPRTC_SUCCESS;
}

// No program ever compiles, so none has code or lowered names.
FAKE_HIP_EXPORT hiprtcResult hiprtcGetCodeSize(hiprtcProgram prog, size_t* size) {
  if (!prog || !size) return HIPRTC_ERROR_INVALID_INPUT;
  *size = 0;
  return HIPRTC_ERROR_INVALID_PROGRAM;
}

FAKE_HIP_EXPORT hiprtcResult hiprtcGetCode(hiprtcProgram prog, char* code) {
  return prog && code ? HIPRTC_ERROR_INVALID_PROGRAM : HIPRTC_ERROR_INVALID_INPUT;
}

FAKE_HIP_EXPORT hiprtcResult hiprtcGetLoweredName(hiprtcProgram prog, const char* name_expression,
                                                  const char** lowered_name) {
  if (!prog || !name_expression || !lowered_name) return HIPRTC_ERROR_INVALID_INPUT;
  return HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION;
}

// Test hooks.

FAKE_HIP_EXPORT void fake_hip_reset(void) {
  Call call;
  State& s = call.s;
  Reclaim(s, 0);
  s.reclaimed = 0;
  s.registered_copies = 0;
  s.resets = 0;
  s.faulted = false;
  s.initialized = false;
  s.kernarg_limit = UINT64_MAX;
  s.instantiations = 0;
  t_device = 0;
}

FAKE_HIP_EXPORT void fake_hip_set_kernarg_limit(unsigned long long bytes) {
  Call call;
  call.s.kernarg_limit = bytes;
}

FAKE_HIP_EXPORT int fake_hip_count(const char* what) {
  Call call;
  const State& s = call.s;
  const std::string_view w = what ? what : "";
  if (w == "allocations") return static_cast<int>(s.allocations.size());
  if (w == "host_allocations") return static_cast<int>(s.host_allocations.size());
  if (w == "registered") return static_cast<int>(s.registered.size());
  if (w == "registered_copies") return s.registered_copies;
  if (w == "streams") return static_cast<int>(s.streams.size());
  if (w == "events") return static_cast<int>(s.events.size());
  if (w == "modules") return static_cast<int>(s.modules.size());
  if (w == "graphs") return static_cast<int>(s.graphs.size());
  if (w == "graph_execs") return static_cast<int>(s.execs.size());
  if (w == "instantiations") return s.instantiations;
  if (w == "kernarg_bytes") {
    uint64_t held = 0;
    for (const auto& [handle, e] : s.execs) held += e->kernarg_bytes;
    return static_cast<int>(std::min<uint64_t>(held, INT32_MAX));
  }
  if (w == "reclaimed") return s.reclaimed;
  if (w == "resets") return s.resets;
  if (w == "faulted") return s.faulted ? 1 : 0;
  return -1;
}

}  // extern "C"

namespace {

// Every entry point HipLibrary resolves, taken as the type it stores it as
// (decltype(&::name), or the C form of the overloaded hipMalloc and hipHostMalloc):
// this fails to compile where a definition above is not the header's function.
#define FAKE_HIP_CHECKED(name) reinterpret_cast<const void*>(static_cast<decltype(&::name)>(&::name))
[[maybe_unused]] const void* const kChecked[] = {
    FAKE_HIP_CHECKED(hipInit),
    FAKE_HIP_CHECKED(hipDriverGetVersion),
    FAKE_HIP_CHECKED(hipRuntimeGetVersion),
    FAKE_HIP_CHECKED(hipGetErrorName),
    FAKE_HIP_CHECKED(hipGetErrorString),
    FAKE_HIP_CHECKED(hipGetDeviceCount),
    FAKE_HIP_CHECKED(hipGetDeviceProperties),
    FAKE_HIP_CHECKED(hipDeviceGetAttribute),
    FAKE_HIP_CHECKED(hipDeviceTotalMem),
    FAKE_HIP_CHECKED(hipSetDevice),
    FAKE_HIP_CHECKED(hipDeviceReset),
    FAKE_HIP_CHECKED(hipStreamCreateWithFlags),
    FAKE_HIP_CHECKED(hipStreamDestroy),
    FAKE_HIP_CHECKED(hipStreamSynchronize),
    reinterpret_cast<const void*>(static_cast<hipError_t (*)(void**, size_t)>(&::hipMalloc)),
    FAKE_HIP_CHECKED(hipFree),
    FAKE_HIP_CHECKED(hipMemsetAsync),
    reinterpret_cast<const void*>(static_cast<hipError_t (*)(void**, size_t, unsigned int)>(&::hipHostMalloc)),
    FAKE_HIP_CHECKED(hipHostFree),
    FAKE_HIP_CHECKED(hipHostRegister),
    FAKE_HIP_CHECKED(hipHostUnregister),
    FAKE_HIP_CHECKED(hipMemcpyHtoDAsync),
    FAKE_HIP_CHECKED(hipMemcpyDtoHAsync),
    FAKE_HIP_CHECKED(hipMemcpyDtoDAsync),
    FAKE_HIP_CHECKED(hipModuleLoadData),
    FAKE_HIP_CHECKED(hipModuleUnload),
    FAKE_HIP_CHECKED(hipModuleGetFunction),
    FAKE_HIP_CHECKED(hipModuleLaunchKernel),
    FAKE_HIP_CHECKED(hipEventCreateWithFlags),
    FAKE_HIP_CHECKED(hipEventDestroy),
    FAKE_HIP_CHECKED(hipEventRecord),
    FAKE_HIP_CHECKED(hipEventSynchronize),
    FAKE_HIP_CHECKED(hipEventElapsedTime),
    FAKE_HIP_CHECKED(hipGraphCreate),
    FAKE_HIP_CHECKED(hipGraphDestroy),
    FAKE_HIP_CHECKED(hipGraphAddKernelNode),
    FAKE_HIP_CHECKED(hipGraphAddMemcpyNode1D),
    FAKE_HIP_CHECKED(hipGraphInstantiateWithFlags),
    FAKE_HIP_CHECKED(hipGraphExecDestroy),
    FAKE_HIP_CHECKED(hipGraphExecKernelNodeSetParams),
    FAKE_HIP_CHECKED(hipGraphExecMemcpyNodeSetParams1D),
    FAKE_HIP_CHECKED(hipGraphLaunch),
    FAKE_HIP_CHECKED(hiprtcGetErrorString),
    FAKE_HIP_CHECKED(hiprtcVersion),
    FAKE_HIP_CHECKED(hiprtcCreateProgram),
    FAKE_HIP_CHECKED(hiprtcDestroyProgram),
    FAKE_HIP_CHECKED(hiprtcAddNameExpression),
    FAKE_HIP_CHECKED(hiprtcCompileProgram),
    FAKE_HIP_CHECKED(hiprtcGetProgramLogSize),
    FAKE_HIP_CHECKED(hiprtcGetProgramLog),
    FAKE_HIP_CHECKED(hiprtcGetCodeSize),
    FAKE_HIP_CHECKED(hiprtcGetCode),
    FAKE_HIP_CHECKED(hiprtcGetLoweredName),
};
#undef FAKE_HIP_CHECKED

}  // namespace

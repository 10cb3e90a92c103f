// The fake CUDA driver library; what it promises is in fake_cuda.h.
//
// Its state is the process's, as the real driver's is: one State behind one lock, and a
// context stack per thread. Each entry point is a function of this file with exactly the
// prototype cuda.h declares for it (checked at compile time where kEntries names it), and
// reached only through cuGetProcAddress_v2, as CudaLibrary reaches the real ones. The
// library exports that function, cuDriverGetVersion and the test hooks, nothing else.
//
// Where the fake is stricter or narrower than the driver, it says so at the function:
// handles are checked, streams, events and functions must belong to the current context,
// fresh device memory holds garbage, and memcpy nodes are 1D device-to-device copies.
#include "tests/support/fake_cuda/fake_cuda.h"
#include "tests/support/device_queues.h"
#include "tests/support/graph_order.h"

#include <cuda.h>
#include <elf.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#define FAKE_CUDA_EXPORT __attribute__((visibility("default")))

// cuda.h's opaque handle types, completed here.
struct CUctx_st {
  bool primary = false;
  bool alive = true;
};
struct CUstream_st {
  CUcontext ctx;
};
struct CUevent_st {
  CUcontext ctx;
  unsigned flags;
  bool recorded = false;
  std::chrono::steady_clock::time_point at;
  const void* queue = nullptr;  // the stream's work queue it was recorded on (QueueOf)
  uint64_t after = 0;           // the last work submitted before it was recorded
};
// A kernel parameter as the module's image lays it out.
struct KernelParam {
  size_t offset = 0;
  size_t size = 0;
};
// What the fake knows of a kernel from its module's image.
struct KernelInfo {
  std::vector<KernelParam> params;
  unsigned max_threads = 1024;  // a block's, from its launch bounds (.maxntid, .reqntid)
};
struct CUfunc_st {
  CUmodule module;
  std::string name;
  KernelInfo info;
};
struct CUmod_st {
  CUcontext ctx;
  std::string image;
  std::vector<std::unique_ptr<CUfunc_st>> functions;
};
// A node as a graph holds it, and as an instantiated graph copies it.
struct CUgraphNode_st {
  CUfunction function = nullptr;  // a kernel node's; null for a memcpy node
  std::string name;               // the kernel's, kept for launches after an unload
  CUcontext ctx = nullptr;        // the kernel's module's context, or the memcpy node's
  CUDA_MEMCPY3D copy{};           // a memcpy node's
  std::vector<CUgraphNode> deps;  // the nodes it depends on (its edges)
  // An instantiated memcpy node's operands as they were at the instantiation: the
  // allocations (by their serial numbers) its source and destination lay in.
  uint64_t original_src = 0, original_dst = 0;
  bool original_1d = true;
};
struct CUgraph_st {
  std::vector<std::unique_ptr<CUgraphNode_st>> nodes;  // in creation order, which is a topological one
};
struct CUgraphExec_st {
  CUcontext ctx;  // current at instantiation
  // Each node's handle in the graph and a copy of the node, in the graph's order.
  std::vector<std::pair<CUgraphNode, CUgraphNode_st>> nodes;
};

namespace {

constexpr int kVersion = CUDA_VERSION;  // the driver of the toolkit the fake is built with: 13000 for CUDA 13.0
constexpr char kName[] = "Fake H200";
constexpr size_t kTotalMemory = size_t{1} << 30;
constexpr unsigned kMaxGrid[3] = {2147483647, 65535, 65535};
constexpr unsigned kMaxBlock[3] = {1024, 1024, 64};
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxSharedPerBlock = 48 << 10;
constexpr int kSm = 90;
constexpr size_t kAlignment = 256;  // cuMemAlloc's, at least
constexpr uint64_t kMaxPitch = 2147483647;  // an H200's CU_DEVICE_ATTRIBUTE_MAX_PITCH

struct Allocation {
  size_t bytes;
  CUcontext ctx;
  uint64_t serial;  // never reused, where addresses are
};

struct State {
  std::mutex mu;
  bool initialized = false;
  bool faulted = false;
  // Never shrinks, not even on reset: a thread's stack may still hold a context after it
  // ended, and reading its `alive` must stay valid.
  std::vector<std::unique_ptr<CUctx_st>> contexts;
  CUcontext primary = nullptr;  // the device's primary context; alive while retained
  int primary_refs = 0;
  std::map<CUdeviceptr, Allocation> allocations;  // by base address
  size_t allocated = 0;
  uint64_t allocation_serial = 0;
  struct HostAllocation {
    CUcontext ctx;
    size_t bytes;
  };
  std::unordered_map<void*, HostAllocation> host_allocations;  // cuMemHostAlloc's, by start
  struct Registered {
    size_t bytes;
    CUcontext ctx;
  };
  std::map<const uint8_t*, Registered> registered;  // cuMemHostRegister's, by start
  int registered_copies = 0;  // host <-> device copies from or into registered memory
  std::unordered_map<CUstream, std::unique_ptr<CUstream_st>> streams;
  std::unordered_map<CUevent, std::unique_ptr<CUevent_st>> events;
  std::unordered_map<CUmodule, std::unique_ptr<CUmod_st>> modules;
  std::unordered_set<CUfunction> functions;
  std::unordered_map<CUgraph, std::unique_ptr<CUgraph_st>> graphs;
  std::unordered_map<CUgraphExec, std::unique_ptr<CUgraphExec_st>> execs;
  int reclaimed = 0;
  uint64_t max_pitch = kMaxPitch;  // fake_cuda_set_max_pitch's
  // fake_cuda_set_compute_mode's: the device's CUcomputemode, and whether another process
  // holds the device (which refuses this one a context in exclusive-process mode).
  CUcomputemode compute_mode = CU_COMPUTEMODE_DEFAULT;
  bool held_elsewhere = false;
  int driver_version = kVersion;   // fake_cuda_set_driver_version's
  CUresult fault_error = CUDA_ERROR_ILLEGAL_ADDRESS;  // what the sticky fault answers: fake_cuda_set_fault_error's
  // Work submitted to a stream and not yet run, by the stream's queue (QueueOf), its
  // owner the context.
  replayd::testing::DeviceQueues<State> work;
};

// Never destroyed: the daemon's threads may call the library until the process exits.
State& S() {
  static State* state = new State();
  return *state;
}

// The calling thread's context stack, its top the current context.
thread_local std::vector<CUcontext> t_stack;

// One call of the library, holding its lock throughout.
struct Call {
  std::lock_guard<std::mutex> lock{S().mu};
  State& s = S();

  // Why a call that uses the device cannot start: the library is not initialised, or the
  // sticky fault. CUDA_SUCCESS when it can.
  CUresult blocked() const {
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (s.faulted) return s.fault_error;
    return CUDA_SUCCESS;
  }
  // What a release answers once it has released: it still releases after the sticky
  // fault, but says the device is lost.
  CUresult released() const { return s.faulted ? s.fault_error : CUDA_SUCCESS; }
};

bool KnownContext(const State& s, CUcontext ctx) {
  for (const auto& c : s.contexts)
    if (c.get() == ctx) return true;
  return false;
}

// The calling thread's current context into *ctx.
CUresult Current(CUcontext* ctx) {
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (!t_stack.back()->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *ctx = t_stack.back();
  return CUDA_SUCCESS;
}

// A stream the calling thread may use, into *ctx its context: the default stream of the
// current context, or a live stream of it. (Stricter than the driver, which accepts some
// streams of other contexts: replayd binds a session's context before every use.)
CUresult UsableStream(const State& s, CUstream stream, CUcontext* ctx) {
  if (CUresult r = Current(ctx); r != CUDA_SUCCESS) return r;
  if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return CUDA_SUCCESS;
  if (!s.streams.count(stream)) return CUDA_ERROR_INVALID_HANDLE;
  return stream->ctx == *ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

bool IsDefaultStream(CUstream stream) {
  return !stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

// The work queue of `stream` (of context `ctx`): its own, or the context's for the
// default stream.
const void* QueueOf(CUstream stream, CUcontext ctx) {
  return IsDefaultStream(stream) ? static_cast<const void*>(ctx) : static_cast<const void*>(stream);
}

// Whether host range [p, p + n) is page-locked (cuMemHostRegister's or cuMemHostAlloc's):
// the driver copies from and into such memory by DMA, when the copy's turn comes, where
// it takes pageable memory at the call.
bool Pinned(const State& s, const void* p, size_t n);

// Whether [address, address + bytes) lies in one live allocation, of `ctx` unless it is
// null. Address 0 never does.
bool Inside(const State& s, CUdeviceptr address, size_t bytes, CUcontext ctx) {
  if (address == 0) return false;
  auto it = s.allocations.upper_bound(address);
  if (it == s.allocations.begin()) return false;
  --it;
  const size_t offset = address - it->first;
  if (offset > it->second.bytes || bytes > it->second.bytes - offset) return false;
  return !ctx || it->second.ctx == ctx;
}

// The serial number of the live allocation that holds `address`; 0 when none does.
uint64_t AllocationAt(const State& s, CUdeviceptr address) {
  auto it = s.allocations.upper_bound(address);
  if (address == 0 || it == s.allocations.begin()) return 0;
  --it;
  return address - it->first < it->second.bytes ? it->second.serial : 0;
}

// Launch dimensions within an H200's limits, a live function, and the argument forms
// the driver accepts.
CUresult CheckLaunch(const State& s, CUfunction f, const unsigned grid[3], const unsigned block[3],
                     unsigned shared_bytes, void** params, void** extra) {
  if (!f || !s.functions.count(f)) return CUDA_ERROR_INVALID_HANDLE;
  uint64_t threads = 1;
  for (int d = 0; d < 3; ++d) {
    if (grid[d] == 0 || grid[d] > kMaxGrid[d] || block[d] == 0 || block[d] > kMaxBlock[d])
      return CUDA_ERROR_INVALID_VALUE;
    threads *= block[d];
  }
  if (threads > kMaxThreadsPerBlock || threads > f->info.max_threads || shared_bytes > kMaxSharedPerBlock)
    return CUDA_ERROR_INVALID_VALUE;
  if (params && extra) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// The bytes a copy's rows span from its start on one side (pitch `pitch`); more than any
// allocation holds when that does not fit in an address.
uint64_t Span(const CUDA_MEMCPY3D& p, size_t pitch) {
  if (p.Height == 0) return 0;
  if (p.Height - 1 > (UINT64_MAX - p.WidthInBytes) / std::max<size_t>(pitch, 1)) return UINT64_MAX;
  return (p.Height - 1) * pitch + p.WidthInBytes;
}

// A memcpy node's parameters, as replayd makes them: a 1D or 2D copy between two ranges
// of device memory that lie in live allocations of `ctx` (the driver refuses a memcpy
// node on an address it does not know, 0 included), each pitch at least the width and
// at most the device's CU_DEVICE_ATTRIBUTE_MAX_PITCH, as cuMemcpy2D's and cuMemcpy3D's
// documentation asks. Other shapes and memory types, which the driver supports, the
// fake does not.
CUresult CheckCopy(const State& s, const CUDA_MEMCPY3D* p, CUcontext ctx) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  if (p->srcMemoryType != CU_MEMORYTYPE_DEVICE || p->dstMemoryType != CU_MEMORYTYPE_DEVICE || p->Depth != 1 ||
      p->srcY || p->srcZ || p->srcLOD || p->dstY || p->dstZ || p->dstLOD)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (!p->srcDevice || !p->dstDevice || p->Height == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t pitch : {p->srcPitch, p->dstPitch})
    if (pitch > s.max_pitch) return CUDA_ERROR_INVALID_VALUE;
  if (p->srcPitch < p->WidthInBytes + p->srcXInBytes || p->dstPitch < p->WidthInBytes + p->dstXInBytes)
    return CUDA_ERROR_INVALID_VALUE;
  if (!Inside(s, p->srcDevice + p->srcXInBytes, Span(*p, p->srcPitch), ctx) ||
      !Inside(s, p->dstDevice + p->dstXInBytes, Span(*p, p->dstPitch), ctx))
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// Dependencies must be nodes of `graph`, none named twice (cuGraphAddKernelNode's and
// cuGraphAddMemcpyNode's documentation: "dependencies may not have any duplicate entries").
CUresult CheckDependencies(const CUgraph_st& graph, const CUgraphNode* deps, size_t n) {
  if (n > 0 && !deps) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; ++i) {
    auto same = [&](const std::unique_ptr<CUgraphNode_st>& node) { return node.get() == deps[i]; };
    if (std::none_of(graph.nodes.begin(), graph.nodes.end(), same)) return CUDA_ERROR_INVALID_VALUE;
    if (std::find(deps, deps + i, deps[i]) != deps + i) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// Frees what a context still owned when it ends, as the driver does, counting each.
void Reclaim(State& s, CUcontext ctx) {
  for (auto it = s.allocations.begin(); it != s.allocations.end();) {
    if (it->second.ctx != ctx) {
      ++it;
      continue;
    }
    s.allocated -= it->second.bytes;
    std::free(reinterpret_cast<void*>(it->first));
    it = s.allocations.erase(it);
    ++s.reclaimed;
  }
  for (auto it = s.host_allocations.begin(); it != s.host_allocations.end();) {
    if (it->second.ctx != ctx) {
      ++it;
      continue;
    }
    std::free(it->first);
    it = s.host_allocations.erase(it);
    ++s.reclaimed;
  }
  for (auto it = s.registered.begin(); it != s.registered.end();) {
    if (it->second.ctx != ctx) {
      ++it;
      continue;
    }
    it = s.registered.erase(it);
    ++s.reclaimed;
  }
  auto drop = [&](auto& objects, auto before_erase) {
    for (auto it = objects.begin(); it != objects.end();) {
      if (it->second->ctx != ctx) {
        ++it;
        continue;
      }
      before_erase(*it->second);
      it = objects.erase(it);
      ++s.reclaimed;
    }
  };
  drop(s.streams, [](CUstream_st&) {});
  drop(s.events, [](CUevent_st&) {});
  drop(s.modules, [&](CUmod_st& m) {
    for (const auto& f : m.functions) s.functions.erase(f.get());
  });
}

void* AlignedAlloc(size_t alignment, size_t bytes) {
  return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
}

// Writes `message` into the JIT error log buffer among `options`, if one is given.
void WriteErrorLog(unsigned n, const CUjit_option* options, void* const* values, const std::string& message) {
  char* buffer = nullptr;
  size_t size = 0;
  for (unsigned i = 0; i < n; ++i) {
    if (options[i] == CU_JIT_ERROR_LOG_BUFFER) buffer = static_cast<char*>(values[i]);
    if (options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) size = reinterpret_cast<uintptr_t>(values[i]);
  }
  if (!buffer || size == 0) return;
  const size_t len = std::min(message.size(), size - 1);
  std::memcpy(buffer, message.data(), len);
  buffer[len] = '\0';
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

// Takes a module image as the driver would: a cubin for this device's architecture
// (sm_90, or another 9.x no newer than the device), or PTX for one no newer. On failure
// the error and what the JIT log says.
CUresult ReadImage(const void* image, std::string* bytes, std::string* log) {
  const auto* p = static_cast<const unsigned char*>(image);
  // Byte by byte, so that a short PTX text is not read past its end.
  if (p[EI_MAG0] == ELFMAG0 && p[EI_MAG1] == ELFMAG1 && p[EI_MAG2] == ELFMAG2 && p[EI_MAG3] == ELFMAG3) {
    if (p[EI_CLASS] != ELFCLASS64) {
      *log = "not a 64-bit ELF image";
      return CUDA_ERROR_INVALID_IMAGE;
    }
    Elf64_Ehdr h;
    std::memcpy(&h, p, sizeof h);
    if (h.e_machine != EM_CUDA) {
      *log = "an ELF image for machine " + std::to_string(h.e_machine) + ", not EM_CUDA";
      return CUDA_ERROR_INVALID_IMAGE;
    }
    // CUDA ELF ABI version 8 keeps the SM version in bits 8-15 of e_flags; before, bits 0-7.
    const int sm = p[EI_ABIVERSION] >= 8 ? (h.e_flags >> 8) & 0xff : h.e_flags & 0xff;
    if (sm / 10 != kSm / 10 || sm > kSm) {
      *log = "a cubin for sm_" + std::to_string(sm) + " does not run on sm_" + std::to_string(kSm);
      return CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    bytes->assign(reinterpret_cast<const char*>(p), ElfExtent(p));
    return CUDA_SUCCESS;
  }
  const std::string_view text(static_cast<const char*>(image));
  const size_t target = text.find(".target ");
  if (text.find(".version ") == std::string_view::npos || target == std::string_view::npos) {
    *log = "ptxas fatal: neither a cubin nor PTX (no .version and .target)";
    return CUDA_ERROR_INVALID_PTX;
  }
  const size_t digits = text.find_first_of("0123456789", target);
  const int arch = digits == std::string_view::npos ? 0 : std::atoi(text.data() + digits);
  if (arch > kSm) {
    *log = "PTX for sm_" + std::to_string(arch) + " does not run on sm_" + std::to_string(kSm);
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  }
  bytes->assign(text);
  return CUDA_SUCCESS;
}

// Whether a module image defines a kernel named `name`: a PTX .entry, or a cubin's symbol.
bool DefinesKernel(const std::string& image, const std::string& name) {
  if (image.compare(0, SELFMAG, ELFMAG) == 0) return image.find('\0' + name + '\0') != std::string::npos;
  for (size_t at = image.find(".entry " + name); at != std::string::npos; at = image.find(".entry " + name, at + 1)) {
    const size_t end = at + 7 + name.size();
    if (end < image.size() && (image[end] == '(' || std::isspace(static_cast<unsigned char>(image[end])))) return true;
  }
  return false;
}

// PTX kernel `name` from its `.entry name(...)` list, each parameter
// `.param [.ptr .global .align N] .TYPE name[COUNT]` laid out at its alignment, and the
// `.maxntid X[, Y[, Z]]` or `.reqntid` that follows it. Nullopt when the list cannot be
// read.
std::optional<KernelInfo> PtxKernelInfo(const std::string& image, const std::string& name) {
  for (size_t at = image.find(".entry " + name); at != std::string::npos; at = image.find(".entry " + name, at + 1)) {
    size_t i = at + 7 + name.size();
    while (i < image.size() && std::isspace(static_cast<unsigned char>(image[i]))) ++i;
    if (i >= image.size() || image[i] != '(') continue;
    const size_t close = image.find(')', i);
    if (close == std::string::npos) return std::nullopt;
    std::vector<KernelParam> params;
    size_t end = 0;
    std::string_view list(image.data() + i + 1, close - i - 1);
    while (!list.empty()) {
      const size_t comma = list.find(',');
      std::string_view decl = list.substr(0, comma);
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      size_t element = 0, align = 1, count = 1;
      bool align_next = false;  // after .align, its number
      std::string word;
      auto take = [&](std::string_view w) {
        if (w.empty()) return true;
        if (w == ".param" || w == ".ptr" || w == ".global" || w == ".const" || w == ".shared" || w == ".local")
          return true;
        if (w == ".align") {
          align_next = true;
          return true;
        }
        if (align_next) {
          align_next = false;
          align = std::strtoul(std::string(w).c_str(), nullptr, 10);
          return align > 0;
        }
        if (w[0] == '.' && element == 0) {
          const std::string_view digits = w.substr(2);
          const unsigned long bits = std::strtoul(std::string(digits).c_str(), nullptr, 10);
          if (bits % 8 != 0 || bits == 0) return false;
          element = bits / 8;
          return true;
        }
        if (element == 0) return false;  // the name before the type
        const size_t bracket = w.find('[');
        if (bracket != std::string_view::npos) count = std::strtoul(std::string(w.substr(bracket + 1)).c_str(), nullptr, 10);
        return count > 0;
      };
      for (char c : decl) {
        if (std::isspace(static_cast<unsigned char>(c))) {
          if (!take(word)) return std::nullopt;
          word.clear();
        } else {
          word += c;
        }
      }
      if (!take(word) || element == 0) return std::nullopt;
      const size_t alignment = std::max<size_t>(align, element);
      const size_t offset = (end + alignment - 1) / alignment * alignment;
      params.push_back({offset, element * count});
      end = offset + element * count;
    }
    KernelInfo info{std::move(params)};
    const size_t body = image.find('{', close);
    const std::string_view directives(image.data() + close, (body == std::string::npos ? image.size() : body) - close);
    for (const char* bound : {".maxntid", ".reqntid"}) {
      const size_t at = directives.find(bound);
      if (at == std::string_view::npos) continue;
      uint64_t threads = 1;
      const char* p = directives.data() + at + std::strlen(bound);
      for (int d = 0; d < 3; ++d) {
        char* after = nullptr;
        const unsigned long n = std::strtoul(p, &after, 10);
        if (after == p) break;
        threads *= n;
        p = after;
        while (*p == ' ' || *p == '\t') ++p;
        if (*p != ',') break;
        ++p;
      }
      info.max_threads = static_cast<unsigned>(std::min<uint64_t>(info.max_threads, threads));
    }
    return info;
  }
  return std::nullopt;
}

// Cubin kernel `name` from its `.nv.info.<name>` section: records of a format byte (2
// and 3: a 1- or 2-byte value in the record's 4 bytes; 4: a 2-byte size, then that many
// bytes) and an attribute byte. KPARAM_INFO (0x17) gives a parameter's ordinal and
// offset (2 bytes each, after a 4-byte index) and its size (bits 18 and up of the next 4
// bytes); MAX_THREADS (0x05) the launch bounds, X, Y and Z in 4 bytes each. Nullopt when
// the section is missing or does not parse.
std::optional<KernelInfo> CubinKernelInfo(const std::string& image, const std::string& name) {
  Elf64_Ehdr eh;
  if (image.size() < sizeof eh) return std::nullopt;
  std::memcpy(&eh, image.data(), sizeof eh);
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > image.size() ||
      uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr) > image.size() - eh.e_shoff || eh.e_shstrndx >= eh.e_shnum)
    return std::nullopt;
  auto section = [&](size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, image.data() + eh.e_shoff + i * sizeof sh, sizeof sh);
    return sh;
  };
  auto bytes = [&](const Elf64_Shdr& sh) -> std::optional<std::string_view> {
    if (sh.sh_offset > image.size() || sh.sh_size > image.size() - sh.sh_offset) return std::nullopt;
    return std::string_view(image.data() + sh.sh_offset, sh.sh_size);
  };
  const std::optional<std::string_view> names = bytes(section(eh.e_shstrndx));
  if (!names) return std::nullopt;
  const std::string wanted = ".nv.info." + name;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr sh = section(i);
    if (sh.sh_name >= names->size() || names->substr(sh.sh_name).substr(0, wanted.size() + 1) != wanted + '\0')
      continue;
    const std::optional<std::string_view> info = bytes(sh);
    if (!info) return std::nullopt;
    std::map<uint16_t, KernelParam> by_ordinal;
    KernelInfo kernel;
    for (size_t at = 0; at < info->size();) {
      if (info->size() - at < 4) return std::nullopt;
      const uint8_t format = (*info)[at], attribute = (*info)[at + 1];
      uint16_t size = 0;
      std::memcpy(&size, info->data() + at + 2, 2);
      if (format == 2 || format == 3) {
        at += 4;
        continue;
      }
      if (format != 4 || info->size() - at - 4 < size) return std::nullopt;
      if (attribute == 0x17) {
        if (size < 12) return std::nullopt;
        uint16_t ordinal = 0, offset = 0;
        uint32_t packed = 0;
        std::memcpy(&ordinal, info->data() + at + 8, 2);
        std::memcpy(&offset, info->data() + at + 10, 2);
        std::memcpy(&packed, info->data() + at + 12, 4);
        by_ordinal[ordinal] = KernelParam{offset, packed >> 18};
      } else if (attribute == 0x05) {
        if (size < 12) return std::nullopt;
        uint32_t xyz[3];
        std::memcpy(xyz, info->data() + at + 4, sizeof xyz);
        kernel.max_threads =
            static_cast<unsigned>(std::min<uint64_t>(kernel.max_threads, uint64_t{xyz[0]} * xyz[1] * xyz[2]));
      }
      at += 4 + size;
    }
    for (const auto& [ordinal, param] : by_ordinal) {
      if (ordinal != kernel.params.size()) return std::nullopt;
      kernel.params.push_back(param);
    }
    return kernel;
  }
  return std::nullopt;
}

// Reads what the driver reads of a launch's kernelParams: one pointer per parameter of
// `f`, and each parameter's bytes through it. Too short an array, or a value shorter
// than the parameter, is a read past its end (which a sanitized build reports).
CUresult ReadParams(CUfunction f, void** params, void** extra) {
  if (extra) return CUDA_SUCCESS;  // CheckLaunch has refused both at once
  const std::vector<KernelParam>& kernel_params = f->info.params;
  if (!kernel_params.empty() && !params) return CUDA_ERROR_INVALID_VALUE;
  static volatile uint8_t sink;
  for (size_t i = 0; i < kernel_params.size(); ++i) {
    if (!params[i]) return CUDA_ERROR_INVALID_VALUE;
    uint8_t value[4096];
    std::memcpy(value, params[i], std::min(kernel_params[i].size, sizeof value));
    sink = sink ^ value[0];
  }
  return CUDA_SUCCESS;
}

// Initialisation, version, errors and the device: none of these needs a context, so the
// sticky fault does not stop them.

CUresult Init(unsigned flags) {
  Call call;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  call.s.initialized = true;
  return CUDA_SUCCESS;
}

// Before cuInit too, as the driver answers it.
CUresult DriverGetVersion(int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  Call call;
  *version = call.s.driver_version;
  return CUDA_SUCCESS;
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the device"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_CONTAINED, "CUDA_ERROR_CONTAINED", "an error was contained by the GPU's error containment"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {CUDA_ERROR_TENSOR_MEMORY_LEAK, "CUDA_ERROR_TENSOR_MEMORY_LEAK", "tensor memory was not freed"},
    {CUDA_ERROR_MPS_CLIENT_TERMINATED, "CUDA_ERROR_MPS_CLIENT_TERMINATED", "the MPS client was terminated"},
    {CUDA_ERROR_EXTERNAL_DEVICE, "CUDA_ERROR_EXTERNAL_DEVICE", "an external device encountered an error"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

// An unknown code is CUDA_ERROR_INVALID_VALUE with *str null, as the driver answers.
CUresult LookUpError(CUresult error, const char** str, bool name) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorText& e : kErrors)
    if (e.code == error) {
      *str = name ? e.name : e.text;
      return CUDA_SUCCESS;
    }
  *str = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}
CUresult GetErrorName(CUresult error, const char** str) { return LookUpError(error, str, true); }
CUresult GetErrorString(CUresult error, const char** str) { return LookUpError(error, str, false); }

CUresult DeviceGetCount(int* count) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = 1;
  return CUDA_SUCCESS;
}

CUresult DeviceGet(CUdevice* device, int ordinal) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}

CUresult DeviceGetName(char* name, int len, CUdevice dev) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t n = std::min(sizeof kName - 1, static_cast<size_t>(len) - 1);
  std::memcpy(name, kName, n);
  name[n] = '\0';
  return CUDA_SUCCESS;
}

CUresult DeviceTotalMem(size_t* bytes, CUdevice dev) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  *bytes = kTotalMemory;
  return CUDA_SUCCESS;
}

CUresult DeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice dev) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!value || attribute <= 0 || attribute >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = kMaxThreadsPerBlock; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *value = static_cast<int>(call.s.max_pitch); break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *value = call.s.compute_mode; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *value = kMaxBlock[0]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *value = kMaxBlock[1]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *value = kMaxBlock[2]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *value = kMaxGrid[0]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *value = kMaxGrid[1]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *value = kMaxGrid[2]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = kMaxSharedPerBlock; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 132; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = kSm / 10; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = kSm % 10; break;
    default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}

// Contexts.

// Whether the compute mode lets this process make a context: never in prohibited mode
// (CUDA_ERROR_UNKNOWN, as cuCtxCreate's and cuDevicePrimaryCtxRetain's documentation
// says), and in exclusive-process mode only while no other process holds the device.
CUresult ContextAllowed(const State& s) {
  if (s.compute_mode == CU_COMPUTEMODE_PROHIBITED) return CUDA_ERROR_UNKNOWN;
  if (s.compute_mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS && s.held_elsewhere) return CUDA_ERROR_DEVICE_UNAVAILABLE;
  return CUDA_SUCCESS;
}

// Creates a context and pushes it on the calling thread's stack, as the driver does.
// The fake makes plain contexts only: no creation parameters.
CUresult CtxCreate(CUcontext* pctx, CUctxCreateParams* params, unsigned flags, CUdevice dev) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (!pctx || (flags & ~unsigned{CU_CTX_FLAGS_MASK})) return CUDA_ERROR_INVALID_VALUE;
  if (params) return CUDA_ERROR_NOT_SUPPORTED;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (CUresult r = ContextAllowed(call.s); r != CUDA_SUCCESS) return r;
  call.s.contexts.push_back(std::make_unique<CUctx_st>());
  *pctx = call.s.contexts.back().get();
  t_stack.push_back(*pctx);
  return CUDA_SUCCESS;
}

// Ends a created context (not the primary one) and what it still owns; pops it when it
// is current on the calling thread.
CUresult CtxDestroy(CUcontext ctx) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ctx || !KnownContext(call.s, ctx) || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  call.s.work.RunAll(call.s, ctx);  // the context's end waits for its work
  Reclaim(call.s, ctx);
  ctx->alive = false;
  if (!t_stack.empty() && t_stack.back() == ctx) t_stack.pop_back();
  return call.released();
}

// Replaces the top of the calling thread's stack, or pushes onto an empty one; null pops.
CUresult CtxSetCurrent(CUcontext ctx) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (!ctx) {
    if (!t_stack.empty()) t_stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (!KnownContext(call.s, ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (t_stack.empty()) {
    t_stack.push_back(ctx);
  } else {
    t_stack.back() = ctx;
  }
  return CUDA_SUCCESS;
}

CUresult CtxPopCurrent(CUcontext* pctx) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = t_stack.back();
  t_stack.pop_back();
  return CUDA_SUCCESS;
}

// Counts a reference to the device's primary context, which stays one handle; does not
// make it current.
CUresult DevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  State& s = call.s;
  if (!s.primary || !s.primary->alive)
    if (CUresult r = ContextAllowed(s); r != CUDA_SUCCESS) return r;
  if (!s.primary) {
    s.contexts.push_back(std::make_unique<CUctx_st>());
    s.primary = s.contexts.back().get();
    s.primary->primary = true;
  }
  s.primary->alive = true;
  ++s.primary_refs;
  *pctx = s.primary;
  return CUDA_SUCCESS;
}

// The last release ends the primary context and what it still owns.
CUresult DevicePrimaryCtxRelease(CUdevice dev) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  State& s = call.s;
  if (s.primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--s.primary_refs == 0) {
    s.work.RunAll(s, s.primary);
    Reclaim(s, s.primary);
    s.primary->alive = false;
  }
  return call.released();
}

// Streams and events.

CUresult StreamCreate(CUstream* stream, unsigned flags) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = Current(&ctx); r != CUDA_SUCCESS) return r;
  if (!stream || (flags & ~unsigned{CU_STREAM_NON_BLOCKING})) return CUDA_ERROR_INVALID_VALUE;
  auto st = std::make_unique<CUstream_st>(CUstream_st{ctx});
  *stream = st.get();
  call.s.streams.emplace(*stream, std::move(st));
  return CUDA_SUCCESS;
}

CUresult StreamDestroy(CUstream stream) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!call.s.streams.count(stream)) return CUDA_ERROR_INVALID_HANDLE;
  call.s.work.RunQueue(call.s, stream);  // what it holds still runs, as on a GPU
  call.s.streams.erase(stream);
  return call.released();
}

// Runs the stream's work; the default stream's waits for the context's every stream (the
// legacy default stream, with blocking streams). A fault in that work is reported here.
CUresult StreamSynchronize(CUstream stream) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (IsDefaultStream(stream)) {
    if (CUresult r = Current(&ctx); r != CUDA_SUCCESS) return r;
    call.s.work.RunAll(call.s, ctx);
  } else {
    if (!call.s.streams.count(stream)) return CUDA_ERROR_INVALID_HANDLE;
    call.s.work.RunQueue(call.s, stream);
  }
  return call.blocked();
}

CUresult EventCreate(CUevent* event, unsigned flags) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = Current(&ctx); r != CUDA_SUCCESS) return r;
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (!event || (flags & ~known) || ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
    return CUDA_ERROR_INVALID_VALUE;
  auto e = std::make_unique<CUevent_st>(CUevent_st{ctx, flags, false, {}});
  *event = e.get();
  call.s.events.emplace(*event, std::move(e));
  return CUDA_SUCCESS;
}

CUresult EventDestroy(CUevent event) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!call.s.events.erase(event)) return CUDA_ERROR_INVALID_HANDLE;
  return call.released();
}

// The event and the stream must be of the current context.
CUresult EventRecord(CUevent event, CUstream stream) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = UsableStream(call.s, stream, &ctx); r != CUDA_SUCCESS) return r;
  if (!call.s.events.count(event) || event->ctx != ctx) return CUDA_ERROR_INVALID_HANDLE;
  event->recorded = true;
  event->at = std::chrono::steady_clock::now();
  event->queue = QueueOf(stream, ctx);
  event->after = call.s.work.submitted();
  return CUDA_SUCCESS;
}

// Runs the work its stream held when it was recorded; an event never recorded is
// complete.
CUresult EventSynchronize(CUevent event) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (!call.s.events.count(event)) return CUDA_ERROR_INVALID_HANDLE;
  if (event->recorded) call.s.work.RunQueue(call.s, event->queue, event->after);
  return call.blocked();
}

// The host time between the two records, at least a microsecond. Both events must have
// been recorded, with timing.
CUresult EventElapsedTime(float* ms, CUevent start, CUevent end) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  for (CUevent e : {start, end})
    if (!call.s.events.count(e) || !e->recorded || (e->flags & CU_EVENT_DISABLE_TIMING))
      return CUDA_ERROR_INVALID_HANDLE;
  const std::chrono::duration<float, std::milli> between = end->at - start->at;
  *ms = std::max(between.count(), 0.001f);
  return CUDA_SUCCESS;
}

// Memory. Device memory is host memory; an address is the host pointer.

// Fresh memory holds garbage, as on a GPU: nothing may count on its being zero.
CUresult MemAlloc(CUdeviceptr* dptr, size_t bytes) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = Current(&ctx); r != CUDA_SUCCESS) return r;
  if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = call.s;
  if (bytes > kTotalMemory - s.allocated) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = AlignedAlloc(kAlignment, bytes);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memset(p, 0xcd, bytes);
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  s.allocations.emplace(*dptr, Allocation{bytes, ctx, ++s.allocation_serial});
  s.allocated += bytes;
  return CUDA_SUCCESS;
}

// Any context's allocation, by its base address. It waits for the device's work first,
// as the driver does.
CUresult MemFree(CUdeviceptr dptr) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  auto it = call.s.allocations.find(dptr);
  if (it == call.s.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  call.s.work.RunAll(call.s);
  call.s.allocated -= it->second.bytes;
  std::free(reinterpret_cast<void*>(dptr));
  call.s.allocations.erase(it);
  return call.released();
}

CUresult MemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = UsableStream(call.s, stream, &ctx); r != CUDA_SUCCESS) return r;
  if (!Inside(call.s, dst, n, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  call.s.work.Submit(QueueOf(stream, ctx), ctx, [=](State&) { std::memset(reinterpret_cast<void*>(dst), value, n); });
  return CUDA_SUCCESS;
}

CUresult MemHostAlloc(void** pp, size_t bytes, unsigned flags) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = Current(&ctx); r != CUDA_SUCCESS) return r;
  const unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (!pp || bytes == 0 || (flags & ~known)) return CUDA_ERROR_INVALID_VALUE;
  void* p = AlignedAlloc(4096, bytes);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  call.s.host_allocations.emplace(p, State::HostAllocation{ctx, bytes});
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult MemFreeHost(void* p) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!call.s.host_allocations.count(p)) return CUDA_ERROR_INVALID_VALUE;
  call.s.work.RunAll(call.s);  // as the driver, it waits for the device first
  call.s.host_allocations.erase(p);
  std::free(p);
  return call.released();
}

// A device range of a copy may lie in any context's allocation (unified addressing), but
// must lie in one. Copies run in their stream's turn; pageable host memory is taken at
// the call (read into a staging copy, or, into it, after the stream's earlier work).
// The registration that holds [p, p + n), or null.
const State::Registered* RegisteredAt(const State& s, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  auto it = s.registered.upper_bound(b);
  if (it == s.registered.begin()) return nullptr;
  --it;
  const size_t into = static_cast<size_t>(b - it->first);
  return into <= it->second.bytes && n <= it->second.bytes - into ? &it->second : nullptr;
}

bool Pinned(const State& s, const void* p, size_t n) {
  if (RegisteredAt(s, p, n)) return true;
  const auto* b = static_cast<const uint8_t*>(p);
  for (const auto& [start, a] : s.host_allocations) {
    const auto* base = static_cast<const uint8_t*>(start);
    if (b >= base && b - base <= static_cast<ptrdiff_t>(a.bytes) && n <= a.bytes - (b - base)) return true;
  }
  return false;
}

// Page-locks host memory for the current context. A range that overlaps one already
// registered (or memory of cuMemHostAlloc) is refused, as the driver refuses it.
CUresult MemHostRegister(void* p, size_t bytes, unsigned flags) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = Current(&ctx); r != CUDA_SUCCESS) return r;
  const unsigned known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY |
                         CU_MEMHOSTREGISTER_READ_ONLY;
  if (!p || bytes == 0 || (flags & ~known)) return CUDA_ERROR_INVALID_VALUE;
  const auto* b = static_cast<const uint8_t*>(p);
  auto next = call.s.registered.lower_bound(b);
  if (next != call.s.registered.end() && next->first < b + bytes) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (RegisteredAt(call.s, p, 1)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (call.s.host_allocations.count(p)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  call.s.registered.emplace(b, State::Registered{bytes, ctx});
  return CUDA_SUCCESS;
}

CUresult MemHostUnregister(void* p) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!call.s.registered.count(static_cast<const uint8_t*>(p))) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  call.s.work.RunAll(call.s);  // as the driver, it waits for the device first
  call.s.registered.erase(static_cast<const uint8_t*>(p));
  return CUDA_SUCCESS;
}

CUresult MemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream stream) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = UsableStream(call.s, stream, &ctx); r != CUDA_SUCCESS) return r;
  if (!src || !Inside(call.s, dst, n, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (RegisteredAt(call.s, src, n)) ++call.s.registered_copies;
  if (Pinned(call.s, src, n)) {
    call.s.work.Submit(QueueOf(stream, ctx), ctx, [=](State&) { std::memcpy(reinterpret_cast<void*>(dst), src, n); });
  } else {
    auto staged = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                         static_cast<const uint8_t*>(src) + n);
    call.s.work.Submit(QueueOf(stream, ctx), ctx,
           [=](State&) { std::memcpy(reinterpret_cast<void*>(dst), staged->data(), n); });
  }
  return CUDA_SUCCESS;
}

CUresult MemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream stream) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = UsableStream(call.s, stream, &ctx); r != CUDA_SUCCESS) return r;
  if (!dst || !Inside(call.s, src, n, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (RegisteredAt(call.s, dst, n)) ++call.s.registered_copies;
  const void* queue = QueueOf(stream, ctx);
  call.s.work.Submit(queue, ctx, [=](State&) { std::memcpy(dst, reinterpret_cast<const void*>(src), n); });
  if (!Pinned(call.s, dst, n)) call.s.work.RunQueue(call.s, queue);  // into pageable memory the call waits
  return CUDA_SUCCESS;
}

CUresult MemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = UsableStream(call.s, stream, &ctx); r != CUDA_SUCCESS) return r;
  if (!Inside(call.s, dst, n, nullptr) || !Inside(call.s, src, n, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  call.s.work.Submit(QueueOf(stream, ctx), ctx,
         [=](State&) { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n); });
  return CUDA_SUCCESS;
}

// Modules and launches.

CUresult ModuleLoadDataEx(CUmodule* module, const void* image, unsigned n, CUjit_option* options, void** values) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = Current(&ctx); r != CUDA_SUCCESS) return r;
  if (!module || !image || (n > 0 && (!options || !values))) return CUDA_ERROR_INVALID_VALUE;
  std::string bytes, log;
  if (CUresult r = ReadImage(image, &bytes, &log); r != CUDA_SUCCESS) {
    WriteErrorLog(n, options, values, log);
    return r;
  }
  WriteErrorLog(n, options, values, "");
  auto m = std::make_unique<CUmod_st>();
  m->ctx = ctx;
  m->image = std::move(bytes);
  *module = m.get();
  call.s.modules.emplace(*module, std::move(m));
  return CUDA_SUCCESS;
}

CUresult ModuleUnload(CUmodule module) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  auto it = call.s.modules.find(module);
  if (it == call.s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  for (const auto& f : it->second->functions) call.s.functions.erase(f.get());
  call.s.modules.erase(it);
  return call.released();
}

// CUDA_ERROR_NOT_FOUND unless the image defines the kernel; one handle per name. Its
// parameters and launch bounds are read from the image (PtxKernelInfo, CubinKernelInfo):
// one the fake cannot read
// is CUDA_ERROR_INVALID_PTX or CUDA_ERROR_INVALID_IMAGE.
CUresult ModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (!function || !name) return CUDA_ERROR_INVALID_VALUE;
  if (!call.s.modules.count(module)) return CUDA_ERROR_INVALID_HANDLE;
  for (const auto& f : module->functions)
    if (f->name == name) {
      *function = f.get();
      return CUDA_SUCCESS;
    }
  if (!DefinesKernel(module->image, name)) return CUDA_ERROR_NOT_FOUND;
  const bool cubin = module->image.compare(0, SELFMAG, ELFMAG) == 0;
  std::optional<KernelInfo> info = cubin ? CubinKernelInfo(module->image, name) : PtxKernelInfo(module->image, name);
  if (!info) return cubin ? CUDA_ERROR_INVALID_IMAGE : CUDA_ERROR_INVALID_PTX;
  module->functions.push_back(std::make_unique<CUfunc_st>(CUfunc_st{module, name, std::move(*info)}));
  *function = module->functions.back().get();
  call.s.functions.insert(*function);
  return CUDA_SUCCESS;
}

// Checks the launch and runs nothing, except that a kernel named "fault" faults the
// device. Like a real launch it returns before the kernel runs: the calls that follow
// report the fault.
// As the driver: CUDA_ERROR_INVALID_VALUE for an index past the last parameter.
CUresult FuncGetParamInfo(CUfunction f, size_t index, size_t* offset, size_t* size) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (!f || !call.s.functions.count(f)) return CUDA_ERROR_INVALID_HANDLE;
  if (!offset || index >= f->info.params.size()) return CUDA_ERROR_INVALID_VALUE;
  *offset = f->info.params[index].offset;
  if (size) *size = f->info.params[index].size;
  return CUDA_SUCCESS;
}

// CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: the kernel's launch bounds, or the device's
// limit (the fake has no registers to run short of). Other attributes are not served.
CUresult FuncGetAttribute(int* value, CUfunction_attribute attribute, CUfunction f) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (!f || !call.s.functions.count(f)) return CUDA_ERROR_INVALID_HANDLE;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  if (attribute != CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) return CUDA_ERROR_NOT_SUPPORTED;
  *value = static_cast<int>(f->info.max_threads);
  return CUDA_SUCCESS;
}

CUresult LaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      unsigned shared_bytes, CUstream stream, void** params, void** extra) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = UsableStream(call.s, stream, &ctx); r != CUDA_SUCCESS) return r;
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  if (CUresult r = CheckLaunch(call.s, f, grid, block, shared_bytes, params, extra); r != CUDA_SUCCESS) return r;
  if (f->module->ctx != ctx) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = ReadParams(f, params, extra); r != CUDA_SUCCESS) return r;
  // In its turn: a kernel named "fault", or one whose module is gone by then, faults.
  const std::string name = f->name;
  call.s.work.Submit(QueueOf(stream, ctx), ctx, [=](State& s) {
    if (name == "fault" || !s.functions.count(f)) s.faulted = true;
  });
  return CUDA_SUCCESS;
}

// Graphs.

CUresult GraphCreate(CUgraph* graph, unsigned flags) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (!graph || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto g = std::make_unique<CUgraph_st>();
  *graph = g.get();
  call.s.graphs.emplace(*graph, std::move(g));
  return CUDA_SUCCESS;
}

CUresult GraphDestroy(CUgraph graph) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!call.s.graphs.erase(graph)) return CUDA_ERROR_INVALID_VALUE;
  return call.released();
}

// The kernel's parameters are read as the driver reads them (ReadParams). The fake takes
// a function (func), not a library kernel (kern).
CUresult GraphAddKernelNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps, size_t n,
                            const CUDA_KERNEL_NODE_PARAMS* p) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (!node || !p || !call.s.graphs.count(graph)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDependencies(*graph, deps, n); r != CUDA_SUCCESS) return r;
  if (!p->func && p->kern) return CUDA_ERROR_NOT_SUPPORTED;
  const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
  const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  if (CUresult r = CheckLaunch(call.s, p->func, grid, block, p->sharedMemBytes, p->kernelParams, p->extra);
      r != CUDA_SUCCESS)
    return r;
  if (CUresult r = ReadParams(p->func, p->kernelParams, p->extra); r != CUDA_SUCCESS) return r;
  auto k = std::make_unique<CUgraphNode_st>();
  k->function = p->func;
  k->name = p->func->name;
  k->ctx = p->func->module->ctx;
  k->deps.assign(deps, deps + n);
  *node = k.get();
  graph->nodes.push_back(std::move(k));
  return CUDA_SUCCESS;
}

// Refuses a copy off the context's live allocations, address 0 included, as the driver
// does.
CUresult GraphAddMemcpyNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps, size_t n,
                            const CUDA_MEMCPY3D* p, CUcontext ctx) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  if (!node || !call.s.graphs.count(graph)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDependencies(*graph, deps, n); r != CUDA_SUCCESS) return r;
  if (!ctx || !KnownContext(call.s, ctx) || !ctx->alive) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = CheckCopy(call.s, p, ctx); r != CUDA_SUCCESS) return r;
  auto c = std::make_unique<CUgraphNode_st>();
  c->ctx = ctx;
  c->copy = *p;
  c->deps.assign(deps, deps + n);
  *node = c.get();
  graph->nodes.push_back(std::move(c));
  return CUDA_SUCCESS;
}

// For the current context; its kernels must still be loaded.
CUresult GraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = Current(&ctx); r != CUDA_SUCCESS) return r;
  if (!exec || !call.s.graphs.count(graph) || (flags & ~0xfull)) return CUDA_ERROR_INVALID_VALUE;
  auto e = std::make_unique<CUgraphExec_st>();
  e->ctx = ctx;
  for (const auto& node : graph->nodes) {
    if (node->function && !call.s.functions.count(node->function)) return CUDA_ERROR_INVALID_HANDLE;
    CUgraphNode_st& n = e->nodes.emplace_back(node.get(), *node).second;
    if (!node->function) {
      n.original_src = AllocationAt(call.s, n.copy.srcDevice + n.copy.srcXInBytes);
      n.original_dst = AllocationAt(call.s, n.copy.dstDevice + n.copy.dstXInBytes);
      n.original_1d = n.copy.Height == 1;
    }
  }
  *exec = e.get();
  call.s.execs.emplace(*exec, std::move(e));
  return CUDA_SUCCESS;
}

CUresult GraphExecDestroy(CUgraphExec exec) {
  Call call;
  if (!call.s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!call.s.execs.erase(exec)) return CUDA_ERROR_INVALID_VALUE;
  return call.released();
}

// The instantiated copy of `node` in `exec`, if it has one of the kind asked for.
CUgraphNode_st* ExecNode(const State& s, CUgraphExec exec, CUgraphNode node, bool kernel) {
  if (!s.execs.count(exec)) return nullptr;
  for (auto& [handle, n] : exec->nodes)
    if (handle == node) return (n.function != nullptr) == kernel ? &n : nullptr;
  return nullptr;
}

// The new function must be of the same context as the node's.
CUresult GraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS* p) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUgraphNode_st* n = ExecNode(call.s, exec, node, /*kernel=*/true);
  if (!n || !p) return CUDA_ERROR_INVALID_VALUE;
  if (!p->func && p->kern) return CUDA_ERROR_NOT_SUPPORTED;
  const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
  const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  if (CUresult r = CheckLaunch(call.s, p->func, grid, block, p->sharedMemBytes, p->kernelParams, p->extra);
      r != CUDA_SUCCESS)
    return r;
  if (p->func->module->ctx != n->ctx) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = ReadParams(p->func, p->kernelParams, p->extra); r != CUDA_SUCCESS) return r;
  n->function = p->func;
  n->name = p->func->name;
  return CUDA_SUCCESS;
}

// As the driver documents it: the context may not change; the node's operands at the
// instantiation and the new ones must be 1-dimensional; the instantiation's operands'
// mappings must not have changed since (the fake: their allocations still live, so a node
// instantiated on memory freed since cannot be retargeted); the new ranges, of any size,
// are checked as a new node's are.
CUresult GraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_MEMCPY3D* p, CUcontext ctx) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUgraphNode_st* n = ExecNode(call.s, exec, node, /*kernel=*/false);
  if (!n || ctx != n->ctx) return CUDA_ERROR_INVALID_VALUE;
  if (!n->ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (!n->original_1d || !p || p->Height != 1) return CUDA_ERROR_INVALID_VALUE;
  const auto live = [&](uint64_t serial) {
    return std::any_of(call.s.allocations.begin(), call.s.allocations.end(),
                       [&](const auto& a) { return a.second.serial == serial; });
  };
  if (!live(n->original_src) || !live(n->original_dst)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckCopy(call.s, p, ctx); r != CUDA_SUCCESS) return r;
  n->copy = *p;
  return CUDA_SUCCESS;
}

// Runs the nodes in an order their edges allow (LatestReadyFirst): a memcpy node copies,
// a kernel node does nothing. The device faults, as a GPU would, at a kernel named
// "fault", at a kernel since unloaded and at a copy whose memory has been freed since
// its node was set; the launch itself succeeds, and the calls that follow report the
// fault.
CUresult GraphLaunch(CUgraphExec exec, CUstream stream) {
  Call call;
  if (CUresult r = call.blocked(); r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (CUresult r = UsableStream(call.s, stream, &ctx); r != CUDA_SUCCESS) return r;
  if (!call.s.execs.count(exec)) return CUDA_ERROR_INVALID_VALUE;
  if (exec->ctx != ctx) return CUDA_ERROR_INVALID_CONTEXT;
  // The nodes as they are now (an update after the launch changes later launches only),
  // in the order a GPU might run them (tests/support/graph_order.h).
  std::vector<CUgraphNode> handles;
  for (const auto& [handle, n] : exec->nodes) handles.push_back(handle);
  auto nodes = std::make_shared<std::vector<CUgraphNode_st>>();
  for (size_t i : replayd::testing::LatestReadyFirst(
           handles, [&](size_t i) -> const std::vector<CUgraphNode>& { return exec->nodes[i].second.deps; }))
    nodes->push_back(exec->nodes[i].second);
  call.s.work.Submit(QueueOf(stream, ctx), ctx, [nodes](State& s) {
    for (const CUgraphNode_st& n : *nodes) {
      if (n.function) {
        if (!s.functions.count(n.function) || n.name == "fault") {
          s.faulted = true;
          return;
        }
        continue;
      }
      const CUDA_MEMCPY3D& p = n.copy;
      const CUdeviceptr src = p.srcDevice + p.srcXInBytes, dst = p.dstDevice + p.dstXInBytes;
      if (!Inside(s, src, Span(p, p.srcPitch), n.ctx) || !Inside(s, dst, Span(p, p.dstPitch), n.ctx)) {
        s.faulted = true;
        return;
      }
      for (size_t row = 0; row < p.Height; ++row)
        std::memmove(reinterpret_cast<void*>(dst + row * p.dstPitch),
                     reinterpret_cast<const void*>(src + row * p.srcPitch), p.WidthInBytes);
    }
  });
  return CUDA_SUCCESS;
}

// Every entry point CudaLibrary resolves, by the name it asks for. The cast fails to
// compile unless the function has exactly the prototype cuda.h declares under that name
// (which is a versioned symbol for some: cuCtxCreate is cuCtxCreate_v4).
#define FAKE_CUDA_ENTRY(name, impl) {#name, reinterpret_cast<void*>(static_cast<decltype(&::name)>(&impl))}
const std::pair<std::string_view, void*> kEntries[] = {
    FAKE_CUDA_ENTRY(cuInit, Init),
    FAKE_CUDA_ENTRY(cuDriverGetVersion, DriverGetVersion),
    FAKE_CUDA_ENTRY(cuGetErrorName, GetErrorName),
    FAKE_CUDA_ENTRY(cuGetErrorString, GetErrorString),
    FAKE_CUDA_ENTRY(cuDeviceGetCount, DeviceGetCount),
    FAKE_CUDA_ENTRY(cuDeviceGet, DeviceGet),
    FAKE_CUDA_ENTRY(cuDeviceGetName, DeviceGetName),
    FAKE_CUDA_ENTRY(cuDeviceTotalMem, DeviceTotalMem),
    FAKE_CUDA_ENTRY(cuDeviceGetAttribute, DeviceGetAttribute),
    FAKE_CUDA_ENTRY(cuCtxCreate, CtxCreate),
    FAKE_CUDA_ENTRY(cuCtxDestroy, CtxDestroy),
    FAKE_CUDA_ENTRY(cuCtxSetCurrent, CtxSetCurrent),
    FAKE_CUDA_ENTRY(cuCtxPopCurrent, CtxPopCurrent),
    FAKE_CUDA_ENTRY(cuDevicePrimaryCtxRetain, DevicePrimaryCtxRetain),
    FAKE_CUDA_ENTRY(cuDevicePrimaryCtxRelease, DevicePrimaryCtxRelease),
    FAKE_CUDA_ENTRY(cuStreamCreate, StreamCreate),
    FAKE_CUDA_ENTRY(cuStreamDestroy, StreamDestroy),
    FAKE_CUDA_ENTRY(cuStreamSynchronize, StreamSynchronize),
    FAKE_CUDA_ENTRY(cuMemAlloc, MemAlloc),
    FAKE_CUDA_ENTRY(cuMemFree, MemFree),
    FAKE_CUDA_ENTRY(cuMemsetD8Async, MemsetD8Async),
    FAKE_CUDA_ENTRY(cuMemHostAlloc, MemHostAlloc),
    FAKE_CUDA_ENTRY(cuMemFreeHost, MemFreeHost),
    FAKE_CUDA_ENTRY(cuMemHostRegister, MemHostRegister),
    FAKE_CUDA_ENTRY(cuMemHostUnregister, MemHostUnregister),
    FAKE_CUDA_ENTRY(cuMemcpyHtoDAsync, MemcpyHtoDAsync),
    FAKE_CUDA_ENTRY(cuMemcpyDtoHAsync, MemcpyDtoHAsync),
    FAKE_CUDA_ENTRY(cuMemcpyDtoDAsync, MemcpyDtoDAsync),
    FAKE_CUDA_ENTRY(cuModuleLoadDataEx, ModuleLoadDataEx),
    FAKE_CUDA_ENTRY(cuModuleUnload, ModuleUnload),
    FAKE_CUDA_ENTRY(cuModuleGetFunction, ModuleGetFunction),
    FAKE_CUDA_ENTRY(cuFuncGetParamInfo, FuncGetParamInfo),
    FAKE_CUDA_ENTRY(cuFuncGetAttribute, FuncGetAttribute),
    FAKE_CUDA_ENTRY(cuLaunchKernel, LaunchKernel),
    FAKE_CUDA_ENTRY(cuEventCreate, EventCreate),
    FAKE_CUDA_ENTRY(cuEventDestroy, EventDestroy),
    FAKE_CUDA_ENTRY(cuEventRecord, EventRecord),
    FAKE_CUDA_ENTRY(cuEventSynchronize, EventSynchronize),
    FAKE_CUDA_ENTRY(cuEventElapsedTime, EventElapsedTime),
    FAKE_CUDA_ENTRY(cuGraphCreate, GraphCreate),
    FAKE_CUDA_ENTRY(cuGraphDestroy, GraphDestroy),
    FAKE_CUDA_ENTRY(cuGraphAddKernelNode, GraphAddKernelNode),
    FAKE_CUDA_ENTRY(cuGraphAddMemcpyNode, GraphAddMemcpyNode),
    FAKE_CUDA_ENTRY(cuGraphInstantiateWithFlags, GraphInstantiateWithFlags),
    FAKE_CUDA_ENTRY(cuGraphExecDestroy, GraphExecDestroy),
    FAKE_CUDA_ENTRY(cuGraphExecKernelNodeSetParams, GraphExecKernelNodeSetParams),
    FAKE_CUDA_ENTRY(cuGraphExecMemcpyNodeSetParams, GraphExecMemcpyNodeSetParams),
    FAKE_CUDA_ENTRY(cuGraphLaunch, GraphLaunch),
};
#undef FAKE_CUDA_ENTRY

}  // namespace

// Exported as the driver exports it, for a version check before anything is resolved.
extern "C" FAKE_CUDA_EXPORT CUresult cuDriverGetVersion(int* version) { return DriverGetVersion(version); }

// Asked for a CUDA version newer than the driver's, CUDA_ERROR_INVALID_VALUE, as the
// driver documents. The fake has the prototypes of the cuda.h it is built with only,
// which those of kEntries have had since CUDA 12.5 (cuCtxCreate became cuCtxCreate_v4
// there): asked for an older version, it answers VERSION_NOT_SUFFICIENT.
extern "C" FAKE_CUDA_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                                         cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  constexpr int kOldestPrototypes = 12050;
  const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if (!symbol || !pfn || (flags & ~known)) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  int driver_version = 0;
  DriverGetVersion(&driver_version);
  if (cuda_version > driver_version) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& [name, fn] : kEntries) {
    if (name != symbol) continue;
    if (cuda_version < kOldestPrototypes) {
      if (status) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
      return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = fn;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

extern "C" FAKE_CUDA_EXPORT void fake_cuda_reset(void) {
  Call call;
  State& s = call.s;
  for (const auto& [address, a] : s.allocations) std::free(reinterpret_cast<void*>(address));
  for (const auto& [p, a] : s.host_allocations) std::free(p);
  s.work.Clear();
  s.allocations.clear();
  s.allocated = 0;
  s.host_allocations.clear();
  s.registered.clear();
  s.registered_copies = 0;
  s.streams.clear();
  s.events.clear();
  s.modules.clear();
  s.functions.clear();
  s.graphs.clear();
  s.execs.clear();
  for (const auto& c : s.contexts) c->alive = false;
  s.primary = nullptr;
  s.primary_refs = 0;
  s.reclaimed = 0;
  s.faulted = false;
  s.initialized = false;
  s.max_pitch = kMaxPitch;
  s.compute_mode = CU_COMPUTEMODE_DEFAULT;
  s.held_elsewhere = false;
  s.driver_version = kVersion;
  s.fault_error = CUDA_ERROR_ILLEGAL_ADDRESS;
  t_stack.clear();
}

extern "C" FAKE_CUDA_EXPORT void fake_cuda_set_driver_version(int version) {
  Call call;
  call.s.driver_version = version;
}

extern "C" FAKE_CUDA_EXPORT void fake_cuda_set_fault_error(int error) {
  Call call;
  call.s.fault_error = static_cast<CUresult>(error);
}

extern "C" FAKE_CUDA_EXPORT void fake_cuda_set_compute_mode(int mode, int held_elsewhere) {
  Call call;
  call.s.compute_mode = static_cast<CUcomputemode>(mode);
  call.s.held_elsewhere = held_elsewhere != 0;
}

extern "C" FAKE_CUDA_EXPORT void fake_cuda_set_max_pitch(int pitch) {
  Call call;
  call.s.max_pitch = pitch > 0 ? static_cast<uint64_t>(pitch) : kMaxPitch;
}

extern "C" FAKE_CUDA_EXPORT int fake_cuda_context_stack_depth(void) { return static_cast<int>(t_stack.size()); }

extern "C" FAKE_CUDA_EXPORT int fake_cuda_count(const char* what) {
  Call call;
  const State& s = call.s;
  const std::string_view w = what ? what : "";
  if (w == "contexts") {
    auto alive = [](const std::unique_ptr<CUctx_st>& c) { return c->alive; };
    return static_cast<int>(std::count_if(s.contexts.begin(), s.contexts.end(), alive));
  }
  if (w == "allocations") return static_cast<int>(s.allocations.size());
  if (w == "host_allocations") return static_cast<int>(s.host_allocations.size());
  if (w == "registered") return static_cast<int>(s.registered.size());
  if (w == "registered_copies") return s.registered_copies;
  if (w == "streams") return static_cast<int>(s.streams.size());
  if (w == "events") return static_cast<int>(s.events.size());
  if (w == "modules") return static_cast<int>(s.modules.size());
  if (w == "graphs") return static_cast<int>(s.graphs.size());
  if (w == "graph_execs") return static_cast<int>(s.execs.size());
  if (w == "reclaimed") return s.reclaimed;
  if (w == "faulted") return s.faulted ? 1 : 0;
  return -1;
}

#include "drivers/cpu/cpu_driver.h"

#include <dlfcn.h>
#include <elf.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "drivers/cpu/trampoline.h"
#include "drivers/elf_image.h"

namespace replayd {
namespace {

#if defined(__x86_64__)
constexpr uint16_t kHostElfMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kHostElfMachine = EM_AARCH64;
#else
#error "cpu-c artifacts are checked for x86_64 and aarch64 hosts only"
#endif

// OK when the artifact at `path` is a whole shared object for this host: one cut short
// (a full disk, a crash, a hand) must not reach dlopen, which maps the segments its
// headers describe and faults (SIGBUS) on the pages past the file's end.
absl::Status CheckArtifact(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  const std::string image((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (!file && !file.eof()) return absl::InternalError(absl::StrCat("cannot read ", path.string()));
  if (absl::Status s = CheckElfImage(image, kHostElfMachine, "cpu-c artifact"); !s.ok())
    return absl::InternalError(absl::StrCat("cannot load ", path.string(), ": ", s.message()));
  return absl::OkStatus();
}

using Entry = void (*)(const long long* args, int core_id);

// Small buffers come from the heap; large ones are mapped so that their pages arrive
// zeroed on first touch and go back to the system when freed.
constexpr uint64_t kMapThreshold = 64 * 1024;
constexpr uint64_t kAlignment = 64;

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "model name")) {
      size_t colon = line.find(':');
      if (colon != std::string::npos)
        return std::string(absl::StripLeadingAsciiWhitespace(absl::string_view(line).substr(colon + 1)));
    }
  }
  return "host cpu";
}

// The host CPU's instruction set extensions, as a short stable tag: a kernel compiled with
// -march=native runs only where they are the same, so they enter every compile key.
std::string CpuFeatureTag() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "flags")) continue;
    uint64_t h = 14695981039346656037ull;  // FNV-1a
    for (unsigned char c : line) h = (h ^ c) * 1099511628211ull;
    return absl::StrCat("cpu-", absl::Hex(h, absl::kZeroPad16));
  }
  return "cpu-unknown";
}

uint64_t PhysicalMemory() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * page : (1ull << 32);
}

class CpuKernel : public Kernel {
 public:
  CpuKernel(void* handle, Entry entry, Signature signature)
      : handle_(handle), entry_(entry), signature_(std::move(signature)) {}
  ~CpuKernel() override { dlclose(handle_); }
  const Signature& signature() const override { return signature_; }
  Entry entry() const { return entry_; }

 private:
  void* handle_;
  Entry entry_;
  Signature signature_;
};

// Runs one launch: n = product of global invocations, each with its index as core id.
void RunKernel(ThreadPool& pool, Entry entry, const ArgValue* args, const Dim3& global) {
  static_assert(sizeof(ArgValue) == sizeof(long long));
  const auto* packed = reinterpret_cast<const long long*>(args);
  uint64_t n = global[0] * global[1] * global[2];
  if (n == 1) {
    entry(packed, 0);
  } else {
    pool.ParallelFor(n, [&](uint64_t i) { entry(packed, static_cast<int>(i)); });
  }
}

std::optional<absl::Duration> Elapsed(std::chrono::steady_clock::time_point start, bool wait) {
  if (!wait) return std::nullopt;
  return absl::FromChrono(std::chrono::steady_clock::now() - start);
}

// OK when copy node `index` (destination args[0], source args[1]) lies on live memory of
// `device`; otherwise INTERNAL, as CUDA answers a memcpy node on an address it does not know
// with CUDA_ERROR_INVALID_VALUE. The engine checks every range, so this is a bug caught.
absl::Status CheckCopyNode(const CpuDevice& device, size_t index, std::span<const ArgValue> args, uint64_t bytes) {
  for (int side = 0; side < 2; ++side) {
    if (device.allocations().Holds(args[side].address, bytes)) continue;
    return absl::InternalError(absl::StrCat("cpu:0: copy node ", index, ": its ", side == 0 ? "destination" : "source",
                                            " [0x", absl::Hex(args[side].address), ", +", bytes,
                                            ") is not inside an allocation of the device"));
  }
  return absl::OkStatus();
}

// The CPU replay list: argument arrays prepared once, patched in place, run in order. A
// copy node is a memcpy (its ranges never overlap), checked to lie on live allocations
// when it is built and at every update.
class CpuDeviceGraph : public DeviceGraph {
 public:
  CpuDeviceGraph(CpuDevice* device, std::span<const GraphNode> nodes) : device_(device) {
    nodes_.reserve(nodes.size());
    for (const GraphNode& n : nodes)
      nodes_.push_back(
          {n.is_copy() ? nullptr : static_cast<const CpuKernel*>(n.kernel)->entry(), n.args, n.global, n.copy_bytes});
  }

  absl::Status Update(size_t node, std::span<const ArgValue> args, const Dim3& global, const Dim3&) override {
    Node& n = nodes_[node];
    if (!n.entry)
      if (absl::Status s = CheckCopyNode(*device_, node, args, n.copy_bytes); !s.ok()) return s;
    std::copy(args.begin(), args.end(), n.args.begin());
    n.global = global;
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<absl::Duration>> Launch(bool wait) override {
    auto start = std::chrono::steady_clock::now();
    for (const Node& n : nodes_) {
      if (n.entry) {
        RunKernel(device_->pool(), n.entry, n.args.data(), n.global);
      } else {
        std::memcpy(reinterpret_cast<void*>(n.args[0].address), reinterpret_cast<const void*>(n.args[1].address),
                    n.copy_bytes);
      }
    }
    return Elapsed(start, wait);
  }

 private:
  struct Node {
    Entry entry;  // null: a copy
    std::vector<ArgValue> args;
    Dim3 global;
    uint64_t copy_bytes;
  };
  CpuDevice* const device_;
  std::vector<Node> nodes_;
};

class CpuContext : public Context {
 public:
  explicit CpuContext(CpuDevice* device) : device_(device) {}

  absl::StatusOr<Allocation> Allocate(uint64_t bytes) override {
    if (absl::Status s = device_->memory().Reserve("cpu:0", bytes); !s.ok()) return s;
    void* p = nullptr;
    if (bytes >= kMapThreshold) {
      p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) p = nullptr;
    } else {
      uint64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
      p = std::aligned_alloc(kAlignment, rounded);
      if (p) std::memset(p, 0, rounded);
    }
    if (!p) {
      device_->memory().Release(bytes);
      return absl::ResourceExhaustedError(absl::StrCat("cpu:0: host allocation of ", bytes, " bytes failed"));
    }
    const Allocation a{reinterpret_cast<uint64_t>(p), bytes};
    device_->allocations().Add(a.address, a.bytes);
    return a;
  }

  // Maps the memfd here; the pages are the other process's too, zeroed where new.
  absl::StatusOr<Allocation> AllocateShared(int fd, uint64_t bytes) override {
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 0 || static_cast<uint64_t>(st.st_size) < bytes)
      return absl::InvalidArgumentError(absl::StrCat("cpu:0: shared memory shorter than ", bytes, " bytes"));
    if (absl::Status s = device_->memory().Reserve("cpu:0", bytes); !s.ok()) return s;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      device_->memory().Release(bytes);
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu:0: mapping ", bytes, " bytes of shared memory failed: ", std::strerror(errno)));
    }
    const Allocation a{reinterpret_cast<uint64_t>(p), bytes};
    device_->allocations().Add(a.address, a.bytes);
    absl::MutexLock lock(&mu_);
    shared_.insert(a.address);
    return a;
  }

  void Free(const Allocation& a) override {
    device_->allocations().Remove(a.address);
    void* p = reinterpret_cast<void*>(a.address);
    bool shared = false;
    {
      absl::MutexLock lock(&mu_);
      shared = shared_.erase(a.address) > 0;
    }
    if (shared || a.bytes >= kMapThreshold) {
      munmap(p, a.bytes);
    } else {
      std::free(p);
    }
    device_->memory().Release(a.bytes);
  }

  absl::Status Write(const Allocation& dst, uint64_t offset, std::span<const uint8_t> bytes) override {
    std::memcpy(reinterpret_cast<uint8_t*>(dst.address) + offset, bytes.data(), bytes.size());
    return absl::OkStatus();
  }

  absl::Status Read(const Allocation& src, uint64_t offset, std::span<uint8_t> bytes) override {
    std::memcpy(bytes.data(), reinterpret_cast<const uint8_t*>(src.address) + offset, bytes.size());
    return absl::OkStatus();
  }

  absl::Status Copy(const Allocation& dst, uint64_t dst_offset, const Allocation& src, uint64_t src_offset,
                    uint64_t bytes) override {
    std::memmove(reinterpret_cast<uint8_t*>(dst.address) + dst_offset,
                 reinterpret_cast<const uint8_t*>(src.address) + src_offset, bytes);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Kernel>> Load(const ProgramSource& source,
                                               const std::filesystem::path& artifact) override {
    if (absl::Status s = CheckArtifact(artifact); !s.ok()) return s;
    void* handle = dlopen(artifact.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* err = dlerror();
      return absl::InternalError(absl::StrCat("cannot load ", artifact.string(), ": ", err ? err : "unknown error"));
    }
    auto entry = reinterpret_cast<Entry>(dlsym(handle, std::string(kTrampolineSymbol).c_str()));
    if (!entry) {
      dlclose(handle);
      return absl::InternalError(absl::StrCat(artifact.string(), " has no symbol ", kTrampolineSymbol));
    }
    return std::make_unique<CpuKernel>(handle, entry, source.signature);
  }

  absl::StatusOr<std::optional<absl::Duration>> Launch(const Kernel& kernel, std::span<const ArgValue> args,
                                                       const Dim3& global, const Dim3&, bool wait) override {
    auto start = std::chrono::steady_clock::now();
    RunKernel(device_->pool(), static_cast<const CpuKernel&>(kernel).entry(), args.data(), global);
    return Elapsed(start, wait);
  }

  absl::Status Synchronize() override { return absl::OkStatus(); }

  // The replay list runs its nodes in order, which honours every edge.
  absl::StatusOr<std::unique_ptr<DeviceGraph>> Instantiate(std::span<const GraphNode> nodes,
                                                           std::span<const std::pair<size_t, size_t>>) override {
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].is_copy())
        if (absl::Status s = CheckCopyNode(*device_, i, nodes[i].args, nodes[i].copy_bytes); !s.ok()) return s;
    return std::make_unique<CpuDeviceGraph>(device_, nodes);
  }

  // Every CPU context lives in the daemon's own address space.
  uint64_t address_space() const override { return 0; }

 private:
  CpuDevice* device_;
  absl::Mutex mu_;
  std::set<uint64_t> shared_ ABSL_GUARDED_BY(mu_);  // AllocateShared's, by address
};

}  // namespace

std::vector<std::unique_ptr<Device>> CpuDriver::Discover() {
  std::vector<std::unique_ptr<Device>> devices;
  devices.push_back(std::make_unique<CpuDevice>(options_));
  return devices;
}

CpuDevice::CpuDevice(CpuDriverOptions options)
    : compiler_(options.compiler),
      pool_(options.threads > 0 ? options.threads - 1 : std::max(1u, std::thread::hardware_concurrency()) - 1),
      memory_(options.memory_limit ? options.memory_limit : PhysicalMemory() / 2) {
  info_.id = "cpu:0";
  info_.kind = DeviceKind::kCpu;
  info_.name = CpuModelName();
  info_.total_memory = memory_.total();
  info_.limits.max_global = {1u << 24, 1u << 24, 1u << 24};
  info_.limits.max_global_total = 1u << 24;
  info_.limits.max_local = {1, 1, 1};
  info_.limits.max_local_total = 1;
  info_.limits.max_args = 64;
  info_.formats = {"cpu-c"};
  info_.driver_version = compiler_.Identify();
  info_.target = absl::StrCat(info_.driver_version, " ", CCompiler::kOptimization, " ", CpuFeatureTag());
  struct utsname host;
  info_.architecture = uname(&host) == 0 ? host.machine : "unknown";
}

absl::Status CpuDevice::Compile(const ProgramSource& source, const std::filesystem::path& output) {
  if (info_.driver_version.empty()) return absl::FailedPreconditionError("cpu:0: the C compiler could not be run");
  return compiler_.Compile(source, output);
}

absl::StatusOr<std::unique_ptr<Context>> CpuDevice::OpenContext(const ContextOptions&) { return std::make_unique<CpuContext>(this); }

}  // namespace replayd

// A device for engine tests: host memory, kernels whose bodies are C++ functions, device
// graphs that run their nodes as a GPU may (in an order their edges allow, of the ready
// nodes the one created last: tests/support/graph_order.h, so an edge the engine fails to
// make shows as a wrong result), and faults injected where a test asks for them
// (an allocation, an instantiation, an update, a launch, a copy), so the engine's failure
// paths run on any machine. It checks what the real drivers check: a copy node must lie on
// live allocations of its context (CUDA refuses a memcpy node on an address it does not
// know), and every allocation is freed exactly once.
//
// Each context is a stream, as on a GPU: a launch, graph launch or copy without wait is
// queued and runs only when the context is next asked for something that must see it (a
// read, a write, a launch or copy with wait, a synchronize, a free, the context's end).
// Work queued on one context is never run by another's, so an engine that reads through
// one context what it launched without wait on another reads stale bytes here, as it
// would on a GPU.
//
// Thread safety: a FakeDevice and its contexts may be used from several threads; the
// counters are read after the work is done.
#ifndef REPLAYD_TESTS_SUPPORT_FAKE_DRIVER_H_
#define REPLAYD_TESTS_SUPPORT_FAKE_DRIVER_H_

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "drivers/driver.h"
#include "drivers/live_allocations.h"
#include "tests/support/graph_order.h"

namespace replayd::testing {

// What a kernel does: its packed arguments and its launch dimensions.
using FakeKernelBody = std::function<void(std::span<const ArgValue> args, const Dim3& global)>;

class FakeKernel : public Kernel {
 public:
  FakeKernel(Signature signature, FakeKernelBody body) : signature_(std::move(signature)), body_(std::move(body)) {}
  const Signature& signature() const override { return signature_; }
  void Run(std::span<const ArgValue> args, const Dim3& global) const {
    if (body_) body_(args, global);
  }

 private:
  Signature signature_;
  FakeKernelBody body_;
};

// Faults to inject. A countdown of n fails the (n+1)-th such call from now on, once; -1
// never fails. The injected status is returned as is.
struct FakeFaults {
  int allocate = -1;
  int instantiate = -1;
  int update = -1;
  int graph_launch = -1;
  int launch = -1;  // an eager launch
  int copy = -1;    // an eager device-to-device copy
  absl::Status status = absl::InternalError("injected fault");

  // True when this call of a countdown should fail (and disarms it).
  static bool Due(int& countdown) {
    if (countdown < 0) return false;
    return countdown-- == 0;
  }
};

// Counts of what the device did, for a test to check.
struct FakeCounts {
  int allocations = 0;       // made
  int frees = 0;             // released
  int instantiations = 0;    // device graphs built
  int graph_launches = 0;    // device graph submissions
  int launches = 0;          // eager launches
  uint64_t peak_bytes = 0;   // most bytes live at once
};

class FakeDevice : public Device {
 public:
  explicit FakeDevice(uint64_t total_memory = 64 << 20, std::string id = "fake:0") {
    info_.id = std::move(id);
    info_.kind = DeviceKind::kCpu;
    info_.name = "fake device";
    info_.total_memory = total_memory;
    info_.limits.max_global = {1u << 24, 1u << 16, 1u << 16};
    info_.limits.max_global_total = 1u << 24;
    info_.limits.max_local = {1024, 1024, 64};
    info_.limits.max_local_total = 1024;
    info_.formats = {"fake"};
    info_.driver_version = "fake 1";
    info_.architecture = "fake";
    info_.target = "fake";
  }

  const DeviceInfo& info() const override { return info_; }
  uint64_t memory_in_use() const override {
    absl::MutexLock lock(&mu_);
    return in_use_;
  }
  // The fake keeps its own count (in_use_, with its peak and its faults); this account
  // is for a wrapping device, which the engine tests never make.
  DeviceMemory& memory() override { return memory_; }
  // "Compiles" a program of format "fake" whose code names a kernel given to AddKernel:
  // the artifact is that name. Anything else is INVALID_ARGUMENT, as a compile error is.
  absl::Status Compile(const ProgramSource& source, const std::filesystem::path& output) override {
    if (source.format != "fake" || !bodies_.contains(source.code))
      return absl::InvalidArgumentError(absl::StrCat("fake: no kernel named \"", source.code.substr(0, 64), "\""));
    std::FILE* f = std::fopen(output.c_str(), "wb");
    if (!f) return absl::InternalError(absl::StrCat("fake: cannot write ", output.string()));
    std::fwrite(source.code.data(), 1, source.code.size(), f);
    std::fclose(f);
    return absl::OkStatus();
  }
  // Kernels that programs of format "fake" name by their code. Add before loading.
  void AddKernel(const std::string& name, FakeKernelBody body) { bodies_[name] = std::move(body); }
  const FakeKernelBody* Body(const std::string& name) const {
    auto it = bodies_.find(name);
    return it == bodies_.end() ? nullptr : &it->second;
  }
  absl::StatusOr<std::unique_ptr<Context>> OpenContext(const ContextOptions& options) override;

  FakeFaults& faults() { return faults_; }
  // Every context of the device is lost from now on, with `cause` (as when the executor a
  // context lives in ends).
  void Lose(absl::Status cause) {
    absl::MutexLock lock(&mu_);
    lost_ = std::move(cause);
  }
  absl::Status lost() const {
    absl::MutexLock lock(&mu_);
    return lost_;
  }
  FakeCounts counts() const {
    absl::MutexLock lock(&mu_);
    return counts_;
  }
  // Allocations still live.
  size_t live_allocations() const { return live_.size(); }

  // Device memory: host memory, zeroed.
  absl::StatusOr<Allocation> Allocate(uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    if (FakeFaults::Due(faults_.allocate)) return faults_.status;
    if (bytes == 0 || bytes > info_.total_memory - in_use_)
      return absl::ResourceExhaustedError(absl::StrCat(info_.id, ": ", bytes, " bytes do not fit"));
    void* p = std::calloc(1, bytes);
    if (!p) return absl::ResourceExhaustedError("calloc failed");
    const Allocation a{reinterpret_cast<uint64_t>(p), bytes};
    live_.Add(a.address, bytes);
    in_use_ += bytes;
    ++counts_.allocations;
    counts_.peak_bytes = std::max(counts_.peak_bytes, in_use_);
    return a;
  }
  void Free(const Allocation& a) {
    absl::MutexLock lock(&mu_);
    const uint64_t bytes = live_.Remove(a.address);
    if (bytes != a.bytes) {  // not live, or freed with another size
      if (bytes) live_.Add(a.address, bytes);
      ++bad_frees_;
      return;
    }
    in_use_ -= a.bytes;
    ++counts_.frees;
    std::free(reinterpret_cast<void*>(a.address));
  }
  // Frees of an address that was not live (or with the wrong size): always 0 in a
  // correct engine.
  int bad_frees() const {
    absl::MutexLock lock(&mu_);
    return bad_frees_;
  }
  // True when [address, address + bytes) lies inside one live allocation.
  bool Holds(uint64_t address, uint64_t bytes) const { return live_.Holds(address, bytes); }
  // Counts and injects under the device's lock.
  template <typename F>
  auto Locked(F f) {
    absl::MutexLock lock(&mu_);
    return f(counts_, faults_);
  }

 private:
  DeviceInfo info_;
  mutable absl::Mutex mu_;
  LiveAllocations live_;
  uint64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  DeviceMemory memory_{0};
  FakeCounts counts_ ABSL_GUARDED_BY(mu_);
  FakeFaults faults_;  // set by the test before the work it affects
  std::map<std::string, FakeKernelBody> bodies_;  // set before use
  int bad_frees_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
};

// A copy node's check, as CUDA makes it for a memcpy node.
inline absl::Status CheckFakeCopy(const FakeDevice& device, std::span<const ArgValue> args, uint64_t bytes) {
  for (int side = 0; side < 2; ++side)
    if (!device.Holds(args[side].address, bytes))
      return absl::InvalidArgumentError(absl::StrCat("copy node ", side == 0 ? "destination" : "source", " 0x",
                                                     absl::Hex(args[side].address), " is not device memory"));
  return absl::OkStatus();
}

// A context's stream: work queued without wait, run in order when the context next needs
// it done.
class FakeStream {
 public:
  void Enqueue(std::function<void()> work) {
    absl::MutexLock lock(&mu_);
    queued_.push_back(std::move(work));
  }
  // Runs everything queued, in order.
  void Drain() {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < queued_.size(); ++i) queued_[i]();
    queued_.clear();
  }

 private:
  absl::Mutex mu_;
  std::vector<std::function<void()>> queued_ ABSL_GUARDED_BY(mu_);
};

// Runs `nodes` (kernels and copies), `deps[i]` the nodes node i depends on, in an order
// the dependencies allow: of the nodes ready, the one created last.
inline void RunFakeNodes(const std::vector<GraphNode>& nodes, const std::vector<std::vector<size_t>>& deps) {
  std::vector<size_t> ids(nodes.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  for (size_t i : LatestReadyFirst(ids, [&](size_t i) -> const std::vector<size_t>& { return deps[i]; })) {
    const GraphNode& n = nodes[i];
    if (n.is_copy()) {
      std::memcpy(reinterpret_cast<void*>(n.args[0].address), reinterpret_cast<const void*>(n.args[1].address),
                  n.copy_bytes);
    } else {
      static_cast<const FakeKernel*>(n.kernel)->Run(n.args, n.global);
    }
  }
}

class FakeDeviceGraph : public DeviceGraph {
 public:
  FakeDeviceGraph(FakeDevice* device, FakeStream* stream, std::span<const GraphNode> nodes,
                  std::span<const std::pair<size_t, size_t>> edges)
      : device_(device), stream_(stream), nodes_(nodes.begin(), nodes.end()), deps_(nodes.size()) {
    for (auto [from, to] : edges) deps_[to].push_back(from);
  }

  absl::Status Update(size_t node, std::span<const ArgValue> args, const Dim3& global, const Dim3& local) override {
    if (device_->Locked([](FakeCounts&, FakeFaults& f) { return FakeFaults::Due(f.update); }))
      return device_->faults().status;
    GraphNode& n = nodes_[node];
    if (n.is_copy())
      if (absl::Status s = CheckFakeCopy(*device_, args, n.copy_bytes); !s.ok()) return s;
    n.args.assign(args.begin(), args.end());
    n.global = global;
    n.local = local;
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<absl::Duration>> Launch(bool wait) override {
    if (device_->Locked([](FakeCounts& c, FakeFaults& f) {
          ++c.graph_launches;
          return FakeFaults::Due(f.graph_launch);
        }))
      return device_->faults().status;
    // The nodes as they are now: a later update does not change a launch already queued.
    stream_->Enqueue([nodes = nodes_, deps = deps_] { RunFakeNodes(nodes, deps); });
    if (!wait) return std::optional<absl::Duration>();
    stream_->Drain();
    return std::optional<absl::Duration>(absl::Microseconds(1));
  }

  const std::vector<GraphNode>& nodes() const { return nodes_; }

 private:
  FakeDevice* const device_;
  FakeStream* const stream_;  // its context's
  std::vector<GraphNode> nodes_;
  std::vector<std::vector<size_t>> deps_;  // by node: the nodes it depends on
};

class FakeContext : public Context {
 public:
  explicit FakeContext(FakeDevice* device) : device_(device) {}
  ~FakeContext() override { stream_.Drain(); }

  absl::StatusOr<Allocation> Allocate(uint64_t bytes) override { return device_->Allocate(bytes); }
  void Free(const Allocation& allocation) override {
    stream_.Drain();
    device_->Free(allocation);
  }
  absl::Status Write(const Allocation& dst, uint64_t offset, std::span<const uint8_t> bytes) override {
    stream_.Drain();
    std::memcpy(reinterpret_cast<uint8_t*>(dst.address) + offset, bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  absl::Status Read(const Allocation& src, uint64_t offset, std::span<uint8_t> bytes) override {
    stream_.Drain();
    std::memcpy(bytes.data(), reinterpret_cast<const uint8_t*>(src.address) + offset, bytes.size());
    return absl::OkStatus();
  }
  // A device-to-device copy is submitted in order like a launch without wait.
  absl::Status Copy(const Allocation& dst, uint64_t dst_offset, const Allocation& src, uint64_t src_offset,
                    uint64_t bytes) override {
    if (device_->Locked([](FakeCounts&, FakeFaults& f) { return FakeFaults::Due(f.copy); }))
      return device_->faults().status;
    stream_.Enqueue([=] {
      std::memmove(reinterpret_cast<uint8_t*>(dst.address) + dst_offset,
                   reinterpret_cast<const uint8_t*>(src.address) + src_offset, bytes);
    });
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Kernel>> Load(const ProgramSource& source, const std::filesystem::path& artifact) override {
    std::FILE* f = std::fopen(artifact.c_str(), "rb");
    if (!f) return absl::InternalError(absl::StrCat("fake: cannot read ", artifact.string()));
    char name[256] = {};
    const size_t n = std::fread(name, 1, sizeof name - 1, f);
    std::fclose(f);
    const FakeKernelBody* body = device_->Body(std::string(name, n));
    if (!body) return absl::InvalidArgumentError("fake: the artifact names no kernel");
    return MakeKernel(source.signature, *body);
  }
  absl::StatusOr<std::optional<absl::Duration>> Launch(const Kernel& kernel, std::span<const ArgValue> args,
                                                       const Dim3& global, const Dim3&, bool wait) override {
    if (device_->Locked([](FakeCounts& c, FakeFaults& f) {
          ++c.launches;
          return FakeFaults::Due(f.launch);
        }))
      return device_->faults().status;
    stream_.Enqueue([&kernel, args = std::vector<ArgValue>(args.begin(), args.end()), global] {
      static_cast<const FakeKernel&>(kernel).Run(args, global);
    });
    if (!wait) return std::optional<absl::Duration>();
    stream_.Drain();
    return std::optional<absl::Duration>(absl::Microseconds(1));
  }
  absl::Status Synchronize() override {
    stream_.Drain();
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<DeviceGraph>> Instantiate(
      std::span<const GraphNode> nodes, std::span<const std::pair<size_t, size_t>> edges) override {
    if (device_->Locked([](FakeCounts&, FakeFaults& f) { return FakeFaults::Due(f.instantiate); }))
      return device_->faults().status;
    for (const GraphNode& n : nodes)
      if (n.is_copy())
        if (absl::Status s = CheckFakeCopy(*device_, n.args, n.copy_bytes); !s.ok()) return s;
    device_->Locked([](FakeCounts& c, FakeFaults&) { return ++c.instantiations; });
    return std::make_unique<FakeDeviceGraph>(device_, &stream_, nodes, edges);
  }
  uint64_t address_space() const override { return 0; }
  bool wants_edges() const override { return true; }  // its graphs run nodes as edges allow
  absl::Status health() const override { return device_->lost(); }

  // A kernel of this context with `signature` that runs `body`.
  static std::unique_ptr<Kernel> MakeKernel(Signature signature, FakeKernelBody body) {
    return std::make_unique<FakeKernel>(std::move(signature), std::move(body));
  }

  // Runs what is queued (a test that looks at device memory directly).
  void Drain() { stream_.Drain(); }

 private:
  FakeDevice* const device_;
  FakeStream stream_;
};

inline absl::StatusOr<std::unique_ptr<Context>> FakeDevice::OpenContext(const ContextOptions&) {
  return std::unique_ptr<Context>(std::make_unique<FakeContext>(this));
}

}  // namespace replayd::testing

#endif  // REPLAYD_TESTS_SUPPORT_FAKE_DRIVER_H_

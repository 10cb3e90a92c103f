// The device interface. Everything above drivers/ reaches a CPU, an NVIDIA GPU or an
// AMD GPU only through these classes, so the engine is testable and device-agnostic.
//
// A Driver finds the devices of one kind. A Device is one physical device: it reports
// what it is, accounts its memory and compiles program sources into artifacts. A
// Context is one session's view of a device (on CUDA a context or a stream, on the
// CPU an accounting scope): it owns allocations and loaded kernels and executes work
// in submission order.
//
// Thread safety: Device methods may be called from any thread. A Context is used by
// one session; its methods may be called from several threads but the caller orders
// submissions it cares about (the engine serialises per session).
#ifndef REPLAYD_DRIVERS_DRIVER_H_
#define REPLAYD_DRIVERS_DRIVER_H_

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "drivers/device_memory.h"

namespace replayd {

enum class DeviceKind { kCpu, kCuda, kHip };

absl::string_view DeviceKindName(DeviceKind kind);

using Dim3 = std::array<uint64_t, 3>;

struct LaunchLimits {
  Dim3 max_global{1, 1, 1};
  uint64_t max_global_total = 1;
  Dim3 max_local{1, 1, 1};
  uint64_t max_local_total = 1;
  uint32_t max_args = 64;
};

struct DeviceInfo {
  std::string id;  // "cpu:0"
  DeviceKind kind = DeviceKind::kCpu;
  std::string name;
  uint64_t total_memory = 0;
  LaunchLimits limits;
  std::vector<std::string> formats;  // program formats this device accepts
  std::string driver_version;
  std::string architecture;  // "sm_90", "gfx90a", "x86_64"
  std::string target;        // compile target, part of every compile key ("x86_64-gcc-12.2")
};

// A kernel argument as the signature declares it.
enum class ParamKind { kBuffer, kInt32, kInt64 };
enum class Access { kNone, kIn, kOut, kInout };

struct Param {
  std::string name;
  ParamKind kind = ParamKind::kBuffer;
  Access access = Access::kNone;  // buffers only
};

struct Signature {
  std::vector<Param> params;
  bool core_id = false;  // cpu-c: pass the invocation index as a trailing int
};

// What a program is made from. Everything here enters the compile key.
struct ProgramSource {
  std::string format;  // "cpu-c", "cuda-ptx", ...
  std::string code;
  std::string entry;
  Signature signature;
  std::vector<std::string> options;
};

// One packed kernel argument: a device address (view offset applied) for a buffer,
// the value for an integer. Packing into the vendor layout is the driver's business.
union ArgValue {
  uint64_t address;
  int64_t integer;
};

// A device allocation. Opaque above the driver except for its address and size.
struct Allocation {
  uint64_t address = 0;
  uint64_t bytes = 0;
};

// A loaded kernel, owned by the Context that loaded it.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const Signature& signature() const = 0;
};

// One node of a device graph: a kernel launch (the kernel, its packed arguments and
// dimensions) or, with no kernel, a device-to-device copy of `copy_bytes` from the
// address args[1] to the address args[0] (ranges that do not overlap).
struct GraphNode {
  const Kernel* kernel = nullptr;  // null: a copy
  std::vector<ArgValue> args;
  Dim3 global{1, 1, 1};
  Dim3 local{1, 1, 1};
  uint64_t copy_bytes = 0;  // copies only

  bool is_copy() const { return kernel == nullptr; }
};

// A batch of launches prepared once and submitted many times (a CUDA graph, a HIP graph,
// a CPU replay list). Between submissions the engine patches, in place, only the nodes
// whose arguments or dimensions depend on graph parameters.
//
// Thread safety: not thread-safe; the engine serialises the use of one device graph.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  // Replaces node `node`'s arguments (same count and kinds as instantiated) and
  // dimensions (within the device's limits; ignored for a copy, whose arguments are its
  // destination and source addresses). Takes effect at the next Launch.
  virtual absl::Status Update(size_t node, std::span<const ArgValue> args, const Dim3& global, const Dim3& local) = 0;
  // Submits every node in order on the owning context. With `wait`, returns after
  // completion with the device time.
  virtual absl::StatusOr<std::optional<absl::Duration>> Launch(bool wait) = 0;
};

class Context {
 public:
  virtual ~Context() = default;

  // Allocates `bytes` (> 0) of zeroed device memory, counted against the device's
  // memory. RESOURCE_EXHAUSTED when the device cannot hold it; nothing is allocated.
  virtual absl::StatusOr<Allocation> Allocate(uint64_t bytes) = 0;
  // Releases an allocation made by this context after pending work on it completes.
  virtual void Free(const Allocation& allocation) = 0;
  // The `bytes` (> 0) at the start of the memfd `fd`, which another process maps too
  // (sealed against shrinking, so neither mapping can lose its pages), as an allocation of
  // this context, counted like Allocate's and released by Free: a CPU executor's buffers,
  // which the daemon copies into and out of directly. Does not take `fd`. UNIMPLEMENTED
  // where device memory is not host memory.
  virtual absl::StatusOr<Allocation> AllocateShared(int /*fd*/, uint64_t /*bytes*/) {
    return absl::UnimplementedError("this device's memory cannot be shared with another process");
  }

  // Page-locks `host`, memory of this process that stays mapped while the context lives,
  // for this context's transfers: a Write from inside it or a Read into it then copies
  // straight between it and the device (DMA) rather than through staging buffers. Undone
  // when the context is destroyed. OK with nothing done where device memory is host
  // memory; after an error transfers stay as they were. An executor pins its channel's
  // data area, through which the daemon's transfers come.
  virtual absl::Status PinHost(std::span<uint8_t> /*host*/) { return absl::OkStatus(); }

  // Host <-> device copies of `bytes.size()` bytes at `offset`. The caller has checked
  // the range. Write returns once the source may be reused; Read once the bytes are there,
  // ordered after every earlier submission of this context (a read after a launch
  // without wait sees what it wrote).
  virtual absl::Status Write(const Allocation& dst, uint64_t offset, std::span<const uint8_t> bytes) = 0;
  virtual absl::Status Read(const Allocation& src, uint64_t offset, std::span<uint8_t> bytes) = 0;
  // Device-to-device copy, submitted in order like a launch; ranges checked by the
  // caller. A fault is returned here or by the next Synchronize.
  virtual absl::Status Copy(const Allocation& dst, uint64_t dst_offset, const Allocation& src, uint64_t src_offset,
                            uint64_t bytes) = 0;

  // Loads an artifact produced by Device::Compile for `source`. The returned kernel
  // stays valid until it is destroyed; it must not outlive this context.
  virtual absl::StatusOr<std::unique_ptr<Kernel>> Load(const ProgramSource& source,
                                                       const std::filesystem::path& artifact) = 0;

  // Submits one launch. `args` follow kernel.signature() (checked by the caller);
  // dimensions are within the device's limits. With `wait`, returns after completion
  // with the device time; without, the time is unset and completion is observed by
  // Synchronize. A kernel fault is returned here or by the next Synchronize.
  virtual absl::StatusOr<std::optional<absl::Duration>> Launch(const Kernel& kernel, std::span<const ArgValue> args,
                                                               const Dim3& global, const Dim3& local, bool wait) = 0;

  // Waits for every submission of this context to complete.
  virtual absl::Status Synchronize() = 0;

  // Prepares `nodes` as one device graph. The kernels must outlive it. The result must
  // be as if the nodes ran one after another on this context; `edges` (from, to) are the
  // orderings that matter (from the access modes of their buffers), so a device that
  // runs nodes concurrently may run any two nodes no chain of edges orders.
  virtual absl::StatusOr<std::unique_ptr<DeviceGraph>> Instantiate(
      std::span<const GraphNode> nodes, std::span<const std::pair<size_t, size_t>> edges) = 0;
  // True when Instantiate uses its edges (a device that runs graph nodes concurrently);
  // the engine computes them only then.
  virtual bool wants_edges() const { return false; }
  // False for a node a device graph of this context cannot hold; the engine then gives
  // it a batch of its own.
  virtual bool CanBatch(const GraphNode&) const { return true; }
  // Contexts that share an address space may use each other's device graphs and
  // buffers; the graph cache keys by this.
  virtual uint64_t address_space() const = 0;
  // OK while the context can run work; once it never can again (the executor it lived in
  // has ended), the cause, FAILED_PRECONDITION. The engine then closes its session.
  virtual absl::Status health() const { return absl::OkStatus(); }
};

// Where a context's device work runs.
enum class Isolation {
  kProcess,  // in a process of the tenant's own, where the device supports it (cpu, cuda)
  kShared,   // in the daemon's process, beside every other tenant: for trusted tenants
};

absl::string_view IsolationName(Isolation isolation);  // "process", "shared"

// What a context is opened for.
struct ContextOptions {
  std::string tenant;
  Isolation isolation = Isolation::kProcess;
  // Longest one command of the context (a launch, a graph replay, a transfer) may run in
  // a process of its own before the process is ended; zero: the device's default.
  absl::Duration max_launch = absl::ZeroDuration();
  // Bytes of memory the tenant may hold on all devices together (its memory_bytes quota;
  // 0: no quota). A cpu context in a process of its own: the process's address space is
  // limited to it (ExecutorOptions::address_space_margin).
  uint64_t memory_quota = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual const DeviceInfo& info() const = 0;
  // Bytes currently allocated by all contexts of this device.
  virtual uint64_t memory_in_use() const = 0;
  // The device's memory account, where every context of it reserves before it
  // allocates; a device that wraps another (the executor device) shares the wrapped one's.
  virtual DeviceMemory& memory() = 0;
  // OK while this process can still use the device; once it never can again (a CUDA
  // sticky error loses every context of the process, a HIP kernel fault the runtime's
  // state for every stream), the cause. An executor hosting the
  // device then ends, so its tenant's next context starts a fresh process.
  virtual absl::Status health() const { return absl::OkStatus(); }

  // Compiles `source` into an artifact written at `output` (a fresh path the caller
  // renames into the compile cache). INVALID_ARGUMENT carrying the compiler's
  // diagnostics when the source does not compile; DEADLINE_EXCEEDED past the compile
  // time limit.
  virtual absl::Status Compile(const ProgramSource& source, const std::filesystem::path& output) = 0;

  // A new context for one session of `options.tenant`. A device that keeps tenants apart
  // (the executor device) runs it as `options` say; the others run every context in the
  // daemon's process and ignore the options.
  virtual absl::StatusOr<std::unique_ptr<Context>> OpenContext(const ContextOptions& options) = 0;
};

class Driver {
 public:
  virtual ~Driver() = default;
  // The devices this driver found; an empty list (with the reason logged) when the
  // vendor library or hardware is missing.
  virtual std::vector<std::unique_ptr<Device>> Discover() = 0;
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_DRIVER_H_

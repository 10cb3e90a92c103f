// The CPU device: host memory accounted against a limit, cpu-c programs compiled by
// the system C compiler into shared objects, and launches run as parallel loops on a
// thread pool. A launch runs to completion before Launch returns, so Synchronize has
// nothing to wait for.
#ifndef REPLAYD_DRIVERS_CPU_CPU_DRIVER_H_
#define REPLAYD_DRIVERS_CPU_CPU_DRIVER_H_

#include <memory>

#include "drivers/cpu/c_compiler.h"
#include "drivers/cpu/thread_pool.h"
#include "drivers/device_memory.h"
#include "drivers/driver.h"
#include "drivers/live_allocations.h"

namespace replayd {

struct CpuDriverOptions {
  uint64_t memory_limit = 0;  // bytes; 0 means half of physical memory
  CCompilerOptions compiler;
  int threads = 0;  // parallel invocations at once; 0 means one per core
};

class CpuDriver : public Driver {
 public:
  explicit CpuDriver(CpuDriverOptions options) : options_(std::move(options)) {}
  // One device, cpu:0.
  std::vector<std::unique_ptr<Device>> Discover() override;

 private:
  CpuDriverOptions options_;
};

class CpuDevice : public Device {
 public:
  explicit CpuDevice(CpuDriverOptions options);

  const DeviceInfo& info() const override { return info_; }
  uint64_t memory_in_use() const override { return memory_.in_use(); }
  absl::Status Compile(const ProgramSource& source, const std::filesystem::path& output) override;
  absl::StatusOr<std::unique_ptr<Context>> OpenContext(const ContextOptions& options) override;

  DeviceMemory& memory() override { return memory_; }
  ThreadPool& pool() { return pool_; }

  // The live allocations of every context of this device (they share one address space),
  // so that a device graph's copy node is checked as CUDA checks one: on memory the device
  // knows, never a placeholder address.
  LiveAllocations& allocations() { return allocations_; }
  const LiveAllocations& allocations() const { return allocations_; }

 private:
  DeviceInfo info_;
  CCompiler compiler_;
  ThreadPool pool_;
  DeviceMemory memory_;
  LiveAllocations allocations_;
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CPU_CPU_DRIVER_H_

// The executor's side of its channel: runs the daemon's commands on one real device in
// this process. Contexts, kernels and device graphs are kept by id, allocations by
// address per context, and every command is checked against them (an unknown id, a range
// outside an allocation, a kernel of another context, a wrong argument count) so that a
// bad command is refused with a status, never run.
//
// Thread safety: single-threaded; Run owns the calling thread.
#ifndef REPLAYD_DRIVERS_EXECUTOR_EXECUTOR_SERVER_H_
#define REPLAYD_DRIVERS_EXECUTOR_EXECUTOR_SERVER_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>

#include "drivers/driver.h"
#include "drivers/executor/channel.h"
#include "drivers/executor/executor.pb.h"

namespace replayd::executor {

class ExecutorServer {
 public:
  ExecutorServer(Channel& channel, Device& device) : channel_(channel), device_(device) {}

  // Serves commands until the process `parent` is no longer this process's parent (the
  // daemon is gone), then returns 0; returns 1 if the channel fails.
  int Run(pid_t parent);

  // Runs one command; exposed for tests.
  Reply Handle(const Request& request, std::span<uint8_t> data);

 private:
  struct ContextState {
    std::unique_ptr<Context> context;
    std::map<uint64_t, Allocation> allocations;  // by address
  };
  struct KernelState {
    uint64_t context;
    std::unique_ptr<Kernel> kernel;
  };
  struct GraphState {
    uint64_t context;
    std::unique_ptr<DeviceGraph> graph;
    std::vector<size_t> arg_counts;  // per node, as instantiated
  };

  absl::StatusOr<ContextState*> FindContext(uint64_t id);
  absl::StatusOr<Allocation> FindAllocation(ContextState& c, const Region& region, uint64_t offset, uint64_t bytes);
  absl::StatusOr<const Kernel*> FindKernel(uint64_t context, uint64_t id) const;
  absl::Status Run(const Request& request, std::span<uint8_t> data, Reply& reply);
  absl::Status RunGraphCommand(const Request& request, Reply& reply);
  void CloseContext(uint64_t id);

  Channel& channel_;
  Device& device_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, ContextState> contexts_;
  std::map<uint64_t, KernelState> kernels_;
  std::map<uint64_t, GraphState> graphs_;
};

}  // namespace replayd::executor

#endif  // REPLAYD_DRIVERS_EXECUTOR_EXECUTOR_SERVER_H_

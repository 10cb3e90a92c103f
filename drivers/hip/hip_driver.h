// AMD GPUs through the HIP runtime (libamdhip64 loaded at run time). Each device is
// hip:N in the runtime's order. A context is one session's stream on the device: HIP
// has one address space per process and device, so sessions are kept apart by handles,
// not by the hardware, and a kernel fault stops every session on the device (the ROCm
// runtime aborts the process on a GPU memory fault).
//
// Programs: hip-hsaco code objects are loaded with hipModuleLoadData; hip-c is compiled
// by hiprtc for the device's gfx target and cached by content like cpu-c. A device graph
// is a hipGraph whose kernel nodes have edges only where access modes demand them,
// patched with hipGraphExecKernelNodeSetParams, or an in-order stream replay of prepared
// launches, which is often faster on ROCm 5: --hip_device_graph chooses.
#ifndef REPLAYD_DRIVERS_HIP_HIP_DRIVER_H_
#define REPLAYD_DRIVERS_HIP_HIP_DRIVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "drivers/driver.h"

namespace replayd {

enum class HipDeviceGraph {
  kAuto,    // stream replay on ROCm 5, hipGraph from ROCm 6
  kGraph,   // a hipGraph per batch
  kStream,  // the batch's prepared launches, in order on the session's stream
};

// "auto", "graph" or "stream".
absl::StatusOr<HipDeviceGraph> ParseHipDeviceGraph(absl::string_view name);
// The name ParseHipDeviceGraph reads back.
absl::string_view HipDeviceGraphName(HipDeviceGraph graph);

struct HipDriverOptions {
  HipDeviceGraph device_graph = HipDeviceGraph::kAuto;
  // Bytes of each of a context's two pinned staging buffers (see CudaDriverOptions).
  uint64_t staging_bytes = 1 << 20;
  // Bytes of argument segments the node updates of a hipGraph's exec may take before the
  // exec is instantiated afresh: ROCm gives them back only with the exec (HipBatch).
  uint64_t graph_kernarg_bytes = 16 << 20;
};

class HipDriver : public Driver {
 public:
  explicit HipDriver(HipDriverOptions options) : options_(options) {}

  // Every device the HIP runtime reports; none, with the reason in unavailable(), when
  // libamdhip64 cannot be loaded or finds no GPU.
  std::vector<std::unique_ptr<Device>> Discover() override;
  const std::string& unavailable() const { return unavailable_; }

 private:
  HipDriverOptions options_;
  std::string unavailable_;
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_HIP_HIP_DRIVER_H_

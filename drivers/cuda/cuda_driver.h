// NVIDIA GPUs through the CUDA Driver API (libcuda loaded at run time). Each device is
// cuda:N in the driver's ordinal order. A context is one session's view: by default a
// CUDA context of its own (a separate address space, so a kernel fault in one session
// leaves the others working), or the device's primary context with a stream per session
// (cheaper to open, but a fault then stops every session on the device).
//
// Programs: cuda-ptx and cuda-cubin are loaded with cuModuleLoadDataEx, whose JIT error
// log is returned as the diagnostics; cuda-c is compiled by NVRTC to a cubin for the
// device's architecture and cached by content like cpu-c. Launches and device graphs run
// on the context's stream; a device graph is a CUDA graph whose kernel and memcpy nodes
// have edges only where access modes demand them, patched with
// cuGraphExecKernelNodeSetParams and cuGraphExecMemcpyNodeSetParams.
#ifndef REPLAYD_DRIVERS_CUDA_CUDA_DRIVER_H_
#define REPLAYD_DRIVERS_CUDA_CUDA_DRIVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "drivers/driver.h"

namespace replayd {

enum class CudaContextPolicy {
  kSession,  // a CUDA context per session: separate address spaces, faults isolated
  kPrimary,  // the device's primary context, a stream per session
};

// "session" or "primary".
absl::StatusOr<CudaContextPolicy> ParseCudaContextPolicy(absl::string_view name);

struct CudaDriverOptions {
  CudaContextPolicy context = CudaContextPolicy::kSession;
  // Bytes of each of a context's two pinned staging buffers: writes and reads go through
  // them in chunks of this size, one chunk copying while the next is filled.
  uint64_t staging_bytes = 1 << 20;
  // Load NVRTC to compile cuda-c. An executor, which only loads what the daemon compiled,
  // does without.
  bool compile = true;
};

class CudaDriver : public Driver {
 public:
  explicit CudaDriver(CudaDriverOptions options) : options_(options) {}

  // Every device the NVIDIA driver reports; none, with the reason in unavailable(), when
  // libcuda cannot be loaded or initialised.
  std::vector<std::unique_ptr<Device>> Discover() override;

  // Why the last Discover found no devices; empty when it found some.
  const std::string& unavailable() const { return unavailable_; }
  // Why the devices found do not serve cuda-c (NVRTC could not be loaded); empty when
  // they do or when there are none.
  const std::string& cuda_c_unavailable() const { return cuda_c_unavailable_; }

 private:
  CudaDriverOptions options_;
  std::string unavailable_;
  std::string cuda_c_unavailable_;
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CUDA_CUDA_DRIVER_H_

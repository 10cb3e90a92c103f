// What a CUDA device's Compile makes of a program source, without touching a GPU:
// cuda-c compiled by NVRTC to a cubin for the device's architecture, with the kernel's
// lowered name; cuda-ptx and cuda-cubin checked for their form and passed on as they
// are, to be loaded (and PTX JIT-compiled) by the driver at Load.
#ifndef REPLAYD_DRIVERS_CUDA_CUDA_PROGRAM_H_
#define REPLAYD_DRIVERS_CUDA_CUDA_PROGRAM_H_

#include <string>

#include "absl/status/statusor.h"
#include "drivers/cuda/nvrtc.h"
#include "drivers/driver.h"
#include "drivers/module_artifact.h"

namespace replayd {

// The module for `source` on a device of architecture `arch` ("sm_90"). INVALID_ARGUMENT
// with NVRTC's diagnostics for a cuda-c source that does not compile, for options given
// to a cuda-ptx or cuda-cubin program, for PTX without a .version directive and for a
// cubin that is not an ELF image; FAILED_PRECONDITION for cuda-c without NVRTC.
absl::StatusOr<ModuleArtifact> BuildCudaModule(const ProgramSource& source, const Nvrtc* nvrtc,
                                               const std::string& arch);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CUDA_CUDA_PROGRAM_H_

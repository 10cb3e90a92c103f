// How the GPU drivers answer an error code from their vendor runtime, the same way for
// CUDA and HIP: each driver sorts its codes into these kinds, and all but a fault map to
// one status code here.
#ifndef REPLAYD_DRIVERS_DEVICE_ERROR_H_
#define REPLAYD_DRIVERS_DEVICE_ERROR_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace replayd {

enum class DeviceErrorKind {
  kFault,        // the device state is lost (illegal address, launch failure, ...): sticky
  kOutOfMemory,  // RESOURCE_EXHAUSTED
  kBadRequest,   // a value the runtime refused (dimensions, resources): INVALID_ARGUMENT
  kOther,        // INTERNAL
};

// "cuda:0: cuMemAlloc of 64 bytes: CUDA_ERROR_OUT_OF_MEMORY (out of memory)" with the
// code of `kind`. The caller records a kFault as its context's or device's fault; given
// one here, the status is FAILED_PRECONDITION.
absl::Status DeviceError(DeviceErrorKind kind, absl::string_view device, absl::string_view what,
                         absl::string_view text);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_DEVICE_ERROR_H_

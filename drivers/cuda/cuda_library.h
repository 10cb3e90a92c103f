// The CUDA driver library, loaded at run time: libcuda.so.1 through dlopen, each entry
// point through cuGetProcAddress, typed from the toolkit's own cuda.h. Without the
// library (no NVIDIA driver on this machine) Load says why and the daemon serves no CUDA
// devices; nothing links against libcuda, so one binary runs everywhere.
#ifndef REPLAYD_DRIVERS_CUDA_CUDA_LIBRARY_H_
#define REPLAYD_DRIVERS_CUDA_CUDA_LIBRARY_H_

#include <cuda.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace replayd {

class CudaLibrary {
 public:
  // Opens libcuda.so.1 and resolves every entry point below, then cuInit(0).
  // UNAVAILABLE naming what is missing when the library, a symbol or a device is not there.
  static absl::StatusOr<std::unique_ptr<CudaLibrary>> Load();
  ~CudaLibrary();

  // An error code as "CUDA_ERROR_INVALID_VALUE (invalid argument)".
  std::string ErrorText(CUresult r) const;

#define REPLAYD_CUDA_ENTRY(name) decltype(&::name) name = nullptr;
  REPLAYD_CUDA_ENTRY(cuInit)
  REPLAYD_CUDA_ENTRY(cuDriverGetVersion)
  REPLAYD_CUDA_ENTRY(cuGetErrorName)
  REPLAYD_CUDA_ENTRY(cuGetErrorString)
  REPLAYD_CUDA_ENTRY(cuDeviceGetCount)
  REPLAYD_CUDA_ENTRY(cuDeviceGet)
  REPLAYD_CUDA_ENTRY(cuDeviceGetName)
  REPLAYD_CUDA_ENTRY(cuDeviceTotalMem)
  REPLAYD_CUDA_ENTRY(cuDeviceGetAttribute)
#undef REPLAYD_CUDA_ENTRY

 private:
  CudaLibrary() = default;
  void* handle_ = nullptr;
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CUDA_CUDA_LIBRARY_H_

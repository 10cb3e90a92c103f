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
  // Opens libcuda.so.1, resolves every entry point below and calls cuInit(0).
  // UNAVAILABLE naming what is missing when the library, a symbol or a device is not
  // there, or when the driver is older than CUDA 12.5.
  static absl::StatusOr<std::unique_ptr<CudaLibrary>> Load();
  ~CudaLibrary();

  static constexpr int kMinimumVersion = 12050;

  // The CUDA version the driver supports, as cuDriverGetVersion says (13000 for 13.0).
  int version() const { return version_; }

  // An error code as "CUDA_ERROR_INVALID_VALUE (invalid argument)".
  std::string ErrorText(CUresult r) const;

  // A sticky error (a kernel fault) leaves every CUDA context of the process unusable,
  // contexts created later included, whichever CudaLibrary opened them: the record is
  // the process's. The first one recorded, or OK.
  static absl::Status sticky_fault();
  // Records `fault` unless one is recorded already.
  static void RecordStickyFault(absl::Status fault);

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
  REPLAYD_CUDA_ENTRY(cuCtxCreate)
  REPLAYD_CUDA_ENTRY(cuCtxDestroy)
  REPLAYD_CUDA_ENTRY(cuCtxSetCurrent)
  REPLAYD_CUDA_ENTRY(cuCtxPopCurrent)
  REPLAYD_CUDA_ENTRY(cuDevicePrimaryCtxRetain)
  REPLAYD_CUDA_ENTRY(cuDevicePrimaryCtxRelease)
  REPLAYD_CUDA_ENTRY(cuStreamCreate)
  REPLAYD_CUDA_ENTRY(cuStreamDestroy)
  REPLAYD_CUDA_ENTRY(cuStreamSynchronize)
  REPLAYD_CUDA_ENTRY(cuMemAlloc)
  REPLAYD_CUDA_ENTRY(cuMemFree)
  REPLAYD_CUDA_ENTRY(cuMemsetD8Async)
  REPLAYD_CUDA_ENTRY(cuMemHostAlloc)
  REPLAYD_CUDA_ENTRY(cuMemFreeHost)
  REPLAYD_CUDA_ENTRY(cuMemHostRegister)
  REPLAYD_CUDA_ENTRY(cuMemHostUnregister)
  REPLAYD_CUDA_ENTRY(cuMemcpyHtoDAsync)
  REPLAYD_CUDA_ENTRY(cuMemcpyDtoHAsync)
  REPLAYD_CUDA_ENTRY(cuMemcpyDtoDAsync)
  REPLAYD_CUDA_ENTRY(cuModuleLoadDataEx)
  REPLAYD_CUDA_ENTRY(cuModuleUnload)
  REPLAYD_CUDA_ENTRY(cuModuleGetFunction)
  REPLAYD_CUDA_ENTRY(cuFuncGetParamInfo)
  REPLAYD_CUDA_ENTRY(cuFuncGetAttribute)
  REPLAYD_CUDA_ENTRY(cuLaunchKernel)
  REPLAYD_CUDA_ENTRY(cuEventCreate)
  REPLAYD_CUDA_ENTRY(cuEventDestroy)
  REPLAYD_CUDA_ENTRY(cuEventRecord)
  REPLAYD_CUDA_ENTRY(cuEventSynchronize)
  REPLAYD_CUDA_ENTRY(cuEventElapsedTime)
  REPLAYD_CUDA_ENTRY(cuGraphCreate)
  REPLAYD_CUDA_ENTRY(cuGraphDestroy)
  REPLAYD_CUDA_ENTRY(cuGraphAddKernelNode)
  REPLAYD_CUDA_ENTRY(cuGraphAddMemcpyNode)
  REPLAYD_CUDA_ENTRY(cuGraphInstantiateWithFlags)
  REPLAYD_CUDA_ENTRY(cuGraphExecDestroy)
  REPLAYD_CUDA_ENTRY(cuGraphExecKernelNodeSetParams)
  REPLAYD_CUDA_ENTRY(cuGraphExecMemcpyNodeSetParams)
  REPLAYD_CUDA_ENTRY(cuGraphLaunch)
#undef REPLAYD_CUDA_ENTRY

 private:
  CudaLibrary() = default;
  void* handle_ = nullptr;
  int version_ = 0;

};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CUDA_CUDA_LIBRARY_H_

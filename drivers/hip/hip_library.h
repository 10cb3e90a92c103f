// The HIP runtime, loaded at run time: libamdhip64 through dlopen, each entry point
// through dlsym, typed from Debian's HIP headers. hiprtc (the hip-c compiler) is inside
// libamdhip64 on ROCm 5 and a library of its own (libhiprtc) on ROCm 6; either is found.
// Nothing links against ROCm, so one binary runs everywhere.
#ifndef REPLAYD_DRIVERS_HIP_HIP_LIBRARY_H_
#define REPLAYD_DRIVERS_HIP_HIP_LIBRARY_H_

#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace replayd {

class HipLibrary {
 public:
  // Opens libamdhip64 and resolves every runtime entry point below. UNAVAILABLE naming
  // what is missing. hipInit is left to the caller, which reports "no devices" its own way.
  static absl::StatusOr<std::unique_ptr<HipLibrary>> Load();
  ~HipLibrary();

  // An error code as "hipErrorInvalidValue (invalid argument)".
  std::string ErrorText(hipError_t e) const;
  // True when the hiprtc entry points were found (hip-c can be compiled).
  bool has_hiprtc() const { return hiprtcCompileProgram != nullptr; }
  // hiprtc's reason for being absent; empty when it is there.
  const std::string& hiprtc_missing() const { return hiprtc_missing_; }

#define REPLAYD_HIP_ENTRY(name) decltype(&::name) name = nullptr;
  REPLAYD_HIP_ENTRY(hipInit)
  REPLAYD_HIP_ENTRY(hipDriverGetVersion)
  REPLAYD_HIP_ENTRY(hipRuntimeGetVersion)
  REPLAYD_HIP_ENTRY(hipGetErrorName)
  REPLAYD_HIP_ENTRY(hipGetErrorString)
  REPLAYD_HIP_ENTRY(hipGetDeviceCount)
  REPLAYD_HIP_ENTRY(hipGetDeviceProperties)
  REPLAYD_HIP_ENTRY(hipDeviceGetAttribute)
  REPLAYD_HIP_ENTRY(hipDeviceTotalMem)
  REPLAYD_HIP_ENTRY(hipSetDevice)
  REPLAYD_HIP_ENTRY(hipDeviceReset)
  REPLAYD_HIP_ENTRY(hipStreamCreateWithFlags)
  REPLAYD_HIP_ENTRY(hipStreamDestroy)
  REPLAYD_HIP_ENTRY(hipStreamSynchronize)
  // hipMalloc and hipHostMalloc are overloaded in C++ (templates over T**): the C forms.
  hipError_t (*hipMalloc)(void** ptr, size_t size) = nullptr;
  REPLAYD_HIP_ENTRY(hipFree)
  REPLAYD_HIP_ENTRY(hipMemsetAsync)
  hipError_t (*hipHostMalloc)(void** ptr, size_t size, unsigned int flags) = nullptr;
  REPLAYD_HIP_ENTRY(hipHostFree)
  REPLAYD_HIP_ENTRY(hipHostRegister)
  REPLAYD_HIP_ENTRY(hipHostUnregister)
  REPLAYD_HIP_ENTRY(hipMemcpyHtoDAsync)
  REPLAYD_HIP_ENTRY(hipMemcpyDtoHAsync)
  REPLAYD_HIP_ENTRY(hipMemcpyDtoDAsync)
  REPLAYD_HIP_ENTRY(hipModuleLoadData)
  REPLAYD_HIP_ENTRY(hipModuleUnload)
  REPLAYD_HIP_ENTRY(hipModuleGetFunction)
  REPLAYD_HIP_ENTRY(hipModuleLaunchKernel)
  REPLAYD_HIP_ENTRY(hipEventCreateWithFlags)
  REPLAYD_HIP_ENTRY(hipEventDestroy)
  REPLAYD_HIP_ENTRY(hipEventRecord)
  REPLAYD_HIP_ENTRY(hipEventSynchronize)
  REPLAYD_HIP_ENTRY(hipEventElapsedTime)
  REPLAYD_HIP_ENTRY(hipGraphCreate)
  REPLAYD_HIP_ENTRY(hipGraphDestroy)
  REPLAYD_HIP_ENTRY(hipGraphAddKernelNode)
  REPLAYD_HIP_ENTRY(hipGraphAddMemcpyNode1D)
  REPLAYD_HIP_ENTRY(hipGraphInstantiateWithFlags)
  REPLAYD_HIP_ENTRY(hipGraphExecDestroy)
  REPLAYD_HIP_ENTRY(hipGraphExecKernelNodeSetParams)
  REPLAYD_HIP_ENTRY(hipGraphExecMemcpyNodeSetParams1D)
  REPLAYD_HIP_ENTRY(hipGraphLaunch)
  // hiprtc; null when absent.
  REPLAYD_HIP_ENTRY(hiprtcGetErrorString)
  REPLAYD_HIP_ENTRY(hiprtcVersion)
  REPLAYD_HIP_ENTRY(hiprtcCreateProgram)
  REPLAYD_HIP_ENTRY(hiprtcDestroyProgram)
  REPLAYD_HIP_ENTRY(hiprtcAddNameExpression)
  REPLAYD_HIP_ENTRY(hiprtcCompileProgram)
  REPLAYD_HIP_ENTRY(hiprtcGetProgramLogSize)
  REPLAYD_HIP_ENTRY(hiprtcGetProgramLog)
  REPLAYD_HIP_ENTRY(hiprtcGetCodeSize)
  REPLAYD_HIP_ENTRY(hiprtcGetCode)
  REPLAYD_HIP_ENTRY(hiprtcGetLoweredName)
#undef REPLAYD_HIP_ENTRY

 private:
  HipLibrary() = default;
  void* handle_ = nullptr;
  void* hiprtc_handle_ = nullptr;
  std::string hiprtc_missing_;
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_HIP_HIP_LIBRARY_H_

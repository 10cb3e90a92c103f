#include "drivers/cuda/cuda_library.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace replayd {

// The driver library stays loaded for the life of the process, as vendors advise: it
// keeps process-wide state that unloading would strand.
CudaLibrary::~CudaLibrary() = default;

namespace {

struct StickyFault {
  absl::Mutex mu;
  absl::Status fault ABSL_GUARDED_BY(mu);
};

StickyFault& ProcessStickyFault() {
  static StickyFault* fault = new StickyFault();  // never destroyed: used until exit
  return *fault;
}

}  // namespace

absl::Status CudaLibrary::sticky_fault() {
  StickyFault& s = ProcessStickyFault();
  absl::MutexLock lock(&s.mu);
  return s.fault;
}

void CudaLibrary::RecordStickyFault(absl::Status fault) {
  StickyFault& s = ProcessStickyFault();
  absl::MutexLock lock(&s.mu);
  if (s.fault.ok()) s.fault = std::move(fault);
}

absl::StatusOr<std::unique_ptr<CudaLibrary>> CudaLibrary::Load() {
  std::unique_ptr<CudaLibrary> lib(new CudaLibrary());
  lib->handle_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle_) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrCat("libcuda.so.1 not loaded: ", why ? why : "unknown error"));
  }
  using GetProcAddress = decltype(&::cuGetProcAddress_v2);
  auto get = reinterpret_cast<GetProcAddress>(dlsym(lib->handle_, "cuGetProcAddress_v2"));
  if (!get) return absl::UnavailableError("libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)");
  auto resolve = [&](const char* name, void** out) -> absl::Status {
    CUdriverProcAddressQueryResult found;
    CUresult r = get(name, out, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || !*out)
      return absl::UnavailableError(absl::StrCat("libcuda.so.1 lacks ", name, " for CUDA ", CUDA_VERSION));
    return absl::OkStatus();
  };
#define REPLAYD_RESOLVE(name) \
  if (absl::Status s = resolve(#name, reinterpret_cast<void**>(&lib->name)); !s.ok()) return s;
  REPLAYD_RESOLVE(cuInit)
  REPLAYD_RESOLVE(cuDriverGetVersion)
  REPLAYD_RESOLVE(cuGetErrorName)
  REPLAYD_RESOLVE(cuGetErrorString)
  REPLAYD_RESOLVE(cuDeviceGetCount)
  REPLAYD_RESOLVE(cuDeviceGet)
  REPLAYD_RESOLVE(cuDeviceGetName)
  REPLAYD_RESOLVE(cuDeviceTotalMem)
  REPLAYD_RESOLVE(cuDeviceGetAttribute)
  REPLAYD_RESOLVE(cuCtxCreate)
  REPLAYD_RESOLVE(cuCtxDestroy)
  REPLAYD_RESOLVE(cuCtxSetCurrent)
  REPLAYD_RESOLVE(cuCtxPopCurrent)
  REPLAYD_RESOLVE(cuDevicePrimaryCtxRetain)
  REPLAYD_RESOLVE(cuDevicePrimaryCtxRelease)
  REPLAYD_RESOLVE(cuStreamCreate)
  REPLAYD_RESOLVE(cuStreamDestroy)
  REPLAYD_RESOLVE(cuStreamSynchronize)
  REPLAYD_RESOLVE(cuMemAlloc)
  REPLAYD_RESOLVE(cuMemFree)
  REPLAYD_RESOLVE(cuMemsetD8Async)
  REPLAYD_RESOLVE(cuMemHostAlloc)
  REPLAYD_RESOLVE(cuMemFreeHost)
  REPLAYD_RESOLVE(cuMemHostRegister)
  REPLAYD_RESOLVE(cuMemHostUnregister)
  REPLAYD_RESOLVE(cuMemcpyHtoDAsync)
  REPLAYD_RESOLVE(cuMemcpyDtoHAsync)
  REPLAYD_RESOLVE(cuMemcpyDtoDAsync)
  REPLAYD_RESOLVE(cuModuleLoadDataEx)
  REPLAYD_RESOLVE(cuModuleUnload)
  REPLAYD_RESOLVE(cuModuleGetFunction)
  REPLAYD_RESOLVE(cuFuncGetParamInfo)
  REPLAYD_RESOLVE(cuFuncGetAttribute)
  REPLAYD_RESOLVE(cuLaunchKernel)
  REPLAYD_RESOLVE(cuEventCreate)
  REPLAYD_RESOLVE(cuEventDestroy)
  REPLAYD_RESOLVE(cuEventRecord)
  REPLAYD_RESOLVE(cuEventSynchronize)
  REPLAYD_RESOLVE(cuEventElapsedTime)
  REPLAYD_RESOLVE(cuGraphCreate)
  REPLAYD_RESOLVE(cuGraphDestroy)
  REPLAYD_RESOLVE(cuGraphAddKernelNode)
  REPLAYD_RESOLVE(cuGraphAddMemcpyNode)
  REPLAYD_RESOLVE(cuGraphInstantiateWithFlags)
  REPLAYD_RESOLVE(cuGraphExecDestroy)
  REPLAYD_RESOLVE(cuGraphExecKernelNodeSetParams)
  REPLAYD_RESOLVE(cuGraphExecMemcpyNodeSetParams)
  REPLAYD_RESOLVE(cuGraphLaunch)
#undef REPLAYD_RESOLVE
  // Entry points are asked for at this toolkit's version; a driver older than 12.5 would
  // hand back cuCtxCreate with another signature.
  if (CUresult r = lib->cuDriverGetVersion(&lib->version_); r != CUDA_SUCCESS)
    return absl::UnavailableError(absl::StrCat("cuDriverGetVersion: ", lib->ErrorText(r)));
  if (lib->version_ < kMinimumVersion)
    return absl::UnavailableError(absl::StrCat("the NVIDIA driver supports CUDA ", lib->version_ / 1000, ".",
                                               lib->version_ % 1000 / 10, "; replayd needs 12.5 or newer"));
  if (CUresult r = lib->cuInit(0); r != CUDA_SUCCESS)
    return absl::UnavailableError(absl::StrCat("cuInit: ", lib->ErrorText(r)));
  return lib;
}

std::string CudaLibrary::ErrorText(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName) cuGetErrorName(r, &name);
  if (cuGetErrorString) cuGetErrorString(r, &text);
  return absl::StrCat(name ? name : absl::StrCat("CUresult ", static_cast<int>(r)), " (",
                      text ? text : "no description", ")");
}

}  // namespace replayd

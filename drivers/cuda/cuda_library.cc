#include "drivers/cuda/cuda_library.h"

#include <dlfcn.h>

#include <algorithm>

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
  // The driver's version first: cuGetProcAddress refuses a CUDA version newer than the
  // driver's (CUDA_ERROR_INVALID_VALUE), so the entry points are asked for at this
  // toolkit's version or the driver's, whichever is older. Those replayd resolves have had
  // the prototypes of this toolkit's cuda.h since CUDA 12.5 (cuCtxCreate became
  // cuCtxCreate_v4 there), which is why 12.5 is the oldest driver served.
  using DriverGetVersion = decltype(&::cuDriverGetVersion);
  auto driver_version = reinterpret_cast<DriverGetVersion>(dlsym(lib->handle_, "cuDriverGetVersion"));
  if (!driver_version) return absl::UnavailableError("libcuda.so.1 has no cuDriverGetVersion");
  if (CUresult r = driver_version(&lib->version_); r != CUDA_SUCCESS)
    return absl::UnavailableError(absl::StrCat("cuDriverGetVersion: CUresult ", static_cast<int>(r)));
  if (lib->version_ < kMinimumVersion)
    return absl::UnavailableError(absl::StrCat("the NVIDIA driver supports CUDA ", lib->version_ / 1000, ".",
                                               lib->version_ % 1000 / 10, "; replayd needs 12.5 or newer"));
  const int asked = std::min(lib->version_, CUDA_VERSION);
  using GetProcAddress = decltype(&::cuGetProcAddress_v2);
  auto get = reinterpret_cast<GetProcAddress>(dlsym(lib->handle_, "cuGetProcAddress_v2"));
  if (!get) return absl::UnavailableError("libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)");
  auto resolve = [&](const char* name, void** out) -> absl::Status {
    CUdriverProcAddressQueryResult found;
    CUresult r = get(name, out, asked, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || !*out)
      return absl::UnavailableError(absl::StrCat("libcuda.so.1 lacks ", name, " for CUDA ", asked));
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

#include "drivers/cuda/cuda_library.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace replayd {

// The driver library stays loaded for the life of the process, as vendors advise: it
// keeps process-wide state that unloading would strand.
CudaLibrary::~CudaLibrary() = default;

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
#define REPLAYD_RESOLVE(name)                                                              \
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

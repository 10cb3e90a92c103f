#include "drivers/hip/hip_library.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace replayd {
namespace {

void* OpenFirst(std::initializer_list<const char*> names, std::string& why) {
  for (const char* name : names) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return h;
    const char* e = dlerror();
    absl::StrAppend(&why, why.empty() ? "" : "; ", e ? e : name);
  }
  return nullptr;
}

}  // namespace

// The runtime stays loaded for the life of the process: it keeps process-wide state
// (the HSA runtime's threads) that unloading would strand.
HipLibrary::~HipLibrary() = default;

absl::StatusOr<std::unique_ptr<HipLibrary>> HipLibrary::Load() {
  std::unique_ptr<HipLibrary> lib(new HipLibrary());
  std::string why;
  // ROCm 7's name first: its installs may have no unversioned link.
  lib->handle_ = OpenFirst({"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"}, why);
  if (!lib->handle_) return absl::UnavailableError(absl::StrCat("libamdhip64 not loaded: ", why));
#define REPLAYD_RESOLVE(name)                                                    \
  lib->name = reinterpret_cast<decltype(lib->name)>(dlsym(lib->handle_, #name)); \
  if (!lib->name) return absl::UnavailableError(absl::StrCat("libamdhip64 lacks ", #name));
  REPLAYD_RESOLVE(hipInit)
  REPLAYD_RESOLVE(hipDriverGetVersion)
  REPLAYD_RESOLVE(hipRuntimeGetVersion)
  REPLAYD_RESOLVE(hipGetErrorName)
  REPLAYD_RESOLVE(hipGetErrorString)
  REPLAYD_RESOLVE(hipGetDeviceCount)
  REPLAYD_RESOLVE(hipGetDeviceProperties)
  REPLAYD_RESOLVE(hipDeviceGetAttribute)
  REPLAYD_RESOLVE(hipDeviceTotalMem)
  REPLAYD_RESOLVE(hipSetDevice)
  REPLAYD_RESOLVE(hipDeviceReset)
  REPLAYD_RESOLVE(hipStreamCreateWithFlags)
  REPLAYD_RESOLVE(hipStreamDestroy)
  REPLAYD_RESOLVE(hipStreamSynchronize)
  REPLAYD_RESOLVE(hipMalloc)
  REPLAYD_RESOLVE(hipFree)
  REPLAYD_RESOLVE(hipMemsetAsync)
  REPLAYD_RESOLVE(hipHostMalloc)
  REPLAYD_RESOLVE(hipHostFree)
  REPLAYD_RESOLVE(hipHostRegister)
  REPLAYD_RESOLVE(hipHostUnregister)
  REPLAYD_RESOLVE(hipMemcpyHtoDAsync)
  REPLAYD_RESOLVE(hipMemcpyDtoHAsync)
  REPLAYD_RESOLVE(hipMemcpyDtoDAsync)
  REPLAYD_RESOLVE(hipModuleLoadData)
  REPLAYD_RESOLVE(hipModuleUnload)
  REPLAYD_RESOLVE(hipModuleGetFunction)
  REPLAYD_RESOLVE(hipModuleLaunchKernel)
  REPLAYD_RESOLVE(hipEventCreateWithFlags)
  REPLAYD_RESOLVE(hipEventDestroy)
  REPLAYD_RESOLVE(hipEventRecord)
  REPLAYD_RESOLVE(hipEventSynchronize)
  REPLAYD_RESOLVE(hipEventElapsedTime)
  REPLAYD_RESOLVE(hipGraphCreate)
  REPLAYD_RESOLVE(hipGraphDestroy)
  REPLAYD_RESOLVE(hipGraphAddKernelNode)
  REPLAYD_RESOLVE(hipGraphAddMemcpyNode1D)
  REPLAYD_RESOLVE(hipGraphInstantiateWithFlags)
  REPLAYD_RESOLVE(hipGraphExecDestroy)
  REPLAYD_RESOLVE(hipGraphExecKernelNodeSetParams)
  REPLAYD_RESOLVE(hipGraphExecMemcpyNodeSetParams1D)
  REPLAYD_RESOLVE(hipGraphLaunch)
#undef REPLAYD_RESOLVE

  // hiprtc: in the runtime on ROCm 5, in libhiprtc from ROCm 6.
  void* rtc = dlsym(lib->handle_, "hiprtcCompileProgram") ? lib->handle_ : nullptr;
  std::string rtc_why;
  if (!rtc) rtc = OpenFirst({"libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5", "libhiprtc.so"}, rtc_why);
  if (!rtc) {
    lib->hiprtc_missing_ = absl::StrCat("hiprtc not found: ", rtc_why);
    return lib;
  }
  lib->hiprtc_handle_ = rtc;
  bool all = true;
#define REPLAYD_RESOLVE_RTC(name)                                       \
  lib->name = reinterpret_cast<decltype(lib->name)>(dlsym(rtc, #name)); \
  all = all && lib->name;
  REPLAYD_RESOLVE_RTC(hiprtcGetErrorString)
  REPLAYD_RESOLVE_RTC(hiprtcVersion)
  REPLAYD_RESOLVE_RTC(hiprtcCreateProgram)
  REPLAYD_RESOLVE_RTC(hiprtcDestroyProgram)
  REPLAYD_RESOLVE_RTC(hiprtcAddNameExpression)
  REPLAYD_RESOLVE_RTC(hiprtcGetProgramLogSize)
  REPLAYD_RESOLVE_RTC(hiprtcGetProgramLog)
  REPLAYD_RESOLVE_RTC(hiprtcGetCodeSize)
  REPLAYD_RESOLVE_RTC(hiprtcGetCode)
  REPLAYD_RESOLVE_RTC(hiprtcGetLoweredName)
  REPLAYD_RESOLVE_RTC(hiprtcCompileProgram)
#undef REPLAYD_RESOLVE_RTC
  if (!all) {
    lib->hiprtcCompileProgram = nullptr;
    lib->hiprtc_missing_ = "hiprtc lacks an entry point";
  }
  return lib;
}

std::string HipLibrary::ErrorText(hipError_t e) const {
  const char* name = hipGetErrorName ? hipGetErrorName(e) : nullptr;
  const char* text = hipGetErrorString ? hipGetErrorString(e) : nullptr;
  return absl::StrCat(name ? name : absl::StrCat("hipError ", static_cast<int>(e)), " (",
                      text ? text : "no description", ")");
}

}  // namespace replayd

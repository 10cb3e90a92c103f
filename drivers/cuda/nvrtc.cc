#include "drivers/cuda/nvrtc.h"

#include <dlfcn.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "drivers/compile_options.h"

namespace replayd {

// The library stays loaded for the life of the process: its static C++ runtime keeps
// process-wide state (an emergency exception pool) that unloading would strand.
Nvrtc::~Nvrtc() = default;

absl::StatusOr<std::unique_ptr<Nvrtc>> Nvrtc::Load() {
  std::unique_ptr<Nvrtc> n(new Nvrtc());
  std::string why;
  for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so"}) {
    n->handle_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (n->handle_) break;
    const char* e = dlerror();
    absl::StrAppend(&why, why.empty() ? "" : "; ", e ? e : name);
  }
  if (!n->handle_) return absl::UnavailableError(absl::StrCat("NVRTC not loaded: ", why));
#define REPLAYD_RESOLVE(name)                                                 \
  n->name##_ = reinterpret_cast<decltype(&::name)>(dlsym(n->handle_, #name)); \
  if (!n->name##_) return absl::UnavailableError(absl::StrCat("NVRTC lacks ", #name));
  REPLAYD_RESOLVE(nvrtcVersion)
  REPLAYD_RESOLVE(nvrtcGetErrorString)
  REPLAYD_RESOLVE(nvrtcCreateProgram)
  REPLAYD_RESOLVE(nvrtcDestroyProgram)
  REPLAYD_RESOLVE(nvrtcAddNameExpression)
  REPLAYD_RESOLVE(nvrtcCompileProgram)
  REPLAYD_RESOLVE(nvrtcGetProgramLogSize)
  REPLAYD_RESOLVE(nvrtcGetProgramLog)
  REPLAYD_RESOLVE(nvrtcGetPTXSize)
  REPLAYD_RESOLVE(nvrtcGetPTX)
  REPLAYD_RESOLVE(nvrtcGetCUBINSize)
  REPLAYD_RESOLVE(nvrtcGetCUBIN)
  REPLAYD_RESOLVE(nvrtcGetLoweredName)
#undef REPLAYD_RESOLVE
  return n;
}

std::string Nvrtc::version() const {
  int major = 0, minor = 0;
  nvrtcVersion_(&major, &minor);
  return absl::StrCat(major, ".", minor);
}

absl::Status Nvrtc::CheckOptions(const std::vector<std::string>& options) {
  return CheckCompileOptions(options, {"--use_fast_math", "-lineinfo", "--std=c++17", "--std=c++20"}, "cuda-c");
}

absl::StatusOr<NvrtcModule> Nvrtc::Compile(const std::string& source, const std::string& entry, const std::string& arch,
                                           const std::vector<std::string>& options, NvrtcOutput output) const {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (!absl::StartsWith(arch, "sm_") || !IsIdentifier(arch))
    return absl::InvalidArgumentError(absl::StrCat("architecture \"", arch, "\" is not sm_NN"));
  nvrtcProgram prog;
  if (nvrtcResult r = nvrtcCreateProgram_(&prog, source.c_str(), "program.cu", 0, nullptr, nullptr); r != NVRTC_SUCCESS)
    return absl::InternalError(absl::StrCat("nvrtcCreateProgram: ", nvrtcGetErrorString_(r)));
  struct Destroy {
    const Nvrtc* n;
    nvrtcProgram* p;
    ~Destroy() { n->nvrtcDestroyProgram_(p); }
  } destroy{this, &prog};
  nvrtcAddNameExpression_(prog, entry.c_str());
  std::vector<std::string> args = {
      absl::StrCat("--gpu-architecture=", output == NvrtcOutput::kPtx ? "compute_" : "sm_", arch.substr(3))};
  args.insert(args.end(), options.begin(), options.end());
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  nvrtcResult compiled = nvrtcCompileProgram_(prog, static_cast<int>(argv.size()), argv.data());
  NvrtcModule out;
  size_t log_size = 0;
  nvrtcGetProgramLogSize_(prog, &log_size);
  if (log_size > 1) {
    out.log.resize(log_size);
    nvrtcGetProgramLog_(prog, out.log.data());
    out.log.resize(log_size - 1);
  }
  if (compiled != NVRTC_SUCCESS)
    return absl::InvalidArgumentError(
        absl::StrCat("cuda-c compile of ", entry, " failed (", nvrtcGetErrorString_(compiled), "):\n", out.log));
  const char* lowered = nullptr;
  if (nvrtcGetLoweredName_(prog, entry.c_str(), &lowered) != NVRTC_SUCCESS || !lowered)
    return absl::InvalidArgumentError(absl::StrCat("cuda-c program has no kernel named ", entry));
  out.lowered_entry = lowered;
  size_t size = 0;
  if (output == NvrtcOutput::kCubin) {
    nvrtcGetCUBINSize_(prog, &size);
    out.image.resize(size);
    nvrtcGetCUBIN_(prog, out.image.data());
    return out;
  }
  nvrtcGetPTXSize_(prog, &size);
  out.image.resize(size);
  nvrtcGetPTX_(prog, out.image.data());
  if (!out.image.empty() && out.image.back() == '\0') out.image.pop_back();
  return out;
}

}  // namespace replayd

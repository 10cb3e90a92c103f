#include "drivers/cuda/nvrtc.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "drivers/client_text.h"
#include "drivers/compile_options.h"

namespace replayd {

// The library stays loaded for the life of the process: its static C++ runtime keeps
// process-wide state (an emergency exception pool) that unloading would strand.
Nvrtc::~Nvrtc() = default;

std::vector<std::string> Nvrtc::Candidates(const std::vector<std::filesystem::path>& cuda_roots) {
  const std::vector<std::string> sonames = {"libnvrtc.so.13", "libnvrtc.so.12"};
  std::vector<std::string> names = sonames;  // the loader's path first: LD_LIBRARY_PATH, ld.so.cache
  std::vector<std::filesystem::path> roots;
  for (const std::filesystem::path& root : cuda_roots) {
    roots.push_back(root);
    // Versioned installs beside it (/usr/local/cuda-13.0), newest first.
    std::vector<std::filesystem::path> versioned;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(root.parent_path(), ec))
      if (absl::StartsWith(entry.path().filename().string(), root.filename().string() + "-"))
        versioned.push_back(entry.path());
    std::sort(versioned.rbegin(), versioned.rend());
    roots.insert(roots.end(), versioned.begin(), versioned.end());
  }
  for (const std::filesystem::path& root : roots)
    for (const char* dir : {"lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib", "lib"})
      for (const std::string& soname : sonames) {
        std::string path = (root / dir / soname).string();
        if (std::find(names.begin(), names.end(), path) == names.end()) names.push_back(path);
      }
  return names;
}

std::vector<std::filesystem::path> Nvrtc::DefaultCudaRoots() {
  std::vector<std::filesystem::path> roots;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* v = std::getenv(var); v && *v) roots.push_back(std::filesystem::path(v).lexically_normal());
  roots.push_back("/usr/local/cuda");
  return roots;
}

absl::StatusOr<std::unique_ptr<Nvrtc>> Nvrtc::Load(const std::vector<std::string>& candidates) {
  std::unique_ptr<Nvrtc> n(new Nvrtc());
  std::string why;
  for (const std::string& name : candidates) {
    n->handle_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (n->handle_) {
      n->path_ = name;
      break;
    }
    // Only a library that exists but does not load says more than "not found".
    const char* e = dlerror();
    if (name.find('/') == std::string::npos || std::filesystem::exists(name))
      absl::StrAppend(&why, why.empty() ? "" : "; ", e ? e : name);
  }
  if (!n->handle_)
    return absl::UnavailableError(absl::StrCat("NVRTC not loaded (tried ", candidates.size(),
                                               " names and paths, libnvrtc.so.13 and .12 on the loader's path and "
                                               "under the CUDA installs): ",
                                               why));
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
  return CheckCompileOptions(options, {"--use_fast_math", "--fmad=false", "--fmad=true", "-lineinfo", "--std=c++17", "--std=c++20"}, "cuda-c");
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
        absl::StrCat("cuda-c compile of ", Echo(entry), " failed (", nvrtcGetErrorString_(compiled), "):\n",
                     EchoLog(out.log)));
  const char* lowered = nullptr;
  if (nvrtcGetLoweredName_(prog, entry.c_str(), &lowered) != NVRTC_SUCCESS || !lowered)
    return absl::InvalidArgumentError(absl::StrCat("cuda-c program has no kernel named ", Echo(entry)));
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

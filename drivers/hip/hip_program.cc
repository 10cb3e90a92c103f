#include "drivers/hip/hip_program.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "drivers/client_text.h"
#include "drivers/compile_options.h"
#include "drivers/elf_image.h"

namespace replayd {
namespace {

// Comgr names the source after its scratch directory ("/tmp/comgr-1a2b3c/input/
// CompileSource:2:10"); diagnostics name it program.hip, as the client knows it.
std::string NameTheSource(std::string log) {
  const std::string kSource = "CompileSource";
  for (size_t at = log.find(kSource); at != std::string::npos; at = log.find(kSource, at)) {
    size_t begin = log.find_last_of(" \n", at);
    begin = begin == std::string::npos ? 0 : begin + 1;
    log.replace(begin, at + kSource.size() - begin, "program.hip");
    at = begin + 1;
  }
  return log;
}

absl::StatusOr<ModuleArtifact> CompileHipC(const ProgramSource& source, const HipLibrary& hip,
                                           const std::string& arch) {
  if (absl::Status s = CheckCompileOptions(source.options, {"-ffast-math", "-ffp-contract=off", "-ffp-contract=fast", "--std=c++17", "--std=c++20"}, "hip-c");
      !s.ok())
    return s;
  for (char c : arch)
    if (!absl::ascii_isalnum(c) && c != ':' && c != '+' && c != '-' && c != '_')
      return absl::InvalidArgumentError(absl::StrCat("target \"", arch, "\" is not a gfx target"));
  hiprtcProgram prog;
  if (hiprtcResult r = hip.hiprtcCreateProgram(&prog, source.code.c_str(), "program.hip", 0, nullptr, nullptr);
      r != HIPRTC_SUCCESS)
    return absl::InternalError(absl::StrCat("hiprtcCreateProgram: ", hip.hiprtcGetErrorString(r)));
  struct Destroy {
    const HipLibrary& hip;
    hiprtcProgram* p;
    ~Destroy() { hip.hiprtcDestroyProgram(p); }
  } destroy{hip, &prog};
  hip.hiprtcAddNameExpression(prog, source.entry.c_str());
  std::vector<std::string> args = {absl::StrCat("--offload-arch=", arch)};
  args.insert(args.end(), source.options.begin(), source.options.end());
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  hiprtcResult compiled = hip.hiprtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  std::string log;
  size_t log_size = 0;
  hip.hiprtcGetProgramLogSize(prog, &log_size);
  if (log_size > 1) {
    log.resize(log_size);
    hip.hiprtcGetProgramLog(prog, log.data());
    log.resize(log.find('\0') == std::string::npos ? log.size() : log.find('\0'));
  }
  if (compiled != HIPRTC_SUCCESS)
    return absl::InvalidArgumentError(absl::StrCat("hip-c compile of ", source.entry, " failed (",
                                                   hip.hiprtcGetErrorString(compiled), "):\n", EchoLog(NameTheSource(log))));
  const char* lowered = nullptr;
  if (hip.hiprtcGetLoweredName(prog, source.entry.c_str(), &lowered) != HIPRTC_SUCCESS || !lowered)
    return absl::InvalidArgumentError(absl::StrCat("hip-c program has no kernel named ", source.entry));
  ModuleArtifact artifact;
  artifact.entry = lowered;
  size_t size = 0;
  hip.hiprtcGetCodeSize(prog, &size);
  artifact.image.resize(size);
  if (size == 0 || hip.hiprtcGetCode(prog, artifact.image.data()) != HIPRTC_SUCCESS)
    return absl::InternalError(absl::StrCat("hiprtc produced no code object for ", source.entry));
  return artifact;
}

}  // namespace

absl::StatusOr<ModuleArtifact> BuildHipModule(const ProgramSource& source, const HipLibrary& hip,
                                              const std::string& arch) {
  if (source.format == "hip-c") {
    if (!hip.has_hiprtc()) return absl::FailedPreconditionError(absl::StrCat("hip-c needs ", hip.hiprtc_missing()));
    return CompileHipC(source, hip, arch);
  }
  if (source.format != "hip-hsaco")
    return absl::InvalidArgumentError(absl::StrCat("format \"", source.format, "\" is not a HIP format"));
  if (!source.options.empty()) return absl::InvalidArgumentError("hip-hsaco programs take no options");
  if (absl::Status s = CheckElfImage(source.code, kElfMachineAmdgpu, "hip-hsaco"); !s.ok()) return s;
  return ModuleArtifact{source.entry, source.code};
}

}  // namespace replayd

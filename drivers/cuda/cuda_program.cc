#include "drivers/cuda/cuda_program.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "drivers/elf_image.h"

namespace replayd {

absl::StatusOr<ModuleArtifact> BuildCudaModule(const ProgramSource& source, const Nvrtc* nvrtc,
                                               const std::string& arch) {
  if (source.format == "cuda-c") {
    if (!nvrtc) return absl::FailedPreconditionError("cuda-c needs NVRTC, which this daemon could not load");
    // Machine code for the device's own architecture: nothing to JIT at load, and a cubin
    // loads on any driver of the toolkit's major version, where PTX needs the newer JIT.
    absl::StatusOr<NvrtcModule> module =
        nvrtc->Compile(source.code, source.entry, arch, source.options, NvrtcOutput::kCubin);
    if (!module.ok()) return module.status();
    return ModuleArtifact{module->lowered_entry, std::move(module->image)};
  }
  if (source.format != "cuda-ptx" && source.format != "cuda-cubin")
    return absl::InvalidArgumentError(absl::StrCat("format \"", source.format, "\" is not a CUDA format"));
  if (!source.options.empty())
    return absl::InvalidArgumentError(absl::StrCat(source.format, " programs take no options"));
  if (source.format == "cuda-ptx" && !absl::StrContains(source.code, ".version"))
    return absl::InvalidArgumentError("cuda-ptx code is not PTX: it has no .version directive");
  if (source.format == "cuda-ptx" && absl::StrContains(source.code, std::string(1, '\0')))
    return absl::InvalidArgumentError("cuda-ptx code contains a NUL byte");
  if (source.format == "cuda-cubin")
    if (absl::Status s = CheckElfImage(source.code, kElfMachineCuda, "cuda-cubin"); !s.ok()) return s;
  return ModuleArtifact{source.entry, source.code};
}

}  // namespace replayd

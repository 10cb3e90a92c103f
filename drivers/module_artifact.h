// The artifact a GPU device's Compile writes and its Context::Load reads back: a module
// image for the vendor loader (PTX text or a cubin for CUDA, a code object for HIP) and
// the name of the kernel's entry in that image, which differs from the program's entry
// when a C++ compiler mangled it.
#ifndef REPLAYD_DRIVERS_MODULE_ARTIFACT_H_
#define REPLAYD_DRIVERS_MODULE_ARTIFACT_H_

#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace replayd {

struct ModuleArtifact {
  std::string entry;  // the symbol to look up in the image
  std::string image;  // bytes for cuModuleLoadDataEx / hipModuleLoadData
};

// Writes `artifact` at `path`. INTERNAL when the file cannot be written.
absl::Status WriteModuleArtifact(const ModuleArtifact& artifact, const std::filesystem::path& path);

// Reads back what WriteModuleArtifact wrote. DATA_LOSS for a file that is not such an
// artifact (damaged or foreign), so the compile cache builds it anew.
absl::StatusOr<ModuleArtifact> ReadModuleArtifact(const std::filesystem::path& path);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_MODULE_ARTIFACT_H_

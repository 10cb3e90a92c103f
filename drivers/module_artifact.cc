#include "drivers/module_artifact.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace replayd {
namespace {

// "replayd-module 1\n<entry>\n<image>": a header line, so that a foreign file is refused.
constexpr absl::string_view kMagic = "replayd-module 1\n";

}  // namespace

absl::Status WriteModuleArtifact(const ModuleArtifact& artifact, const std::filesystem::path& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << kMagic << artifact.entry << '\n';
  out.write(artifact.image.data(), static_cast<std::streamsize>(artifact.image.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

absl::StatusOr<ModuleArtifact> ReadModuleArtifact(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  std::string bytes = text.str();
  size_t entry_end = bytes.find('\n', kMagic.size());
  if (!absl::StartsWith(bytes, kMagic) || entry_end == std::string::npos || entry_end == kMagic.size())
    return absl::DataLossError(absl::StrCat(path.string(), " is not a module artifact"));
  ModuleArtifact artifact;
  artifact.entry = bytes.substr(kMagic.size(), entry_end - kMagic.size());
  artifact.image = bytes.substr(entry_end + 1);
  return artifact;
}

}  // namespace replayd

#include "engine/program.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "drivers/client_text.h"
#include "drivers/compile_options.h"

namespace replayd {
namespace {

absl::Status CheckSignature(const Signature& signature, const ProgramSource& source, const DeviceInfo& device) {
  if (signature.params.size() > device.limits.max_args) {
    return absl::InvalidArgumentError(absl::StrCat("signature has ", signature.params.size(), " params; ", device.id,
                                                   " allows at most ", device.limits.max_args));
  }
  for (size_t i = 0; i < signature.params.size(); ++i) {
    const Param& p = signature.params[i];
    std::string what =
        absl::StrCat("signature param ", i, p.name.empty() ? "" : " (", Echo(p.name), p.name.empty() ? "" : ")");
    if (p.name.size() > kMaxParamNameLength)
      return absl::InvalidArgumentError(absl::StrCat(what, ": name longer than ", kMaxParamNameLength, " bytes"));
    bool is_buffer = p.kind == ParamKind::kBuffer;
    if (is_buffer && p.access == Access::kNone)
      return absl::InvalidArgumentError(absl::StrCat(what, ": a buffer needs an access mode (in, out, inout)"));
    if (!is_buffer && p.access != Access::kNone)
      return absl::InvalidArgumentError(absl::StrCat(what, ": an integer takes no access mode"));
  }
  if (signature.core_id && source.format != "cpu-c")
    return absl::InvalidArgumentError("core_id is only for cpu-c programs");
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckProgramSource(const ProgramSource& source, const DeviceInfo& device) {
  if (std::find(device.formats.begin(), device.formats.end(), source.format) == device.formats.end()) {
    return absl::InvalidArgumentError(absl::StrCat("format \"", Echo(source.format), "\" is not accepted by ", device.id,
                                                   " (accepted: ", absl::StrJoin(device.formats, ", "), ")"));
  }
  if (source.code.empty()) return absl::InvalidArgumentError("program code is empty");
  if (source.code.size() > kMaxCodeBytes)
    return absl::InvalidArgumentError(
        absl::StrCat("program code of ", source.code.size(), " bytes exceeds ", kMaxCodeBytes));
  if (source.entry.size() > kMaxEntryLength || !IsIdentifier(source.entry))
    return absl::InvalidArgumentError(absl::StrCat("entry \"", Echo(source.entry), "\" is not an identifier"));
  if (source.options.size() > kMaxOptions)
    return absl::InvalidArgumentError(absl::StrCat(source.options.size(), " options exceed ", kMaxOptions));
  return CheckSignature(source.signature, source, device);
}

}  // namespace replayd

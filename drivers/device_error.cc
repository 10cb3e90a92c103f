#include "drivers/device_error.h"

#include "absl/strings/str_cat.h"

namespace replayd {

absl::Status DeviceError(DeviceErrorKind kind, absl::string_view device, absl::string_view what,
                         absl::string_view text) {
  const std::string message = absl::StrCat(device, ": ", what, ": ", text);
  switch (kind) {
    case DeviceErrorKind::kFault:
      return absl::FailedPreconditionError(message);
    case DeviceErrorKind::kOutOfMemory:
      return absl::ResourceExhaustedError(message);
    case DeviceErrorKind::kBadRequest:
      return absl::InvalidArgumentError(message);
    case DeviceErrorKind::kOther:
      break;
  }
  return absl::InternalError(message);
}

}  // namespace replayd

#include "drivers/driver.h"

namespace replayd {

absl::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
    case DeviceKind::kHip:
      return "hip";
  }
  return "unknown";
}

absl::string_view IsolationName(Isolation isolation) {
  return isolation == Isolation::kShared ? "shared" : "process";
}

}  // namespace replayd

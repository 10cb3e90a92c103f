#include "drivers/shared_fault.h"

#include "absl/strings/str_cat.h"

namespace replayd {

absl::Status SharedFault::Join() {
  absl::MutexLock lock(&mu_);
  if (!fault_.ok())
    return absl::UnavailableError(absl::StrCat(
        fault_.message(), "; the device serves new sessions again once every session open on it has closed"));
  ++sessions_;
  return absl::OkStatus();
}

void SharedFault::Leave(const std::function<void()>& reset) {
  absl::MutexLock lock(&mu_);
  if (sessions_ > 0) --sessions_;
  if (sessions_ > 0 || fault_.ok()) return;
  reset();
  fault_ = absl::OkStatus();
}

absl::Status SharedFault::Fail(absl::Status fault) {
  absl::MutexLock lock(&mu_);
  if (fault_.ok()) fault_ = std::move(fault);
  return fault_;
}

absl::Status SharedFault::fault() const {
  absl::MutexLock lock(&mu_);
  return fault_;
}

int SharedFault::sessions() const {
  absl::MutexLock lock(&mu_);
  return sessions_;
}

}  // namespace replayd

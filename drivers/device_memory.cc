#include "drivers/device_memory.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace replayd {

absl::Status DeviceMemory::ReserveWithoutReclaim(absl::string_view device, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("allocation of 0 bytes");
  uint64_t used = in_use_.load();
  do {
    if (bytes > total_ || used > total_ - bytes)
      return absl::ResourceExhaustedError(absl::StrCat(device, ": allocation of ", bytes,
                                                       " bytes exceeds free memory (", total_ - used, " of ", total_,
                                                       " bytes free)"));
  } while (!in_use_.compare_exchange_weak(used, used + bytes));
  return absl::OkStatus();
}

absl::Status DeviceMemory::Reserve(absl::string_view device, uint64_t bytes) {
  absl::Status s = ReserveWithoutReclaim(device, bytes);
  if (s.code() != absl::StatusCode::kResourceExhausted || bytes > total_) return s;
  {
    // Held while the reclaimer runs, so that its owner cannot clear it and go meanwhile.
    absl::ReaderMutexLock lock(&reclaimer_mu_);
    if (!reclaimer_) return s;
    const uint64_t available = free();  // others may have freed or taken some since
    if (available < bytes && !reclaimer_(bytes - available)) return s;
  }
  return ReserveWithoutReclaim(device, bytes);
}

void DeviceMemory::set_reclaimer(Reclaimer reclaimer) {
  absl::MutexLock lock(&reclaimer_mu_);
  reclaimer_ = std::move(reclaimer);
}

}  // namespace replayd

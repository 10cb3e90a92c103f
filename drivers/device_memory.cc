#include "drivers/device_memory.h"

#include "absl/strings/str_cat.h"

namespace replayd {

absl::Status DeviceMemory::Reserve(absl::string_view device, uint64_t bytes) {
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

}  // namespace replayd

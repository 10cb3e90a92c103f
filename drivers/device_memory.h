// The memory of one device as the daemon accounts it: a fixed total, and the bytes that
// the device's contexts hold. Every driver reserves here before it allocates, so a
// device reports the same figure whatever its vendor's allocator does.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_DRIVERS_DEVICE_MEMORY_H_
#define REPLAYD_DRIVERS_DEVICE_MEMORY_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace replayd {

class DeviceMemory {
 public:
  explicit DeviceMemory(uint64_t total) : total_(total) {}

  uint64_t total() const { return total_; }
  uint64_t in_use() const { return in_use_.load(); }

  // Reserves `bytes` (> 0). RESOURCE_EXHAUSTED naming `device`, the request and what is
  // free when it does not fit; nothing is reserved then.
  absl::Status Reserve(absl::string_view device, uint64_t bytes);
  void Release(uint64_t bytes) { in_use_.fetch_sub(bytes); }

 private:
  const uint64_t total_;
  std::atomic<uint64_t> in_use_{0};
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_DEVICE_MEMORY_H_

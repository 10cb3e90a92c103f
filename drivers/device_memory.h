// The memory of one device as the daemon accounts it: a fixed total, and the bytes that
// the device's contexts hold. Every driver reserves here before it allocates, so a
// device reports the same figure whatever its vendor's allocator does.
//
// Memory held by something that can give it up (an idle executor, lingering for its
// tenant's next session) is given back when a reservation would not fit otherwise: the
// holder registers a reclaimer, which Reserve asks before it refuses.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_DRIVERS_DEVICE_MEMORY_H_
#define REPLAYD_DRIVERS_DEVICE_MEMORY_H_

#include <atomic>
#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace replayd {

class DeviceMemory {
 public:
  // Asked for `wanted` bytes that a reservation lacks: gives back what it can spare,
  // and returns true when that is at least `wanted` (false, giving nothing back, when
  // it could not make the room).
  using Reclaimer = std::function<bool(uint64_t wanted)>;

  explicit DeviceMemory(uint64_t total) : total_(total) {}

  uint64_t total() const { return total_; }
  uint64_t in_use() const { return in_use_.load(); }
  uint64_t free() const { return total_ - in_use_.load(); }

  // Reserves `bytes` (> 0). Where they do not fit, asks the reclaimer for what is
  // missing and tries once more. RESOURCE_EXHAUSTED naming `device`, the request and
  // what is free when they still do not fit; nothing is reserved then. The caller holds
  // no lock the reclaimer takes.
  absl::Status Reserve(absl::string_view device, uint64_t bytes);
  // Reserve without asking the reclaimer: for callers that hold its locks.
  absl::Status ReserveWithoutReclaim(absl::string_view device, uint64_t bytes);
  void Release(uint64_t bytes) { in_use_.fetch_sub(bytes); }

  // Sets the reclaimer (null: none), once no call of the one before is running. Its
  // owner sets null before it goes.
  void set_reclaimer(Reclaimer reclaimer);

 private:
  const uint64_t total_;
  std::atomic<uint64_t> in_use_{0};
  absl::Mutex reclaimer_mu_;
  Reclaimer reclaimer_ ABSL_GUARDED_BY(reclaimer_mu_);
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_DEVICE_MEMORY_H_

// The live allocations of a device, by address: what a driver checks a copy node against
// before it builds or retargets one, as CUDA checks a memcpy node (an address the device
// does not know is refused, never copied to).
//
// Thread safety: thread-safe.
#ifndef REPLAYD_DRIVERS_LIVE_ALLOCATIONS_H_
#define REPLAYD_DRIVERS_LIVE_ALLOCATIONS_H_

#include <cstdint>
#include <map>

#include "absl/synchronization/mutex.h"

namespace replayd {

class LiveAllocations {
 public:
  void Add(uint64_t address, uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    live_[address] = bytes;
  }
  // The bytes of the allocation at `address`, which is then no longer live; 0 if none was.
  uint64_t Remove(uint64_t address) {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(address);
    if (it == live_.end()) return 0;
    const uint64_t bytes = it->second;
    live_.erase(it);
    return bytes;
  }
  // True when [address, address + bytes) lies inside one live allocation.
  bool Holds(uint64_t address, uint64_t bytes) const {
    absl::MutexLock lock(&mu_);
    auto it = live_.upper_bound(address);
    if (it == live_.begin()) return false;
    --it;
    const uint64_t offset = address - it->first;
    return offset < it->second && bytes <= it->second - offset;
  }
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return live_.size();
  }

 private:
  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> live_ ABSL_GUARDED_BY(mu_);  // address -> bytes
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_LIVE_ALLOCATIONS_H_

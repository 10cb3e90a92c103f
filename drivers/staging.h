// Host <-> device copies through two pinned staging buffers used in turn, for GPU drivers:
// while one chunk is on its way to (or from) the device, the next is filled (or the last
// taken out) on the host. The vendor calls come in as functions, so the CUDA and HIP
// contexts share the schedule. Memory the context pinned itself (Context::PinHost) needs
// no staging: PinnedRanges says which.
#ifndef REPLAYD_DRIVERS_STAGING_H_
#define REPLAYD_DRIVERS_STAGING_H_

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace replayd {

struct Staging {
  std::array<void*, 2> buffers = {nullptr, nullptr};  // pinned, `chunk` bytes each
  uint64_t chunk = 0;
  // Waits until the last copy that used buffer i has completed.
  std::function<absl::Status(int i)> wait;
  // Queues the copy of `n` bytes between buffer i and the device at `offset` (from the
  // start of the transfer), and marks buffer i in use until it completes.
  std::function<absl::Status(int i, uint64_t offset, uint64_t n)> copy;
};

// The host ranges a context registered with its driver (Context::PinHost), from which or
// into which a transfer copies straight. Not thread-safe: the context's staging lock
// guards it.
class PinnedRanges {
 public:
  void Add(std::span<uint8_t> range) { ranges_.push_back(range); }
  // True when [host, host + bytes) lies inside one range.
  bool Hold(const void* host, uint64_t bytes) const;
  const std::vector<std::span<uint8_t>>& ranges() const { return ranges_; }

 private:
  std::vector<std::span<uint8_t>> ranges_;
};

// Sends `bytes`: chunk k is copied into buffer k % 2 once its previous copy is done, then
// queued. Returns once `bytes` may be reused; the copies complete in stream order.
absl::Status StagedWrite(const Staging& staging, std::span<const uint8_t> bytes);

// Fetches `bytes`: the copy of chunk k + 1 is queued before chunk k is taken out.
absl::Status StagedRead(const Staging& staging, std::span<uint8_t> bytes);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_STAGING_H_

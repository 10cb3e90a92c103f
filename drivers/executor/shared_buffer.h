// A buffer the daemon shares with an executor: a memfd of the daemon's own, sealed against
// shrinking and growing before the executor sees it, and mapped here; the executor maps
// the same memfd as an allocation of its context (Context::AllocateShared). Transfers then
// copy straight between the daemon's requests and the buffer, with no trip through the
// channel. The seals are why the daemon may touch it: the file cannot shrink, so whatever
// the executor does with its own mapping, no access through this one faults (SIGBUS); at
// worst the tenant's own bytes read back as zeros.
//
// Each buffer is one mapping of the daemon's, and a process may hold some 65,000: a
// SharedBufferBudget caps how many a device's contexts hold, and past it a buffer is the
// executor's own, its transfers through the channel as before.
//
// Thread safety: SharedBufferBudget is thread-safe; a SharedBuffer is not.
#ifndef REPLAYD_DRIVERS_EXECUTOR_SHARED_BUFFER_H_
#define REPLAYD_DRIVERS_EXECUTOR_SHARED_BUFFER_H_

#include <atomic>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"

namespace replayd::executor {

class SharedBufferBudget {
 public:
  explicit SharedBufferBudget(int64_t buffers) : left_(buffers) {}
  // One buffer more, if the budget has one left.
  bool Take() {
    if (left_.fetch_sub(1, std::memory_order_relaxed) > 0) return true;
    left_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  void Give() { left_.fetch_add(1, std::memory_order_relaxed); }
  int64_t left() const { return left_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> left_;
};

class SharedBuffer {
 public:
  // A zeroed buffer of `bytes` (> 0), taken from `budget`. UNAVAILABLE when the budget has
  // none left, INTERNAL when the memfd or its mapping cannot be made (nothing is held then).
  static absl::StatusOr<SharedBuffer> Create(uint64_t bytes, SharedBufferBudget& budget);
  SharedBuffer(SharedBuffer&& other) noexcept;
  SharedBuffer& operator=(SharedBuffer&&) = delete;
  // Unmaps the buffer and gives its place in the budget back.
  ~SharedBuffer();

  // The memfd, to pass to the executor; -1 once closed.
  int fd() const { return fd_; }
  // Closes the memfd (the mappings keep the memory).
  void CloseFd();
  std::span<uint8_t> bytes() { return {data_, bytes_}; }

 private:
  SharedBuffer(int fd, uint8_t* data, uint64_t bytes, SharedBufferBudget* budget)
      : fd_(fd), data_(data), bytes_(bytes), budget_(budget) {}

  int fd_ = -1;
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  SharedBufferBudget* budget_ = nullptr;
};

}  // namespace replayd::executor

#endif  // REPLAYD_DRIVERS_EXECUTOR_SHARED_BUFFER_H_

// The shared-memory channel between the daemon and one executor process: a memfd mapped
// in both, holding one request and one reply at a time (a message area for the encoded
// command and a data area for bulk bytes), with futex wake-ups on two sequence counters.
// The daemon side serialises its calls, so a request is never overwritten before its
// reply has been read.
//
// A waiter spins briefly before it sleeps, where its process may use more than one core:
// a reply that comes within the spin costs no wake-up (a futex wake across the two cores
// of a small VM costs tens of microseconds).
// Neither side trusts the other's lengths: every length is checked against its area.
//
// Thread safety: one thread at a time per side.
#ifndef REPLAYD_DRIVERS_EXECUTOR_CHANNEL_H_
#define REPLAYD_DRIVERS_EXECUTOR_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace replayd::executor {

class Channel {
 public:
  static constexpr uint64_t kMessageBytes = 1 << 20;  // one encoded request or reply
  static constexpr uint64_t kDataBytes = 4 << 20;     // bulk bytes of one Write or Read

  // A new channel in a fresh memfd (close-on-exec; the spawner passes it on).
  static absl::StatusOr<Channel> Create();
  // The channel in memfd `fd`, made by Create in the other process. Takes `fd`.
  static absl::StatusOr<Channel> Attach(int fd);

  Channel(Channel&& other) noexcept;
  Channel& operator=(Channel&&) = delete;
  ~Channel();

  int fd() const { return fd_; }

  // Daemon side. Post publishes the request of `bytes` message bytes already written at
  // request(); AwaitReply waits for its reply until `deadline`, returning its message
  // length, or DEADLINE_EXCEEDED. `stop` is asked at every sleep's end (about every 20 ms):
  // when it returns true the wait ends with UNAVAILABLE.
  void PostRequest(uint64_t bytes);
  template <typename Stop>
  absl::StatusOr<uint64_t> AwaitReply(absl::Time deadline, Stop stop);

  // Executor side. AwaitRequest waits for the next request (asking `stop` about once a
  // second, to notice a daemon gone) and returns its message length; PostReply publishes a
  // reply of `bytes` message bytes written at reply().
  template <typename Stop>
  absl::StatusOr<uint64_t> AwaitRequest(Stop stop);
  void PostReply(uint64_t bytes);

  std::span<uint8_t> request() { return {base_ + kHeaderBytes, kMessageBytes}; }
  std::span<uint8_t> reply() { return {base_ + kHeaderBytes + kMessageBytes, kMessageBytes}; }
  std::span<uint8_t> data() { return {base_ + kHeaderBytes + 2 * kMessageBytes, kDataBytes}; }

 private:
  static constexpr uint64_t kHeaderBytes = 4096;
  static constexpr uint64_t kTotalBytes = kHeaderBytes + 2 * kMessageBytes + kDataBytes;
  struct Header {
    alignas(64) std::atomic<uint32_t> request_seq;
    alignas(64) std::atomic<uint32_t> reply_seq;
    std::atomic<uint64_t> request_bytes;
    std::atomic<uint64_t> reply_bytes;
  };
  Channel(int fd, uint8_t* base);
  Header& header() { return *reinterpret_cast<Header*>(base_); }
  // Waits until `word` differs from `seen`, spinning first; false once `timeout` passed.
  static bool WaitChange(std::atomic<uint32_t>& word, uint32_t seen, absl::Duration timeout, int spins);
  static void Wake(std::atomic<uint32_t>& word);
  absl::StatusOr<uint64_t> MessageLength(uint64_t bytes) const;

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  int spins_ = 0;  // before each sleep; none where this process has one core
  // Executor side: the request seq last taken. A channel is fresh when attached, so the
  // first request may already be posted by then.
  uint32_t last_request_ = 0;
};

template <typename Stop>
absl::StatusOr<uint64_t> Channel::AwaitReply(absl::Time deadline, Stop stop) {
  const uint32_t want = header().request_seq.load(std::memory_order_relaxed);
  while (header().reply_seq.load(std::memory_order_acquire) != want) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("no reply before the deadline");
    if (WaitChange(header().reply_seq, want - 1, std::min(left, absl::Milliseconds(20)), spins_)) continue;
    if (stop()) return absl::UnavailableError("the executor is gone");
  }
  return MessageLength(header().reply_bytes.load(std::memory_order_relaxed));
}

template <typename Stop>
absl::StatusOr<uint64_t> Channel::AwaitRequest(Stop stop) {
  while (header().request_seq.load(std::memory_order_acquire) == last_request_) {
    if (WaitChange(header().request_seq, last_request_, absl::Seconds(1), spins_)) continue;
    if (stop()) return absl::UnavailableError("the daemon is gone");
  }
  last_request_ = header().request_seq.load(std::memory_order_acquire);
  return MessageLength(header().request_bytes.load(std::memory_order_relaxed));
}

// Passes descriptor `fd` over the unix socket `socket` (SCM_RIGHTS); the receiver gets a
// descriptor of its own for the same file.
absl::Status SendFd(int socket, int fd);
absl::StatusOr<int> ReceiveFd(int socket);

}  // namespace replayd::executor

#endif  // REPLAYD_DRIVERS_EXECUTOR_CHANNEL_H_

// The shared-memory channel between the daemon and one executor process: a memfd mapped
// in both, holding up to kSlots requests in flight and their replies (a message area per
// slot for the encoded command and its reply, and one data area for bulk bytes), with
// futex wake-ups on two sequence counters. Requests are numbered 1, 2, ... and answered
// in order; request n and its reply use slot n % kSlots. So the daemon can post commands
// behind one still running (replays without wait, a read behind them) and the executor
// takes them without another wake-up. The daemon posts at most kSlots requests past the
// last reply it has read.
//
// A request longer than its slot's area (a device graph of many nodes) travels in the
// data area instead, which its length says: a request of more than kSlotBytes is there.
// The data area also carries the bytes of a Write (from the daemon) and of a Read (from
// the executor), so the daemon writes into it only while no command posted and not yet
// answered uses it. A reply always fits its slot.
//
// A waiter spins briefly before it sleeps, where its process may use more than one core:
// a reply that comes within the spin costs no wake-up (a futex wake across the two cores
// of a small VM costs tens of microseconds). A sleeper says which number it sleeps for,
// and a poster wakes it only once that number has come: the executor busy with a launch
// is not woken for the read posted behind it, nor the daemon for a launch's reply when
// it sleeps for the read's. The poster that wakes it clears that number, so what is
// posted before the sleeper has run makes no wake-up call of its own.
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
  static constexpr uint32_t kSlots = 32;               // requests in flight at most
  static constexpr uint64_t kSlotBytes = 64 << 10;     // a slot's request or reply area
  static constexpr uint64_t kDataBytes = 4 << 20;      // bulk bytes of one Write or Read
  static constexpr uint64_t kMessageBytes = kDataBytes;  // the longest request
  // The size of a channel's memfd: a header, the slots' areas and the data area.
  static constexpr uint64_t kTotalBytes = 4096 + 2 * kSlots * kSlotBytes + kDataBytes;

  // What the two ends must agree on: this layout and the protocol of the messages
  // (executor.proto). Raised with every change to either, so that a daemon and an
  // executor of different builds (one binary replaced beside the other) refuse each other
  // rather than misread.
  static constexpr uint32_t kProtocol = 2;

  // A new channel in a fresh memfd (close-on-exec; the spawner passes it on), marked
  // with the layout and protocol of this build.
  static absl::StatusOr<Channel> Create();
  // Makes this channel as Create left it, for another context: nothing posted, nobody
  // waiting. Daemon side, once the executor's end has stopped using it (its context's
  // close answered).
  void Reset();
  // The channel in memfd `fd`, made by Create in the other process. Takes `fd`.
  // FAILED_PRECONDITION when it was made by a build of another layout or protocol.
  static absl::StatusOr<Channel> Attach(int fd);

  Channel(Channel&& other) noexcept;
  Channel& operator=(Channel&&) = delete;
  ~Channel();

  int fd() const { return fd_; }

  // Daemon side. PostRequest publishes the request of `bytes` message bytes already
  // written at request_area(bytes) and returns its number; AwaitReply waits for the reply to
  // request `seq` until `deadline`, returning its message length (the message is at
  // reply_of(seq) until request seq + kSlots is posted), or DEADLINE_EXCEEDED. `stop` is
  // asked at every sleep's end (about every 20 ms): when it returns true the wait ends
  // with UNAVAILABLE.
  // Where the next request of `bytes` bytes goes: its slot's area, or the data area for
  // one longer than kSlotBytes (up to kMessageBytes).
  std::span<uint8_t> request_area(uint64_t bytes) {
    return bytes > kSlotBytes ? data() : Slot(posted_ + 1, 0);
  }
  uint32_t PostRequest(uint64_t bytes);
  template <typename Stop>
  absl::StatusOr<uint64_t> AwaitReply(uint32_t seq, absl::Time deadline, Stop stop);
  std::span<uint8_t> reply_of(uint32_t seq) { return Slot(seq, 1); }

  // Executor side. AwaitRequest waits for the next request in order (asking `stop` about
  // once a second, to notice a daemon gone) and returns its message length, at
  // request(length); PostReply publishes its reply of `bytes` message bytes (at most
  // kSlotBytes) written at reply().
  template <typename Stop>
  absl::StatusOr<uint64_t> AwaitRequest(Stop stop);
  std::span<uint8_t> request(uint64_t bytes) { return bytes > kSlotBytes ? data() : Slot(taken_, 0); }
  std::span<uint8_t> reply() { return Slot(taken_, 1); }
  void PostReply(uint64_t bytes);

  std::span<uint8_t> data() { return {base_ + kHeaderBytes + 2 * kSlots * kSlotBytes, kDataBytes}; }

  // The wake-up system calls this end has made, posting.
  uint64_t wake_calls() const { return wake_calls_; }

 private:
  static constexpr uint64_t kHeaderBytes = 4096;
  static_assert(kTotalBytes == kHeaderBytes + 2 * kSlots * kSlotBytes + kDataBytes);
  struct Header {
    uint64_t version;  // Version(): the creator's layout and protocol
    alignas(64) std::atomic<uint32_t> request_seq;  // the last request posted
    // The request the executor sleeps for, kSleeping | seq; 0 while it does not sleep.
    std::atomic<uint64_t> request_wanted;
    alignas(64) std::atomic<uint32_t> reply_seq;    // the last request answered
    std::atomic<uint64_t> reply_wanted;              // the reply the daemon sleeps for, the same way
    std::atomic<uint64_t> request_bytes[kSlots];
    std::atomic<uint64_t> reply_bytes[kSlots];
  };
  static constexpr uint64_t kSleeping = uint64_t{1} << 32;
  // The protocol, the slots and the size, in one word.
  static constexpr uint64_t Version() { return uint64_t{kProtocol} << 48 | uint64_t{kSlots} << 40 | kTotalBytes; }
  Channel(int fd, uint8_t* base);
  // Maps memfd `fd`'s kTotalBytes; null (with errno set, `fd` closed) when it cannot.
  static uint8_t* Map(int fd);
  Header& header() { return *reinterpret_cast<Header*>(base_); }
  // The message area of request `seq` (side 0) or of its reply (side 1).
  std::span<uint8_t> Slot(uint32_t seq, int side) {
    return {base_ + kHeaderBytes + (2 * (seq % kSlots) + side) * kSlotBytes, kSlotBytes};
  }
  // Waits until `word` differs from `seen`, spinning first; false once `timeout` passed.
  // Before it sleeps it stores kSleeping | `want` in `wanted` (and 0 after), which Publish
  // reads.
  static bool WaitChange(std::atomic<uint32_t>& word, uint32_t seen, absl::Duration timeout, int spins,
                         std::atomic<uint64_t>& wanted, uint32_t want);
  // Stores `seq` in `word` and wakes its sleeper if it sleeps for `seq` or an earlier number.
  void Publish(std::atomic<uint32_t>& word, uint32_t seq, std::atomic<uint64_t>& wanted);
  // `bytes` when at most `limit`, else DATA_LOSS.
  static absl::StatusOr<uint64_t> MessageLength(uint64_t bytes, uint64_t limit);

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  int spins_ = 0;  // before each sleep; none where this process has one core
  // Daemon side: the last request posted. Executor side: the last request taken. A
  // channel is fresh when attached, so the first request may already be posted by then.
  uint32_t posted_ = 0;
  uint32_t taken_ = 0;
  uint64_t wake_calls_ = 0;
};

template <typename Stop>
absl::StatusOr<uint64_t> Channel::AwaitReply(uint32_t seq, absl::Time deadline, Stop stop) {
  for (;;) {
    const uint32_t answered = header().reply_seq.load(std::memory_order_acquire);
    if (static_cast<int32_t>(answered - seq) >= 0) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("no reply before the deadline");
    if (WaitChange(header().reply_seq, answered, std::min(left, absl::Milliseconds(20)), spins_,
                   header().reply_wanted, seq))
      continue;
    if (stop()) return absl::UnavailableError("the executor is gone");
  }
  return MessageLength(header().reply_bytes[seq % kSlots].load(std::memory_order_relaxed), kSlotBytes);
}

template <typename Stop>
absl::StatusOr<uint64_t> Channel::AwaitRequest(Stop stop) {
  while (header().request_seq.load(std::memory_order_acquire) == taken_) {
    if (WaitChange(header().request_seq, taken_, absl::Seconds(1), spins_, header().request_wanted, taken_ + 1))
      continue;
    if (stop()) return absl::UnavailableError("the daemon is gone");
  }
  ++taken_;
  return MessageLength(header().request_bytes[taken_ % kSlots].load(std::memory_order_relaxed), kMessageBytes);
}

// Passes descriptor `fd` over the unix socket `socket` (SCM_RIGHTS); the receiver gets a
// descriptor of its own for the same file. SendFd fails rather than wait when the socket
// is full (a receiver that takes none).
absl::Status SendFd(int socket, int fd);
absl::StatusOr<int> ReceiveFd(int socket);

}  // namespace replayd::executor

#endif  // REPLAYD_DRIVERS_EXECUTOR_CHANNEL_H_

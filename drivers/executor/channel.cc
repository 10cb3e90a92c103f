#include "drivers/executor/channel.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace replayd::executor {
namespace {

// Iterations of the spin before a waiter sleeps: some tens of microseconds, the time a
// short kernel or a small reply takes. Only where this process may run on more than one
// core: on one core the spin takes the time from the very process it waits for (measured:
// a round trip 4x slower with both pinned to one core, 1.5x faster without it spinning
// where they may run apart; docs/performance.md).
constexpr int kSpins = 4000;

int SpinsHere() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0) return 0;
  return CPU_COUNT(&cpus) > 1 ? kSpins : 0;
}

inline void Relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat("executor channel: ", what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<Channel> Channel::Create() {
  const int fd = static_cast<int>(syscall(SYS_memfd_create, "replayd-executor", MFD_CLOEXEC));
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, kTotalBytes) != 0) {
    absl::Status s = Errno("ftruncate");
    close(fd);
    return s;
  }
  uint8_t* base = Map(fd);
  if (!base) return Errno("mmap");
  reinterpret_cast<Header*>(base)->version = Version();
  return Channel(fd, base);
}

void Channel::Reset() {
  Header& h = header();
  h.request_seq.store(0, std::memory_order_relaxed);
  h.request_wanted.store(0, std::memory_order_relaxed);
  h.reply_seq.store(0, std::memory_order_relaxed);
  h.reply_wanted.store(0, std::memory_order_relaxed);
  for (auto& bytes : h.request_bytes) bytes.store(0, std::memory_order_relaxed);
  for (auto& bytes : h.reply_bytes) bytes.store(0, std::memory_order_relaxed);
  posted_ = 0;
  taken_ = 0;
  wake_calls_ = 0;
}

absl::StatusOr<Channel> Channel::Attach(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status s = Errno("fstat");
    close(fd);
    return s;
  }
  auto another_build = [&](uint64_t version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "executor channel: made by another build of replayd (channel version ", absl::Hex(version), ", ",
        st.st_size, " bytes; this build's is ", absl::Hex(Version()),
        "): replayd and replayd-executor must come from one build"));
  };
  // A channel of another size is another layout: not mapped past its end.
  if (static_cast<uint64_t>(st.st_size) != kTotalBytes) {
    close(fd);
    return another_build(0);
  }
  uint8_t* base = Map(fd);
  if (!base) return Errno("mmap");
  const uint64_t version = reinterpret_cast<const Header*>(base)->version;
  if (version != Version()) {
    munmap(base, kTotalBytes);
    close(fd);
    return another_build(version);
  }
  return Channel(fd, base);
}

uint8_t* Channel::Map(int fd) {
  void* p = mmap(nullptr, kTotalBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) return static_cast<uint8_t*>(p);
  const int saved = errno;
  close(fd);
  errno = saved;
  return nullptr;
}

Channel::Channel(int fd, uint8_t* base) : fd_(fd), base_(base), spins_(SpinsHere()) {
  static_assert(sizeof(Header) <= kHeaderBytes);
}

Channel::Channel(Channel&& other) noexcept
    : fd_(other.fd_), base_(other.base_), spins_(other.spins_), posted_(other.posted_), taken_(other.taken_),
      wake_calls_(other.wake_calls_) {
  other.fd_ = -1;
  other.base_ = nullptr;
}

Channel::~Channel() {
  if (base_) munmap(base_, kTotalBytes);
  if (fd_ >= 0) close(fd_);
}

uint32_t Channel::PostRequest(uint64_t bytes) {
  ++posted_;
  header().request_bytes[posted_ % kSlots].store(bytes, std::memory_order_relaxed);
  Publish(header().request_seq, posted_, header().request_wanted);
  return posted_;
}

void Channel::PostReply(uint64_t bytes) {
  header().reply_bytes[taken_ % kSlots].store(bytes, std::memory_order_relaxed);
  Publish(header().reply_seq, taken_, header().reply_wanted);
}

absl::StatusOr<uint64_t> Channel::MessageLength(uint64_t bytes, uint64_t limit) {
  if (bytes > limit)
    return absl::DataLossError(absl::StrCat("executor channel: a message of ", bytes, " bytes exceeds ", limit));
  return bytes;
}

bool Channel::WaitChange(std::atomic<uint32_t>& word, uint32_t seen, absl::Duration timeout, int spins,
                         std::atomic<uint64_t>& wanted, uint32_t want) {
  for (int i = 0; i < spins; ++i) {
    if (word.load(std::memory_order_acquire) != seen) return true;
    Relax();
  }
  // Said before the last look (both sequentially consistent, as Publish's store and load
  // are), so that either this sees the new number or the poster sees this and wakes it.
  wanted.store(kSleeping | want, std::memory_order_seq_cst);
  if (word.load(std::memory_order_seq_cst) == seen) {
    const struct timespec ts = absl::ToTimespec(timeout);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
  wanted.store(0, std::memory_order_relaxed);
  return word.load(std::memory_order_acquire) != seen;
}

void Channel::Publish(std::atomic<uint32_t>& word, uint32_t seq, std::atomic<uint64_t>& wanted) {
  word.store(seq, std::memory_order_seq_cst);
  uint64_t w = wanted.load(std::memory_order_seq_cst);
  // The poster that wakes the sleeper also clears what it sleeps for, so that the posts
  // made before it has run (a replay posted behind another) make no wake-up call of their
  // own. A sleeper that changed it meanwhile is looked at again.
  while ((w & kSleeping) != 0 && static_cast<int32_t>(seq - static_cast<uint32_t>(w)) >= 0) {
    if (wanted.compare_exchange_weak(w, 0, std::memory_order_seq_cst)) {
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
      ++wake_calls_;
      return;
    }
  }
}

namespace {

// A one-byte message with room for one descriptor, as both ends of SendFd use it.
struct FdMessage {
  char byte = 0;
  struct iovec iov = {&byte, 1};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg = {};
  FdMessage() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

}  // namespace

absl::Status SendFd(int socket, int fd) {
  FdMessage m;
  struct cmsghdr* cmsg = CMSG_FIRSTHDR(&m.msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  // Never blocks: the daemon passes one descriptor at a time and waits for the command
  // that takes it, so a full socket means an executor that does not take them.
  if (sendmsg(socket, &m.msg, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) return Errno("sendmsg");
  return absl::OkStatus();
}

absl::StatusOr<int> ReceiveFd(int socket) {
  FdMessage m;
  if (recvmsg(socket, &m.msg, MSG_CMSG_CLOEXEC) != 1) return Errno("recvmsg");
  struct cmsghdr* cmsg = CMSG_FIRSTHDR(&m.msg);
  if (!cmsg || cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS || cmsg->cmsg_len != CMSG_LEN(sizeof(int)))
    return absl::InternalError("executor channel: a message without a descriptor");
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
  return fd;
}

}  // namespace replayd::executor

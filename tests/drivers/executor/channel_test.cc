// The executor channel between two threads of one process (the memfd mapped twice, as the
// two processes map it): a request and its reply with their bytes, a length past the
// message area refused, a wait that ends at its deadline or when told the other side is
// gone, and a channel passed as a descriptor over a socket.
#include "drivers/executor/channel.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/status_macros.h"

namespace replayd::executor {
namespace {

// The executor's end of `daemon`: the same memfd, mapped again.
absl::StatusOr<Channel> OtherEnd(const Channel& daemon) {
  const int fd = dup(daemon.fd());
  if (fd < 0) return absl::InternalError("dup");
  return Channel::Attach(fd);
}

// The daemon's side: posts `message` as the next request, and reads the text of a reply.
uint32_t PostText(Channel& daemon, const std::string& message) {
  std::memcpy(daemon.request_area(message.size()).data(), message.data(), message.size());
  return daemon.PostRequest(message.size());
}
absl::StatusOr<std::string> ReplyText(Channel& daemon, uint32_t seq) {
  absl::StatusOr<uint64_t> n = daemon.AwaitReply(seq, absl::Now() + absl::Seconds(10), [] { return false; });
  if (!n.ok()) return n.status();
  return std::string(reinterpret_cast<const char*>(daemon.reply_of(seq).data()), *n);
}

TEST(ChannelTest, ARequestAndItsReplyCarryTheirBytes) {
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  ASSERT_OK_AND_ASSIGN(Channel executor, OtherEnd(daemon));
  std::thread serving([&] {
    for (int i = 0; i < 100; ++i) {
      absl::StatusOr<uint64_t> n = executor.AwaitRequest([] { return false; });
      ASSERT_TRUE(n.ok()) << n.status();
      // Echo the message, doubled, and mark the data area.
      std::memcpy(executor.reply().data(), executor.request(*n).data(), *n);
      std::memcpy(executor.reply().data() + *n, executor.request(*n).data(), *n);
      executor.data()[0] = static_cast<uint8_t>(i);
      executor.PostReply(2 * *n);
    }
  });
  for (int i = 0; i < 100; ++i) {
    const std::string message = "request " + std::to_string(i);
    ASSERT_OK_AND_ASSIGN(std::string reply, ReplyText(daemon, PostText(daemon, message)));
    EXPECT_EQ(reply, message + message);
    EXPECT_EQ(daemon.data()[0], static_cast<uint8_t>(i));
  }
  serving.join();
}

// A second request posted while the first still runs is taken in order, without a
// wake-up of its own; each reply is in its own slot.
TEST(ChannelTest, RequestsInFlightAreTakenAndAnsweredInOrder) {
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  ASSERT_OK_AND_ASSIGN(Channel executor, OtherEnd(daemon));
  std::thread serving([&] {
    for (int i = 0; i < 200; ++i) {
      absl::StatusOr<uint64_t> n = executor.AwaitRequest([] { return false; });
      ASSERT_TRUE(n.ok()) << n.status();
      std::memcpy(executor.reply().data(), executor.request(*n).data(), *n);
      executor.PostReply(*n);
    }
  });
  std::vector<uint32_t> seqs;
  for (int i = 0; i < 200; ++i) {
    if (seqs.size() == Channel::kSlots) {
      // The oldest is read before its slot is posted again.
      ASSERT_OK_AND_ASSIGN(std::string reply, ReplyText(daemon, seqs.front()));
      EXPECT_EQ(reply, "request " + std::to_string(i - Channel::kSlots));
      seqs.erase(seqs.begin());
    }
    seqs.push_back(PostText(daemon, "request " + std::to_string(i)));
  }
  for (size_t k = 0; k < seqs.size(); ++k) {
    ASSERT_OK_AND_ASSIGN(std::string reply, ReplyText(daemon, seqs[k]));
    EXPECT_EQ(reply, "request " + std::to_string(200 - seqs.size() + k));
  }
  serving.join();
}

// The state letter of process `pid` ('S' sleeping, 'T' stopped, ...), or 0.
char StateOf(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ? 0 : line[paren + 2];
}

// Requests posted while the executor sleeps wake it once: the first clears what it sleeps
// for, and the ones posted before it has run make no wake-up call. The executor end is a
// child process, asleep and then stopped while the daemon posts, so that it cannot run
// between the posts on another core.
TEST(ChannelTest, RequestsPostedToASleepingExecutorWakeItOnce) {
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<Channel> executor = OtherEnd(daemon);
    if (!executor.ok()) _exit(2);
    for (int i = 0; i < 3; ++i) {
      if (!executor->AwaitRequest([] { return false; }).ok()) _exit(3);
      executor->PostReply(0);
    }
    _exit(0);
  }
  // Asleep on its futex for request 1 (past any spin), then stopped there.
  for (int i = 0; i < 1000 && StateOf(child) != 'S'; ++i) absl::SleepFor(absl::Milliseconds(10));
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_EQ(StateOf(child), 'S');
  ASSERT_EQ(kill(child, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  uint32_t last = 0;
  for (int i = 0; i < 3; ++i) last = PostText(daemon, "launch " + std::to_string(i));
  EXPECT_EQ(daemon.wake_calls(), 1u);
  ASSERT_EQ(kill(child, SIGCONT), 0);
  ASSERT_OK(daemon.AwaitReply(last, absl::Now() + absl::Seconds(10), [] { return false; }).status());
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// A request longer than a slot's area travels in the data area, whole.
TEST(ChannelTest, ARequestLongerThanItsSlotTravelsInTheDataArea) {
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  ASSERT_OK_AND_ASSIGN(Channel executor, OtherEnd(daemon));
  std::string message(Channel::kSlotBytes + 1000, '\0');
  for (size_t i = 0; i < message.size(); ++i) message[i] = static_cast<char>(i * 7);
  PostText(daemon, "short");
  PostText(daemon, message);
  ASSERT_OK_AND_ASSIGN(uint64_t n, executor.AwaitRequest([] { return false; }));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(executor.request(n).data()), n), "short");
  ASSERT_OK_AND_ASSIGN(n, executor.AwaitRequest([] { return false; }));
  ASSERT_EQ(n, message.size());
  EXPECT_EQ(executor.request(n).data(), executor.data().data());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(executor.request(n).data()), n), message);
}

TEST(ChannelTest, ALengthPastTheMessageAreaIsRefused) {
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  ASSERT_OK_AND_ASSIGN(Channel executor, OtherEnd(daemon));
  const uint32_t seq = daemon.PostRequest(Channel::kMessageBytes + 1);
  absl::StatusOr<uint64_t> n = executor.AwaitRequest([] { return false; });
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDataLoss) << n.status();
  executor.PostReply(Channel::kSlotBytes + 1);
  n = daemon.AwaitReply(seq, absl::Now() + absl::Seconds(10), [] { return false; });
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDataLoss) << n.status();
}

TEST(ChannelTest, AWaitEndsAtItsDeadlineOrWhenTheOtherSideIsGone) {
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  const uint32_t seq = daemon.PostRequest(0);
  absl::StatusOr<uint64_t> n = daemon.AwaitReply(seq, absl::Now() + absl::Milliseconds(50), [] { return false; });
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDeadlineExceeded) << n.status();
  int asked = 0;
  n = daemon.AwaitReply(seq, absl::Now() + absl::Seconds(30), [&] { return ++asked == 2; });
  EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable) << n.status();
  EXPECT_EQ(asked, 2);
}

// A daemon and an executor of different builds refuse each other's channel rather than
// misread it: one of another size, or marked with another layout or protocol.
TEST(ChannelTest, AChannelOfAnotherBuildIsRefused) {
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  struct stat st;
  ASSERT_EQ(fstat(daemon.fd(), &st), 0);
  auto attach_copy = [&](off_t size, uint64_t version) {
    const int fd = static_cast<int>(syscall(SYS_memfd_create, "other-build", MFD_CLOEXEC));
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, size), 0);
    EXPECT_EQ(pwrite(fd, &version, sizeof version, 0), static_cast<ssize_t>(sizeof version));
    return Channel::Attach(fd);
  };
  uint64_t ours = 0;
  ASSERT_EQ(pread(daemon.fd(), &ours, sizeof ours, 0), static_cast<ssize_t>(sizeof ours));
  absl::StatusOr<Channel> larger = attach_copy(st.st_size + 4096, ours);
  EXPECT_EQ(larger.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(larger.status().message().find("must come from one build"), std::string::npos) << larger.status();
  EXPECT_EQ(attach_copy(st.st_size, ours + (uint64_t{1} << 48)).status().code(), absl::StatusCode::kFailedPrecondition)
      << "another protocol";
  EXPECT_EQ(attach_copy(st.st_size, 0).status().code(), absl::StatusCode::kFailedPrecondition) << "no mark";
  EXPECT_TRUE(attach_copy(st.st_size, ours).ok());
}

TEST(ChannelTest, AChannelPassedOverASocketIsTheSameChannel) {
  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets), 0);
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  ASSERT_TRUE(SendFd(sockets[0], daemon.fd()).ok());
  ASSERT_OK_AND_ASSIGN(int fd, ReceiveFd(sockets[1]));
  EXPECT_NE(fd, daemon.fd());
  ASSERT_OK_AND_ASSIGN(Channel executor, Channel::Attach(fd));
  daemon.data()[7] = 42;
  EXPECT_EQ(executor.data()[7], 42);
  // A message without a descriptor is refused.
  char byte = 0;
  ASSERT_EQ(send(sockets[0], &byte, 1, 0), 1);
  EXPECT_FALSE(ReceiveFd(sockets[1]).ok());
  close(sockets[0]);
  close(sockets[1]);
}

// A receiver that takes no descriptors cannot hold the sender up: once the socket is full,
// SendFd fails at once.
TEST(ChannelTest, SendingToAReceiverThatTakesNothingFailsRatherThanWaits) {
  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets), 0);
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  absl::Status sent = absl::OkStatus();
  int n = 0;
  const absl::Time start = absl::Now();
  while (sent.ok() && n < 100000) {
    sent = SendFd(sockets[0], daemon.fd());
    ++n;
  }
  EXPECT_FALSE(sent.ok()) << "after " << n << " descriptors";
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  close(sockets[0]);
  close(sockets[1]);
}

}  // namespace
}  // namespace replayd::executor

// The executor channel between two threads of one process (the memfd mapped twice, as the
// two processes map it): a request and its reply with their bytes, a length past the
// message area refused, a wait that ends at its deadline or when told the other side is
// gone, and a channel passed as a descriptor over a socket.
#include "drivers/executor/channel.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "tests/support/status_macros.h"

namespace replayd::executor {
namespace {

// The executor's end of `daemon`: the same memfd, mapped again.
absl::StatusOr<Channel> OtherEnd(const Channel& daemon) {
  const int fd = dup(daemon.fd());
  if (fd < 0) return absl::InternalError("dup");
  return Channel::Attach(fd);
}

TEST(ChannelTest, ARequestAndItsReplyCarryTheirBytes) {
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  ASSERT_OK_AND_ASSIGN(Channel executor, OtherEnd(daemon));
  std::thread serving([&] {
    for (int i = 0; i < 100; ++i) {
      absl::StatusOr<uint64_t> n = executor.AwaitRequest([] { return false; });
      ASSERT_TRUE(n.ok()) << n.status();
      // Echo the message, doubled, and mark the data area.
      std::memcpy(executor.reply().data(), executor.request().data(), *n);
      std::memcpy(executor.reply().data() + *n, executor.request().data(), *n);
      executor.data()[0] = static_cast<uint8_t>(i);
      executor.PostReply(2 * *n);
    }
  });
  for (int i = 0; i < 100; ++i) {
    const std::string message = "request " + std::to_string(i);
    std::memcpy(daemon.request().data(), message.data(), message.size());
    daemon.PostRequest(message.size());
    absl::StatusOr<uint64_t> n = daemon.AwaitReply(absl::Now() + absl::Seconds(10), [] { return false; });
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(daemon.reply().data()), *n), message + message);
    EXPECT_EQ(daemon.data()[0], static_cast<uint8_t>(i));
  }
  serving.join();
}

TEST(ChannelTest, ALengthPastTheMessageAreaIsRefused) {
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  ASSERT_OK_AND_ASSIGN(Channel executor, OtherEnd(daemon));
  daemon.PostRequest(Channel::kMessageBytes + 1);
  absl::StatusOr<uint64_t> n = executor.AwaitRequest([] { return false; });
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDataLoss) << n.status();
  executor.PostReply(uint64_t{1} << 40);
  n = daemon.AwaitReply(absl::Now() + absl::Seconds(10), [] { return false; });
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDataLoss) << n.status();
}

TEST(ChannelTest, AWaitEndsAtItsDeadlineOrWhenTheOtherSideIsGone) {
  ASSERT_OK_AND_ASSIGN(Channel daemon, Channel::Create());
  daemon.PostRequest(0);
  absl::StatusOr<uint64_t> n = daemon.AwaitReply(absl::Now() + absl::Milliseconds(50), [] { return false; });
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDeadlineExceeded) << n.status();
  int asked = 0;
  n = daemon.AwaitReply(absl::Now() + absl::Seconds(30), [&] { return ++asked == 2; });
  EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable) << n.status();
  EXPECT_EQ(asked, 2);
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

}  // namespace
}  // namespace replayd::executor

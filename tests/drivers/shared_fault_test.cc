#include "drivers/shared_fault.h"

#include <gmock/gmock.h>

namespace replayd {
namespace {

using ::testing::HasSubstr;

TEST(SharedFaultTest, AFaultRefusesNewSessionsUntilTheLastOneLeaves) {
  SharedFault shared;
  int resets = 0;
  auto reset = [&] { ++resets; };
  ASSERT_TRUE(shared.Join().ok());
  ASSERT_TRUE(shared.Join().ok());
  EXPECT_EQ(shared.sessions(), 2);
  absl::Status first = shared.Fail(absl::FailedPreconditionError("cuda:0: a kernel fault lost the context"));
  EXPECT_EQ(first.code(), absl::StatusCode::kFailedPrecondition);
  // The first fault is the one every session sees.
  EXPECT_EQ(shared.Fail(absl::FailedPreconditionError("a later one")).message(), first.message());
  absl::Status refused = shared.Join();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("kernel fault"));
  shared.Leave(reset);
  EXPECT_EQ(resets, 0) << "a session still holds the faulted context";
  EXPECT_FALSE(shared.fault().ok());
  shared.Leave(reset);
  EXPECT_EQ(resets, 1);
  EXPECT_TRUE(shared.fault().ok());
  EXPECT_TRUE(shared.Join().ok()) << "the reset context serves again";
}

TEST(SharedFaultTest, WithoutAFaultLeavingResetsNothing) {
  SharedFault shared;
  int resets = 0;
  ASSERT_TRUE(shared.Join().ok());
  shared.Leave([&] { ++resets; });
  EXPECT_EQ(resets, 0);
  EXPECT_EQ(shared.sessions(), 0);
}

}  // namespace
}  // namespace replayd

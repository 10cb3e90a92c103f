#include "drivers/device_memory.h"

#include <gmock/gmock.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace replayd {
namespace {

using ::testing::HasSubstr;

TEST(DeviceMemoryTest, ReservesUpToTheTotalAndNoMore) {
  DeviceMemory memory(1000);
  EXPECT_TRUE(memory.Reserve("gpu:0", 600).ok());
  absl::Status over = memory.Reserve("gpu:0", 401);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.message()),
              HasSubstr("gpu:0: allocation of 401 bytes exceeds free memory (400 of 1000"));
  EXPECT_EQ(memory.in_use(), 600u);  // a refused reservation holds nothing
  EXPECT_TRUE(memory.Reserve("gpu:0", 400).ok());
  memory.Release(1000);
  EXPECT_EQ(memory.in_use(), 0u);
}

TEST(DeviceMemoryTest, ZeroAndHugeRequestsAreRefused) {
  DeviceMemory memory(1000);
  EXPECT_EQ(memory.Reserve("d", 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(memory.Reserve("d", UINT64_MAX).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(memory.Reserve("d", 1).ok());
  EXPECT_EQ(memory.Reserve("d", UINT64_MAX).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(memory.in_use(), 1u);
}

// A reservation that does not fit asks the reclaimer for exactly what is missing, and
// fits once it gave that back; one it cannot make room for is refused with nothing held.
TEST(DeviceMemoryTest, AReservationShortOfRoomAsksTheReclaimerForWhatIsMissing) {
  DeviceMemory memory(1000);
  ASSERT_TRUE(memory.Reserve("d", 700).ok());  // 300 of them are an idle holder's
  uint64_t idle = 300;
  std::vector<uint64_t> asked;
  memory.set_reclaimer([&](uint64_t wanted) {
    asked.push_back(wanted);
    if (wanted > idle) return false;
    memory.Release(idle);
    idle = 0;
    return true;
  });
  EXPECT_TRUE(memory.Reserve("d", 200).ok()) << "fits without asking";
  EXPECT_TRUE(asked.empty());
  absl::Status refused = memory.Reserve("d", 500);  // 100 free, 300 to give: short by 100
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(asked, ::testing::ElementsAre(400u));
  EXPECT_EQ(memory.in_use(), 900u) << "nothing held, nothing given back";
  EXPECT_TRUE(memory.Reserve("d", 350).ok()) << refused;
  EXPECT_THAT(asked, ::testing::ElementsAre(400u, 250u));
  EXPECT_EQ(memory.in_use(), 950u);
  EXPECT_EQ(memory.ReserveWithoutReclaim("d", 51).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(asked.size(), 2u) << "ReserveWithoutReclaim asks nobody";
  EXPECT_EQ(memory.Reserve("d", 2000).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(asked.size(), 2u) << "more than the device has is not asked for";
  memory.set_reclaimer(nullptr);
  EXPECT_EQ(memory.Reserve("d", 51).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(asked.size(), 2u);
}

// Clearing the reclaimer waits for a call of it that is running: its owner may go once
// set_reclaimer(nullptr) has returned.
TEST(DeviceMemoryTest, ClearingTheReclaimerWaitsForItsRunningCall) {
  DeviceMemory memory(1000);
  ASSERT_TRUE(memory.Reserve("d", 1000).ok());
  std::atomic<bool> called{false}, finished{false};
  absl::Notification go_on;
  memory.set_reclaimer([&](uint64_t) {
    called = true;
    go_on.WaitForNotification();
    finished = true;
    return false;
  });
  std::thread reserving([&] { EXPECT_EQ(memory.Reserve("d", 1).code(), absl::StatusCode::kResourceExhausted); });
  while (!called) absl::SleepFor(absl::Milliseconds(1));
  std::thread clearing([&] {
    memory.set_reclaimer(nullptr);
    EXPECT_TRUE(finished) << "the reclaimer was cleared while it ran";
  });
  absl::SleepFor(absl::Milliseconds(50));  // time for a clear that does not wait to return
  go_on.Notify();
  clearing.join();
  reserving.join();
}

TEST(DeviceMemoryTest, ConcurrentReservationsNeverExceedTheTotal) {
  DeviceMemory memory(1000);
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i)
        if (memory.Reserve("d", 3).ok()) granted.fetch_add(1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(granted.load(), 333);
  EXPECT_EQ(memory.in_use(), 999u);
}

}  // namespace
}  // namespace replayd

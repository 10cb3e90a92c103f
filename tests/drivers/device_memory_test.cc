#include "drivers/device_memory.h"

#include <gmock/gmock.h>

#include <thread>
#include <vector>

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

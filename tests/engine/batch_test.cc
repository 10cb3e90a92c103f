#include <gtest/gtest.h>

#include "engine/graph_instance.h"

namespace replayd {
namespace {

std::vector<std::pair<size_t, size_t>> Cut(size_t calls, size_t limit = 32) {
  std::vector<char> batchable(calls, 1);
  return CutBatches(batchable, {limit});
}

TEST(CutBatchesTest, LimitDoublesAfterEachBatch) {
  EXPECT_EQ(Cut(1).size(), 1u);
  EXPECT_EQ(Cut(31).size(), 1u);
  EXPECT_EQ(Cut(32).size(), 1u);
  auto b33 = Cut(33);
  ASSERT_EQ(b33.size(), 2u);
  EXPECT_EQ(b33[0], (std::pair<size_t, size_t>{0, 32}));
  EXPECT_EQ(b33[1], (std::pair<size_t, size_t>{32, 33}));
  auto b100 = Cut(100);
  ASSERT_EQ(b100.size(), 3u);  // 32 + 64 + 4
  EXPECT_EQ(b100[1], (std::pair<size_t, size_t>{32, 96}));
  EXPECT_EQ(b100[2], (std::pair<size_t, size_t>{96, 100}));
  EXPECT_EQ(Cut(0).size(), 0u);
}

TEST(CutBatchesTest, CallsTheDeviceCannotBatchStandAlone) {
  std::vector<char> batchable = {1, 1, 0, 1, 1, 1};
  auto b = CutBatches(batchable, {32});
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], (std::pair<size_t, size_t>{0, 2}));
  EXPECT_EQ(b[1], (std::pair<size_t, size_t>{2, 3}));
  EXPECT_EQ(b[2], (std::pair<size_t, size_t>{3, 6}));
}

TEST(CutBatchesTest, CoversEveryCallOnceInOrder) {
  for (size_t calls = 0; calls < 300; calls += 7) {
    for (size_t limit : {1, 3, 32}) {
      auto batches = Cut(calls, limit);
      size_t next = 0;
      for (auto [b, e] : batches) {
        ASSERT_EQ(b, next);
        ASSERT_GT(e, b);
        next = e;
      }
      ASSERT_EQ(next, calls);
    }
  }
}

}  // namespace
}  // namespace replayd

#include "engine/memory_plan.h"

#include <gtest/gtest.h>

#include <random>

namespace replayd {
namespace {

uint64_t Aligned(uint64_t b) { return (b + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

// Checks the plan's invariants: aligned offsets, inside the arena, and no two buffers
// alive at the same time sharing a byte.
void CheckPlan(const std::vector<Lifetime>& buffers, const MemoryPlan& plan) {
  ASSERT_EQ(plan.offsets.size(), buffers.size());
  uint64_t total = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    total += Aligned(buffers[i].bytes);
    ASSERT_EQ(plan.offsets[i] % kArenaAlignment, 0u);
    ASSERT_LE(plan.offsets[i] + buffers[i].bytes, plan.arena_bytes);
    for (size_t j = 0; j < i; ++j) {
      bool alive_together = buffers[i].first_use <= buffers[j].last_use &&
                            buffers[j].first_use <= buffers[i].last_use;
      if (!alive_together) continue;
      bool disjoint = plan.offsets[i] + buffers[i].bytes <= plan.offsets[j] ||
                      plan.offsets[j] + buffers[j].bytes <= plan.offsets[i];
      ASSERT_TRUE(disjoint) << "buffers " << i << " and " << j << " overlap";
    }
  }
  EXPECT_EQ(plan.saved_bytes, total - plan.arena_bytes);
}

TEST(MemoryPlanTest, EmptyPlanNeedsNoArena) {
  MemoryPlan plan = PlanMemory({});
  EXPECT_EQ(plan.arena_bytes, 0u);
  EXPECT_EQ(plan.saved_bytes, 0u);
}

TEST(MemoryPlanTest, BuffersAliveAtOnceGetSeparateBytes) {
  std::vector<Lifetime> b = {{1000, 0, 5}, {1000, 2, 3}};
  MemoryPlan plan = PlanMemory(b);
  CheckPlan(b, plan);
  EXPECT_EQ(plan.arena_bytes, 2 * Aligned(1000));
}

TEST(MemoryPlanTest, BuffersWithDisjointLifetimesShareBytes) {
  // A chain a -> b -> c -> d where each temporary dies after its consumer.
  std::vector<Lifetime> b = {{4096, 0, 1}, {4096, 1, 2}, {4096, 2, 3}, {4096, 3, 4}};
  MemoryPlan plan = PlanMemory(b);
  CheckPlan(b, plan);
  EXPECT_EQ(plan.arena_bytes, 2 * 4096u);
  EXPECT_EQ(plan.saved_bytes, 2 * 4096u);
}

TEST(MemoryPlanTest, ThousandsOfRandomGraphsKeepTheInvariants) {
  std::mt19937_64 rng(7);
  for (int graph = 0; graph < 3000; ++graph) {
    size_t calls = 1 + rng() % 64;
    size_t n = rng() % 40;
    std::vector<Lifetime> buffers;
    for (size_t i = 0; i < n; ++i) {
      size_t first = rng() % calls;
      size_t last = first + rng() % (calls - first);
      uint64_t bytes = 1 + rng() % (rng() % 2 ? 300 : 100000);
      buffers.push_back({bytes, first, last});
    }
    MemoryPlan plan = PlanMemory(buffers);
    CheckPlan(buffers, plan);
    if (HasFatalFailure()) return;
    // Never worse than giving every buffer its own bytes.
    uint64_t total = 0;
    for (auto& b : buffers) total += Aligned(b.bytes);
    ASSERT_LE(plan.arena_bytes, total);
  }
}

}  // namespace
}  // namespace replayd

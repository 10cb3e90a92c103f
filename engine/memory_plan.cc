#include "engine/memory_plan.h"

#include <algorithm>
#include <numeric>

namespace replayd {

MemoryPlan PlanMemory(std::span<const Lifetime> buffers, uint64_t alignment) {
  auto aligned = [alignment](uint64_t b) { return (b + alignment - 1) / alignment * alignment; };
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return buffers[a].bytes > buffers[b].bytes;
  });
  std::vector<size_t> placed;
  uint64_t total = 0;
  for (size_t i : order) {
    const Lifetime& b = buffers[i];
    uint64_t size = aligned(b.bytes);
    total += size;
    // Byte ranges taken by placed buffers that are alive at the same time, by offset.
    std::vector<std::pair<uint64_t, uint64_t>> taken;
    for (size_t j : placed) {
      const Lifetime& o = buffers[j];
      if (o.first_use <= b.last_use && b.first_use <= o.last_use)
        taken.push_back({plan.offsets[j], plan.offsets[j] + aligned(o.bytes)});
    }
    std::sort(taken.begin(), taken.end());
    uint64_t offset = 0;
    for (auto [lo, hi] : taken) {
      if (offset + size <= lo) break;
      offset = std::max(offset, hi);
    }
    plan.offsets[i] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
    placed.push_back(i);
  }
  plan.saved_bytes = total - plan.arena_bytes;
  return plan;
}

}  // namespace replayd

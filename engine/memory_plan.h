// The memory plan: each internal buffer of a graph gets an offset in one arena so that
// buffers whose lifetimes (first to last use, in call order) overlap never share bytes.
#ifndef REPLAYD_ENGINE_MEMORY_PLAN_H_
#define REPLAYD_ENGINE_MEMORY_PLAN_H_

#include <cstdint>
#include <span>
#include <vector>

namespace replayd {

inline constexpr uint64_t kArenaAlignment = 256;

struct Lifetime {
  uint64_t bytes = 0;
  size_t first_use = 0;  // index of the first call that uses the buffer
  size_t last_use = 0;   // index of the last call that uses it (>= first_use)
};

struct MemoryPlan {
  std::vector<uint64_t> offsets;  // per lifetime, a multiple of the alignment
  uint64_t arena_bytes = 0;       // bytes the arena needs
  uint64_t saved_bytes = 0;       // aligned sizes summed, less arena_bytes
};

// Places each buffer at the lowest aligned offset that overlaps no buffer already placed
// whose lifetime overlaps its own, taking the largest buffers first.
MemoryPlan PlanMemory(std::span<const Lifetime> buffers, uint64_t alignment = kArenaAlignment);

}  // namespace replayd

#endif  // REPLAYD_ENGINE_MEMORY_PLAN_H_

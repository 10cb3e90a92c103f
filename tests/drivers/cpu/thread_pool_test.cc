#include "drivers/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace replayd {
namespace {

TEST(ThreadPoolTest, RunsEveryIndexExactlyOnce) {
  ThreadPool pool(3);
  for (uint64_t n : {0ull, 1ull, 2ull, 7ull, 1000ull}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](uint64_t i) { hits[i]++; });
    for (uint64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i], 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPoolTest, WorksWithoutWorkers) {
  ThreadPool pool(0);
  std::atomic<uint64_t> sum{0};
  pool.ParallelFor(100, [&](uint64_t i) { sum += i; });
  EXPECT_EQ(sum, 4950u);
}

// Each invocation stays until a second thread is inside too, so a pool that runs its
// worker is seen to however late the worker wakes (a sanitized build on a loaded machine
// took over 150 ms); one that never does fails after the deadline.
TEST(ThreadPoolTest, UsesWorkerThreads) {
  ThreadPool pool(2);
  std::atomic<int> inside{0}, peak{0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  pool.ParallelFor(3, [&](uint64_t) {
    int now = ++inside;
    int p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
    while (peak.load() < 2 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    --inside;
  });
  EXPECT_GE(peak, 2);
}

TEST(ThreadPoolTest, ConcurrentLoopsFromManyCallersAllComplete) {
  ThreadPool pool(2);
  std::vector<std::thread> callers;
  std::atomic<uint64_t> total{0};
  for (int c = 0; c < 8; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        std::atomic<uint64_t> local{0};
        pool.ParallelFor(64, [&](uint64_t i) { local += i + 1; });
        EXPECT_EQ(local, 64u * 65 / 2);
        total += local;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total, 8u * 50 * (64u * 65 / 2));
}

}  // namespace
}  // namespace replayd

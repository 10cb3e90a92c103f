// A fixed pool of worker threads that runs parallel loops. The calling thread takes
// part in its own loop, so a loop always makes progress even when every worker is busy
// with another caller's loop, and a loop of one index never leaves the caller.
//
// Thread safety: ParallelFor may be called from many threads at once.
#ifndef REPLAYD_DRIVERS_CPU_THREAD_POOL_H_
#define REPLAYD_DRIVERS_CPU_THREAD_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace replayd {

class ThreadPool {
 public:
  // `workers` threads besides the callers; 0 runs every loop on its caller.
  explicit ThreadPool(int workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Calls fn(i) once for every i in [0, n) and returns when all calls have returned.
  void ParallelFor(uint64_t n, const std::function<void(uint64_t)>& fn);

  int workers() const { return static_cast<int>(threads_.size()); }

 private:
  struct Loop;
  void WorkerMain();

  absl::Mutex mu_;
  std::deque<std::shared_ptr<Loop>> loops_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CPU_THREAD_POOL_H_

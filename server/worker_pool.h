// Threads for work that may block for long: a Session stream's operations when they cannot
// run on the thread that received them (see dispatch.h). Run hands the work to an
// idle worker or starts a new one, so one blocked task never delays another; a worker
// left idle for `idle_exit` ends, so a burst of streams does not keep its threads. At
// most `max_threads` run: past that (or when the system refuses a thread) Run refuses the
// task, so clients cannot make the daemon start threads without bound.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_SERVER_WORKER_POOL_H_
#define REPLAYD_SERVER_WORKER_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace replayd {

class WorkerPool {
 public:
  explicit WorkerPool(size_t max_threads = 1024, absl::Duration idle_exit = absl::Seconds(10))
      : max_threads_(max_threads), idle_exit_(idle_exit) {}
  // Waits for the tasks given and joins every worker.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs `task` on a worker soon, never on the calling thread. False, and `task` is
  // dropped unrun, when `max_threads` workers are all busy or a thread cannot be started.
  [[nodiscard]] bool Run(std::function<void()> task);

 private:
  void WorkerMain();
  void JoinEnded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_threads_;
  const absl::Duration idle_exit_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  // Workers that have ended, to be joined by the next Run or the destructor.
  std::vector<std::thread::id> ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_WORKER_POOL_H_

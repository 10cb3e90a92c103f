#include "drivers/cpu/thread_pool.h"

#include <atomic>

namespace replayd {

struct ThreadPool::Loop {
  Loop(uint64_t n, const std::function<void(uint64_t)>& fn) : n(n), fn(fn) {}
  const uint64_t n;
  const std::function<void(uint64_t)>& fn;
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> done{0};
  absl::Mutex mu;
  bool finished ABSL_GUARDED_BY(mu) = false;

  // Runs indices until none are left; true when this call finished the last one.
  bool Drain() {
    uint64_t ran = 0;
    for (uint64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      fn(i);
      ++ran;
    }
    if (ran == 0) return false;
    return done.fetch_add(ran) + ran == n;
  }
  void MarkFinished() {
    absl::MutexLock lock(&mu);
    finished = true;
  }
  bool Exhausted() const { return next.load() >= n; }
};

ThreadPool::ThreadPool(int workers) {
  threads_.reserve(workers);
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { WorkerMain(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) t.join();
}

void ThreadPool::ParallelFor(uint64_t n, const std::function<void(uint64_t)>& fn) {
  if (n == 0) return;
  if (n == 1 || threads_.empty()) {
    for (uint64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto loop = std::make_shared<Loop>(n, fn);
  {
    absl::MutexLock lock(&mu_);
    loops_.push_back(loop);
  }
  if (loop->Drain()) loop->MarkFinished();
  {
    absl::MutexLock lock(&mu_);
    for (auto it = loops_.begin(); it != loops_.end(); ++it) {
      if (*it == loop) {
        loops_.erase(it);
        break;
      }
    }
  }
  absl::MutexLock lock(&loop->mu);
  loop->mu.Await(absl::Condition(&loop->finished));
}

void ThreadPool::WorkerMain() {
  for (;;) {
    std::shared_ptr<Loop> loop;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_) return true;
        for (auto& l : loops_)
          if (!l->Exhausted()) return true;
        return false;
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      for (auto& l : loops_) {
        if (!l->Exhausted()) {
          loop = l;
          break;
        }
      }
    }
    if (loop && loop->Drain()) loop->MarkFinished();
  }
}

}  // namespace replayd

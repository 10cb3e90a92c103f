#include "server/worker_pool.h"

#include <algorithm>
#include <system_error>

namespace replayd {

WorkerPool::~WorkerPool() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

bool WorkerPool::Run(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  JoinEnded();
  // Each idle worker takes one task; a task with no idle worker left for it starts one.
  if (static_cast<size_t>(idle_) <= tasks_.size()) {
    if (threads_.size() >= max_threads_) return false;
    try {
      threads_.emplace_back([this] { WorkerMain(); });
    } catch (const std::system_error&) {
      return false;
    }
  }
  tasks_.push_back(std::move(task));
  return true;
}

void WorkerPool::WorkerMain() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
    ++idle_;
    const bool woken = mu_.AwaitWithTimeout(absl::Condition(&ready), idle_exit_);
    --idle_;
    if (tasks_.empty()) {
      // Stopping, or idle for long enough: end, unless a task came after all.
      if (stopping_ || !woken) break;
      continue;
    }
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    mu_.Unlock();
    task();
    task = nullptr;
    mu_.Lock();
  }
  if (!stopping_) ended_.push_back(std::this_thread::get_id());
}

void WorkerPool::JoinEnded() {
  for (std::thread::id id : ended_) {
    auto it = std::find_if(threads_.begin(), threads_.end(), [id](const std::thread& t) { return t.get_id() == id; });
    it->join();
    threads_.erase(it);
  }
  ended_.clear();
}

}  // namespace replayd

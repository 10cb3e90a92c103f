#include "server/dispatch.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/scheduler.h"

namespace replayd {

Dispatcher::Dispatcher(int inline_slots, size_t workers, size_t workers_per_tenant)
    : workers_(workers), workers_per_tenant_(workers_per_tenant), inline_free_(inline_slots), pool_(workers) {}

Dispatcher::~Dispatcher() {
  StopStandby();
  JoinStandby();
}

bool Dispatcher::Quiet() {
  return running_.load(std::memory_order_acquire) == 0 &&
         SteadyNowNs() - last_handoff_ns_.load(std::memory_order_relaxed) > kBusyNs;
}

bool Dispatcher::TakeInlineSlot() {
  int free = inline_free_.load(std::memory_order_relaxed);
  do {
    if (free == 0) return false;
  } while (!inline_free_.compare_exchange_weak(free, free - 1, std::memory_order_acquire));
  const int64_t now = SteadyNowNs();
  last_inline_ns_.store(now, std::memory_order_relaxed);
  if (free == 1) saturated_since_ns_.store(now, std::memory_order_release);
  if (standby_asleep_.load(std::memory_order_relaxed)) {
    absl::MutexLock lock(&mu_);
    standby_asleep_.store(false, std::memory_order_relaxed);
  }
  return true;
}

void Dispatcher::ReleaseInlineSlot() {
  // Cleared first: a thread that takes the slot next sets it again.
  saturated_since_ns_.store(0, std::memory_order_release);
  inline_free_.fetch_add(1, std::memory_order_release);
}

absl::Status Dispatcher::HandOff(const std::string& tenant, Task task) {
  last_handoff_ns_.store(SteadyNowNs(), std::memory_order_relaxed);
  {
    absl::MutexLock lock(&workers_mu_);
    size_t& held = tenant_workers_[tenant];
    if (held >= workers_per_tenant_) {
      return absl::ResourceExhaustedError(absl::StrCat("no worker for it: tenant ", tenant, " has ", held,
                                                       " operations on workers, its most "
                                                       "(--stream_workers_per_tenant); try again"));
    }
    ++held;
  }
  // The count is given back when the task says it is done, or after it: the task may
  // end the call, so nothing of it is used then. The dispatcher outlives its workers
  // (pool_ is destroyed first).
  if (pool_.Run([this, tenant, task = std::move(task)] {
        bool released = false;
        const std::function<void()> done = [&] {
          if (released) return;
          released = true;
          ReleaseWorker(tenant);
        };
        task(done);
        done();
      }))
    return absl::OkStatus();
  ReleaseWorker(tenant);
  return absl::ResourceExhaustedError(absl::StrCat("no worker free to run it: the daemon runs at most ", workers_,
                                                   " operations at once on workers (--stream_workers); try again"));
}

void Dispatcher::ReleaseWorker(const std::string& tenant) {
  absl::MutexLock lock(&workers_mu_);
  auto it = tenant_workers_.find(tenant);
  if (--it->second == 0) tenant_workers_.erase(it);
}

void Dispatcher::StartStandby(std::function<bool(absl::Time deadline)> poll) {
  standby_ = std::thread([this, poll = std::move(poll)] { Standby(poll); });
}

void Dispatcher::StopStandby() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void Dispatcher::JoinStandby() {
  if (standby_.joinable()) standby_.join();
}

void Dispatcher::Standby(const std::function<bool(absl::Time)>& poll) {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (SteadyNowNs() - last_inline_ns_.load(std::memory_order_relaxed) > kIdleNs) {
      // Nothing has run inline for a while: sleep until something does.
      standby_asleep_.store(true, std::memory_order_relaxed);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !standby_asleep_.load(std::memory_order_relaxed);
      };
      mu_.Await(absl::Condition(&woken));
      continue;
    }
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), kStall);
    const int64_t since = saturated_since_ns_.load(std::memory_order_acquire);
    if (stopping_ || since == 0 || SteadyNowNs() - since < absl::ToInt64Nanoseconds(kStall)) continue;
    // Every polling thread has been running an operation for kStall: poll in their place
    // until one is free. What arrives now finds no inline slot and goes to a worker.
    mu_.Unlock();
    while (inline_free_.load(std::memory_order_acquire) == 0) {
      if (!poll(absl::Now() + kStall)) break;
    }
    mu_.Lock();
  }
}

}  // namespace replayd
